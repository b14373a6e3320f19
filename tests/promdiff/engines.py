"""The two engines under comparison: hbmwatch's API in-process, a real Prometheus over HTTP.

``HBMWATCH_PROMDIFF_SELF=1`` points the hbmwatch side at Prometheus too: every comparison
must then pass, which checks the harness itself (loading, requests, comparison).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from hbmwatch.bench.realprom import PrometheusUnavailable, RealPrometheus, SeriesSamples
from hbmwatch.settings import Settings
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store, private_schema, require_service
from tests.promdiff.compare import Answer, Ask, http_ask

PREFIX = "/prometheus"


def self_check() -> bool:
    return os.environ.get("HBMWATCH_PROMDIFF_SELF") == "1"


@contextlib.contextmanager
def prometheus_over(series: list[SeriesSamples], folder: Path) -> Iterator[RealPrometheus]:
    """A real Prometheus over the series; skips (or fails under REQUIRE_SERVICES) without one."""
    try:
        prom = RealPrometheus.over(series, folder)
    except PrometheusUnavailable as exc:
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    with prom:
        yield prom


@contextlib.contextmanager
def backend_store(kind: str, folder: Path, clock: Clock) -> Iterator[Store]:
    """A migrated store on SQLite (a file in ``folder``) or a private PostgreSQL schema."""
    if kind == "sqlite":
        store = make_store(f"sqlite:///{folder / 'hbmwatch.db'}", clock)
        try:
            yield store
        finally:
            store.close()
        return
    pg_url = require_service("HBMWATCH_TEST_PG_URL", "PostgreSQL")
    with private_schema(pg_url) as url:
        store = make_store(url, clock)
        try:
            yield store
        finally:
            store.close()


def settings_for(store: Store) -> Settings:
    return Settings(store={"url": store.engine.url.render_as_string(hide_password=False)})  # type: ignore[arg-type]


class Engines:
    """Ask both engines the same request; Prometheus' answers are cached (they never change)."""

    def __init__(self, hbmwatch: Any, prom: RealPrometheus) -> None:
        self._prom_client = httpx.Client(base_url=prom.url, timeout=120.0)
        self.prometheus: Ask = http_ask(self._prom_client)
        self.hbmwatch: Ask = (
            http_ask(httpx.Client(base_url=prom.url, timeout=120.0))
            if self_check()
            else http_ask(hbmwatch, PREFIX)
        )
        self._hbmwatch_client = hbmwatch
        self._cache: dict[tuple[str, str, tuple[tuple[str, str], ...]], Answer] = {}

    def ask(self, method: str, path: str, params: Mapping[str, Any]) -> tuple[Answer, Answer]:
        key = (method, path, tuple(sorted((k, str(v)) for k, v in params.items())))
        if key not in self._cache:
            self._cache[key] = self.prometheus(method, path, params)
        return self.hbmwatch(method, path, params), self._cache[key]

    def raw(self, request: Mapping[str, Any]) -> tuple[Answer, Answer]:
        """A recorded request replayed byte for byte (method, path, headers, body)."""
        out = []
        clients = (
            (self._prom_client, "") if self_check() else (self._hbmwatch_client, PREFIX),
            (self._prom_client, ""),
        )
        for client, prefix in clients:
            response = client.request(
                request["method"],
                prefix + request["path"],
                headers=request.get("headers", {}),
                content=request.get("body", "").encode() or None,
            )
            try:
                out.append((response.status_code, response.json()))
            except ValueError:
                out.append((response.status_code, response.text))
        return out[0], out[1]

    def close(self) -> None:
        self._prom_client.close()
