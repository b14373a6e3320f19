"""Kubernetes discovery of exporter pods (collector/kubernetes.py) against recorded answers.

The API server here is a real HTTP server on 127.0.0.1 answering with recorded PodList,
EndpointSliceList and Status bodies (tests/fixtures/upstream/kubernetes/README.md); httpx
talks to it as it would to the API server.  The exporters are real HTTP servers too, so the
node-identity test runs discovery, the scrape and the dcgm translator end to end.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.kubernetes import KubernetesDiscovery, api_base
from hbmwatch.collector.targets import TargetSet
from hbmwatch.records import Sample
from hbmwatch.settings import CollectorSettings, KubernetesSettings, load_settings
from hbmwatch.validation import ConfigError
from tests.conftest import FIXTURES

K8S = FIXTURES / "upstream" / "kubernetes"
DCGM_PAGE = FIXTURES / "upstream" / "datadog-dcgm-exporter-fixture" / "metrics.txt"
PODS_PATH = "/api/v1/pods"
SELECTOR = "app.kubernetes.io/name=dcgm-exporter"


def recorded(name: str) -> Any:
    return json.loads((K8S / name).read_text())


class Server:
    """A real HTTP server: ``routes[path] = (status, body)``; keeps each request seen."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                outer.requests.append(
                    (url.path, parse_qs(url.query), self.headers["Authorization"])
                )
                status, body = outer.routes.get(url.path, (404, b'{"kind":"Status","code":404}'))
                if callable(body):
                    body = body(parse_qs(url.query))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def answer(self, path: str, body: Any, status: int = 200) -> None:
        data = body if isinstance(body, bytes) or callable(body) else json.dumps(body).encode()
        self.routes[path] = (status, data)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api() -> Iterator[Server]:
    server = Server()
    yield server
    server.close()


def discovery(api: Server, **exporter: Any) -> KubernetesDiscovery:
    entry = {"kind": "dcgm", "label_selector": SELECTOR, "labels": {"cluster": "prod-a"}}
    k8s = KubernetesSettings(api_url=api.url, bearer_token="s3cret",
                             exporters=[{**entry, **exporter}])  # type: ignore[list-item]  # fmt: skip
    return KubernetesDiscovery(k8s, CollectorSettings())


def test_ready_pods_become_targets_at_their_node_name(api: Server) -> None:
    api.answer(PODS_PATH, recorded("podlist-dcgm-exporter.json"))
    found = discovery(api)
    assert asyncio.run(found.refresh())
    # Two ready pods; the running-but-not-ready one and the Pending one are left out.
    assert [(t.kind, t.url, t.labels) for t in found.targets] == [
        ("dcgm", "http://10.244.1.17:9400/metrics", {"cluster": "prod-a", "host": "gpu-node-01"}),
        ("dcgm", "http://10.244.2.23:9400/metrics", {"cluster": "prod-a", "host": "gpu-node-02"}),
    ]
    path, query, auth = api.requests[0]
    assert path == PODS_PATH and query["labelSelector"] == [SELECTOR] and query["limit"] == ["500"]
    assert auth == "Bearer s3cret"
    assert found.targets[0].interval_seconds == 1.0  # the collector's default interval


def test_a_namespace_and_a_port_number(api: Server) -> None:
    api.answer("/api/v1/namespaces/gpu-operator/pods", recorded("podlist-dcgm-exporter.json"))
    found = discovery(api, namespace="gpu-operator", port=9500, interval_seconds=5.0)
    assert asyncio.run(found.refresh())
    assert [t.url for t in found.targets] == [
        "http://10.244.1.17:9500/metrics",
        "http://10.244.2.23:9500/metrics",
    ]
    assert {t.interval_seconds for t in found.targets} == {5.0}


def test_a_port_name_no_container_has_skips_the_pod(api: Server) -> None:
    api.answer(PODS_PATH, recorded("podlist-dcgm-exporter.json"))
    found = discovery(api, port="http")
    assert asyncio.run(found.refresh()) and found.targets == []


def test_endpointslices_of_a_dme_service(api: Server) -> None:
    path = "/apis/discovery.k8s.io/v1/namespaces/kube-amd-gpu/endpointslices"
    api.answer(path, recorded("endpointslicelist-dme.json"))
    found = discovery(api, kind="dme", role="endpointslice", namespace="kube-amd-gpu",
                      label_selector="kubernetes.io/service-name=amd-metrics-exporter")  # fmt: skip
    assert asyncio.run(found.refresh())
    # The terminating (not ready) endpoint on mi300x-node-02 is left out.
    assert [(t.kind, t.url, t.labels["host"]) for t in found.targets] == [
        ("dme", "http://10.244.5.12:5000/metrics", "mi300x-node-01")
    ]


