"""Scrape targets from Kubernetes: exporter pods found by label selector on the API server.

Each ``[[collector.kubernetes.exporters]]`` entry lists pods (``/api/v1/pods``) or
EndpointSlices (``/apis/discovery.k8s.io/v1/endpointslices``) by label selector, in one
namespace or all, every ``refresh_seconds``.  A ready pod becomes a dcgm or dme target at
its pod IP and port (a named container port or a number), labelled ``host`` = the node it
runs on (``spec.nodeName``, the EndpointSlice's ``nodeName``): never the pod's name, which
changes at every restart of a DaemonSet pod, while its GPUs do not move (docs/kubernetes.md).

In a pod it reads the API server's address from ``KUBERNETES_SERVICE_HOST``/``_PORT`` and
authenticates with the service account's token (re-read at every refresh: bound tokens
rotate) and CA.  An API error keeps the last target list and says why in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from hbmwatch import log
from hbmwatch.collector.targets import Target, resolve
from hbmwatch.settings import (
    CollectorSettings,
    KubernetesExporterSettings,
    KubernetesSettings,
    TargetSettings,
)
from hbmwatch.validation import ConfigError

logger = log.get("hbmwatch.collector")

SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
#: Items per list request; the rest follow by ``continue`` token, as kubectl pages.
PAGE_LIMIT = 500


class DiscoveryError(Exception):
    """A list request that failed: one line saying which and why."""


def api_base(settings: KubernetesSettings) -> str:
    """The API server's URL: the setting, else the in-cluster service's address."""
    if settings.api_url:
        return settings.api_url.rstrip("/")
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    if not host:
        raise ConfigError(
            "collector.kubernetes: not in a pod (KUBERNETES_SERVICE_HOST is unset) and no "
            "api_url set",
            field="collector.kubernetes.api_url",
        )
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def tls_verify(settings: KubernetesSettings) -> ssl.SSLContext | bool:
    """The CA to trust: the setting, else the service account's, else the system's."""
    if settings.insecure_skip_tls_verify:
        return False
    ca = settings.ca_file or (SERVICE_ACCOUNT_CA if Path(SERVICE_ACCOUNT_CA).is_file() else None)
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"collector.kubernetes.ca_file {ca}: {exc}", field="collector.kubernetes.ca_file"
        ) from None


def list_path(exporter: KubernetesExporterSettings) -> str:
    """The collection's path, namespaced or cluster-wide."""
    group = "/api/v1" if exporter.role == "pod" else "/apis/discovery.k8s.io/v1"
    resource = "pods" if exporter.role == "pod" else "endpointslices"
    where = f"/namespaces/{quote(exporter.namespace, safe='')}" if exporter.namespace else ""
    return f"{group}{where}/{resource}"