def test_pages_are_followed_by_their_continue_token(api: Server) -> None:
    whole = recorded("podlist-dcgm-exporter.json")
    first, second = copy.deepcopy(whole), copy.deepcopy(whole)
    first["items"], first["metadata"]["continue"] = whole["items"][:1], "eyJ2IjoibWV0YS5rOHMuaW8"
    second["items"] = whole["items"][1:]

    def page(query: dict[str, list[str]]) -> bytes:
        return json.dumps(second if "continue" in query else first).encode()

    api.answer(PODS_PATH, page)
    found = discovery(api)
    assert asyncio.run(found.refresh())
    assert [t.labels["host"] for t in found.targets] == ["gpu-node-01", "gpu-node-02"]
    assert api.requests[1][1]["continue"] == ["eyJ2IjoibWV0YS5rOHMuaW8"]


def test_an_api_error_keeps_the_last_targets_and_says_why(
    api: Server, caplog: pytest.LogCaptureFixture
) -> None:
    api.answer(PODS_PATH, recorded("podlist-dcgm-exporter.json"))
    found = discovery(api)
    assert asyncio.run(found.refresh())
    kept = list(found.targets)
    api.answer(PODS_PATH, recorded("status-forbidden.json"), status=403)
    assert not asyncio.run(found.refresh())
    assert found.targets == kept
    assert found.last_error is not None and "\n" not in found.last_error
    assert "403 Forbidden: pods is forbidden: User" in found.last_error
    assert found.last_error.endswith("keeping the last 2 targets")
    api.answer(PODS_PATH, b"<html>bad gateway</html>", status=502)
    assert not asyncio.run(found.refresh()) and found.targets == kept
    assert "502 Bad Gateway: <html>bad gateway</html>" in found.last_error
    api.answer(PODS_PATH, b"not json")
    assert not asyncio.run(found.refresh()) and "not JSON" in found.last_error
    api.answer(PODS_PATH, {"kind": "PodList", "items": [{"spec": [], "status": "Running"}]})
    assert not asyncio.run(found.refresh()) and found.targets == kept
    assert "/api/v1/pods: an item not shaped as the API's" in found.last_error
    api.close()  # the API server gone: a connection error, the same targets kept
    assert not asyncio.run(found.refresh()) and found.targets == kept
    assert "ConnectError" in found.last_error


def test_the_token_file_is_read_at_every_refresh(api: Server, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    api.answer(PODS_PATH, recorded("podlist-dcgm-exporter.json"))
    k8s = KubernetesSettings(api_url=api.url, token_file=str(token),
                             exporters=[{"kind": "dcgm", "label_selector": SELECTOR}])  # type: ignore[list-item]  # fmt: skip
    found = KubernetesDiscovery(k8s, CollectorSettings())
    asyncio.run(found.refresh())
    token.write_text("rotated\n")
    asyncio.run(found.refresh())
    assert [r[2] for r in api.requests] == ["Bearer first", "Bearer rotated"]


def test_in_cluster_address_and_its_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert api_base(KubernetesSettings()) == "https://10.96.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert api_base(KubernetesSettings()) == "https://[fd00::1]:443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ConfigError, match=r"not in a pod .* and no api_url set"):
        api_base(KubernetesSettings())


def test_in_cluster_over_tls_with_the_ca_and_token_files(
    certificate: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod: the address from KUBERNETES_SERVICE_*, the token and CA from files."""
    cert, key = certificate
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    api = Server(tls)
    try:
        api.answer(PODS_PATH, recorded("podlist-dcgm-exporter.json"))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        token = tmp_path / "token"
        token.write_text("sa-token")
        exporters = [{"kind": "dcgm", "label_selector": SELECTOR}]
        k8s = KubernetesSettings(token_file=str(token), ca_file=str(cert), exporters=exporters)  # type: ignore[arg-type]
        found = KubernetesDiscovery(k8s, CollectorSettings())
        assert asyncio.run(found.refresh()) and len(found.targets) == 2
        assert api.requests[0][2] == "Bearer sa-token"
        # The system's CAs do not know the cluster's: refused, in one line, nothing kept.
        k8s = KubernetesSettings(token_file=str(token), exporters=exporters)  # type: ignore[arg-type]
        stranger = KubernetesDiscovery(k8s, CollectorSettings())
        assert not asyncio.run(stranger.refresh()) and stranger.targets == []
        assert "CERTIFICATE_VERIFY_FAILED" in (stranger.last_error or "")
    finally:
        api.close()


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The chart passes exporters through the config file; variables work as well."""
    empty = tmp_path / "hbmwatch.toml"
    empty.write_text("")
    exporters = [{"kind": "dme", "label_selector": "app=x", "port": 5000}]
    monkeypatch.setenv("HBMWATCH_COLLECTOR__KUBERNETES__EXPORTERS", json.dumps(exporters))
    settings = load_settings(empty)
    assert settings.collector.kubernetes.exporters[0].port == 5000
    exporters[0]["port"] = "9400"  # a number written as a string is still a number
    monkeypatch.setenv("HBMWATCH_COLLECTOR__KUBERNETES__EXPORTERS", json.dumps(exporters))
    assert load_settings(empty).collector.kubernetes.exporters[0].port == 9400
    assert settings.collector.configured  # discovery counts as real targets: no simulator
    monkeypatch.setenv("HBMWATCH_COLLECTOR__KUBERNETES__EXPORTERS", '[{"kind": "dme"}]')
    with pytest.raises(ConfigError, match="label_selector"):
        load_settings(empty)


# -- node identity ---------------------------------------------------------------------------
class ListSink:
    """What the engine calls on a BatchingSink; it keeps the samples in a list."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, samples: list[Sample]) -> None:
        self.samples.extend(samples)

    def due(self) -> bool:
        return False

    async def flush(self) -> None:
        return None


def exporter_pod(podlist: dict, server: Server) -> dict:
    """The recorded pods pointed at a real exporter: pod IP 127.0.0.1, its port."""
    podlist = copy.deepcopy(podlist)
    for pod in podlist["items"]:
        if pod["status"].get("podIP"):
            pod["status"]["podIP"] = "127.0.0.1"
        pod["spec"]["containers"][0]["ports"][0]["containerPort"] = server.port
    return podlist


def page_as(pod_name: str) -> bytes:
    """dcgm-exporter's page from a pod without NODE_NAME: Hostname is the pod's name."""
    return re.sub(r'Hostname="[^"]*"', f'Hostname="{pod_name}"', DCGM_PAGE.read_text()).encode()


def hosts_of(samples: list[Sample]) -> set[str]:
    return {dict(s.series.labels)["host"] for s in samples if "gpu" in dict(s.series.labels)}


async def scrape_once(settings: CollectorSettings, targets: TargetSet) -> list[Sample]:
    sink = ListSink()
    async with ScrapeEngine(targets, sink, settings) as engine:  # type: ignore[arg-type]
        reports = await engine.scrape_round()
    assert reports and all(r.up for r in reports), reports
    return sink.samples


def test_a_restarted_exporter_pod_keeps_its_nodes_host(api: Server) -> None:
    """A DaemonSet pod replaced (new name, new IP, same node) keeps its series' host."""
    old, new = Server(), Server()
    try:
        old.answer("/metrics", page_as("nvidia-dcgm-exporter-8ljq7"))
        new.answer("/metrics", page_as("nvidia-dcgm-exporter-m5r2w"))
        before = exporter_pod(recorded("podlist-dcgm-exporter.json"), old)
        before["items"] = before["items"][:1]  # the pod on gpu-node-01
        after = exporter_pod(recorded("podlist-dcgm-exporter-restarted.json"), new)
        after["items"] = after["items"][:1]
        assert after["items"][0]["metadata"]["name"] != before["items"][0]["metadata"]["name"]
        k8s = {"api_url": api.url, "exporters": [{"kind": "dcgm", "label_selector": SELECTOR}]}
        settings = CollectorSettings(kubernetes=k8s)  # type: ignore[arg-type]

        api.answer(PODS_PATH, before)
        first = asyncio.run(scrape_once(settings, TargetSet(settings)))
        api.answer(PODS_PATH, after)
        second = asyncio.run(scrape_once(settings, TargetSet(settings)))
        assert hosts_of(first) == hosts_of(second) == {"gpu-node-01"}
        device = [
            {s.series for s in got if "gpu" in dict(s.series.labels)} for got in (first, second)
        ]
        assert device[0] and device[0] == device[1]  # the very same device series

        # Without discovery's label the page's Hostname (the pod's name) would be the host.
        plain = CollectorSettings(targets=[{"kind": "dcgm", "url": old.url + "/metrics"}])  # type: ignore[list-item]
        assert hosts_of(asyncio.run(scrape_once(plain, TargetSet(plain)))) == {
            "nvidia-dcgm-exporter-8ljq7"
        }
    finally:
        old.close()
        new.close()


def test_the_engine_picks_up_pods_found_later(api: Server) -> None:
    """``run`` lists again every refresh_seconds: a pod that becomes ready is scraped."""
    exporter = Server()
    try:
        exporter.answer("/metrics", page_as("nvidia-dcgm-exporter-8ljq7"))
        pods = exporter_pod(recorded("podlist-dcgm-exporter.json"), exporter)
        api.answer(PODS_PATH, {**pods, "items": []})
        k8s = {"api_url": api.url, "refresh_seconds": 0.1,
               "exporters": [{"kind": "dcgm", "label_selector": SELECTOR}]}  # fmt: skip
        settings = CollectorSettings(kubernetes=k8s, spool_dir="unused")  # type: ignore[arg-type]
        sink = ListSink()
        engine = ScrapeEngine(TargetSet(settings), sink, settings)  # type: ignore[arg-type]

        async def scenario() -> None:
            stop = asyncio.Event()
            running = asyncio.create_task(engine.run(stop))
            found = engine.targets.discovery
            assert found is not None
            async with asyncio.timeout(30):
                while found.refreshed == 0:  # the first listing: no pods yet
                    await asyncio.sleep(0.01)
            assert found.targets == []
            api.answer(PODS_PATH, {**pods, "items": pods["items"][:1]})
            async with asyncio.timeout(30):
                while not hosts_of(sink.samples):
                    await asyncio.sleep(0.05)
            stop.set()
            await running

        asyncio.run(scenario())
        assert hosts_of(sink.samples) == {"gpu-node-01"}
    finally:
        exporter.close()