def _pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _container_port(pod: dict[str, Any], port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == port and isinstance(p.get("containerPort"), int):
                return int(p["containerPort"])
    return None


def _url(exporter: KubernetesExporterSettings, ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{exporter.scheme}://{host}:{port}{exporter.path}"


def _target(
    exporter: KubernetesExporterSettings, url: str, node: str, collector: CollectorSettings
) -> Target:
    labels = {**exporter.labels, "host": node}
    entry = TargetSettings(kind=exporter.kind, url=url, labels=labels,
                           interval_seconds=exporter.interval_seconds,
                           timeout_seconds=exporter.timeout_seconds)  # fmt: skip
    return resolve(entry, collector)


def pod_targets(
    items: list[dict[str, Any]],
    exporter: KubernetesExporterSettings,
    collector: CollectorSettings,
    skipped: Counter[str],
) -> list[Target]:
    """Ready pods with an IP, a node and the port: one target each; the rest counted."""
    out = []
    for pod in items:
        node = (pod.get("spec") or {}).get("nodeName")
        ip = (pod.get("status") or {}).get("podIP")
        port = _container_port(pod, exporter.port)
        if not _pod_ready(pod):
            skipped["not ready"] += 1
        elif not node or not ip:
            skipped["no node or IP"] += 1
        elif port is None:
            skipped[f"no port {exporter.port}"] += 1
        else:
            out.append(_target(exporter, _url(exporter, ip, port), node, collector))
    return out


def slice_targets(
    items: list[dict[str, Any]],
    exporter: KubernetesExporterSettings,
    collector: CollectorSettings,
    skipped: Counter[str],
) -> list[Target]:
    """Ready endpoints of EndpointSlices with a node name: one target each."""
    out = []
    for item in items:
        ports = item.get("ports") or []
        want = exporter.port
        port = next((p.get("port") for p in ports
                     if (p.get("name") if isinstance(want, str) else p.get("port")) == want),
                    None)  # fmt: skip
        for endpoint in item.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready")
            addresses, node = endpoint.get("addresses") or [], endpoint.get("nodeName")
            if ready is False:  # unset means ready (discovery.k8s.io/v1 EndpointConditions)
                skipped["not ready"] += 1
            elif not node or not addresses:
                skipped["no node or IP"] += 1
            elif not isinstance(port, int):
                skipped[f"no port {want}"] += 1
            else:
                out.append(_target(exporter, _url(exporter, addresses[0], port), node, collector))
    return out


def _why(response: httpx.Response) -> str:
    """An error answer in one line: the API server's Status message when it sent one."""
    try:
        body = response.json()
        message = body.get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    text = message or response.text[:200]
    return f"{response.status_code} {response.reason_phrase}: {' '.join(text.split())}"


class KubernetesDiscovery:
    """The exporter pods' targets now: the last good listing, refreshed periodically."""

    def __init__(
        self,
        settings: KubernetesSettings,
        collector: CollectorSettings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings, self.collector = settings, collector
        self.base = api_base(settings)
        self._verify = tls_verify(settings) if self.base.startswith("https") else True
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        #: The last successful listing's targets (kept while the API server fails).
        self.targets: list[Target] = []
        self.last_error: str | None = None
        self.refreshed = 0

    def _token(self) -> str | None:
        if self.settings.bearer_token is not None:
            return self.settings.bearer_token.get_secret_value()
        try:
            return Path(self.settings.token_file).read_text().strip() or None
        except OSError:
            return None  # outside a pod with an open API server (kubectl proxy): no token

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                verify=self._verify,
                timeout=self.settings.timeout_seconds,
                transport=self._transport,
                headers={"Accept": "application/json"},
            )
        return self._client

    async def _list(self, exporter: KubernetesExporterSettings) -> list[dict[str, Any]]:
        """Every item of one collection, page by page."""
        url, items, token = self.base + list_path(exporter), [], self._token()
        params = {"labelSelector": exporter.label_selector, "limit": str(PAGE_LIMIT)}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        while True:
            try:
                response = await self.client().get(url, params=params, headers=headers)
            except httpx.HTTPError as exc:
                raise DiscoveryError(f"GET {url}: {type(exc).__name__}: {exc}") from None
            if response.status_code != 200:
                raise DiscoveryError(f"GET {url}: {_why(response)}")
            try:
                body = response.json()
            except ValueError:
                raise DiscoveryError(f"GET {url}: the answer is not JSON") from None
            if not isinstance(body, dict) or not isinstance(body.get("items"), list):
                raise DiscoveryError(f"GET {url}: no items list in the answer")
            items.extend(i for i in body["items"] if isinstance(i, dict))
            token_next = (body.get("metadata") or {}).get("continue")
            if not token_next:
                return items
            params["continue"] = token_next

    async def refresh(self) -> bool:
        """List every exporter's pods; on any failure keep the last targets and log why."""
        found: list[Target] = []
        skipped: Counter[str] = Counter()
        try:
            for exporter in self.settings.exporters:
                items = await self._list(exporter)
                build = pod_targets if exporter.role == "pod" else slice_targets
                try:
                    found.extend(build(items, exporter, self.collector, skipped))
                except (AttributeError, TypeError, ValueError) as exc:  # a list where a map was
                    raise DiscoveryError(
                        f"{list_path(exporter)}: an item not shaped as the API's: {exc}"
                    ) from None
        except DiscoveryError as exc:
            error = f"kubernetes discovery: {exc}; keeping the last {len(self.targets)} targets"
            if error != self.last_error:
                logger.warning(error)
            self.last_error = error
            return False
        if found != self.targets or self.last_error is not None:
            left_out = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
            logger.info("kubernetes discovery", targets=len(found), skipped=left_out or None)
        self.targets, self.last_error = found, None
        self.refreshed += 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``refresh_seconds`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.refresh_seconds)
            if not stop.is_set():
                await self.refresh()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
