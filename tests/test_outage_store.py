"""A store that goes away: every entry point says "unavailable", the API says 503 (issue 12).

A real PostgreSQL server (``private_pg``) is stopped under a live store, and a real SQLite
file is locked by another connection, as another process would.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hbmwatch.api.main import create_app
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Device, Sample, SeriesKey
from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.store.store import Store, StoreUnavailable
from tests.conftest import NOW, Clock, make_store

POWER = SeriesKey("gpu_power_watts", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0"})
SELECTOR = parse_selector('gpu_power_watts{host="h"}')

#: Every kind of entry point, as the service's loops and the API call them.
ENTRY_POINTS: dict[str, Callable[[Store], Any]] = {
    "write": lambda s: s.write([Sample(POWER, int(NOW * 1000) + 7_000, 3.0)]),
    "write new series": lambda s: s.write(
        [Sample(SeriesKey("gpu_power_watts", {**POWER.label_dict, "gpu": "9"}), int(NOW * 1000), 1)]
    ),
    "range_query": lambda s: s.range_query(SELECTOR, NOW - 600, NOW + 60, 15, Aggregation.AVG),
    "latest": lambda s: s.latest(SELECTOR),
    "compact": lambda s: s.compact(),
    "apply_retention": lambda s: s.apply_retention(),
    "get_state": lambda s: s.get_state("x"),
    "put_state": lambda s: s.put_state("x", {"a": 1}),
    "devices": lambda s: s.devices(),
    "upsert_devices": lambda s: s.upsert_devices(
        [Device(cluster="c", rack="r", host="h", gpu="0", sku="H100", partition="")]
    ),
    "read_new": lambda s: s.read_new(None, int(NOW * 1000) - 60_000),
    "findings.query": lambda s: s.findings.query(open_only=True),
    "findings.save": lambda s: s.findings.save([]) or s.findings.get("nope"),
    "alerts.live": lambda s: s.alerts.live(0),
    "alerts.silences": lambda s: s.alerts.silences(),
    "ping": lambda s: s.ping(),
}


@pytest.fixture
def stopped_pg(private_pg: dict, clock: Clock) -> Iterator[Store]:
    """A store with data whose PostgreSQL server has just been stopped."""
    store = make_store(private_pg["url"], clock)
    store.write([Sample(POWER, int(NOW * 1000) - i * 1000, float(i)) for i in range(60)])
    private_pg["stop"]()
    try:
        yield store
    finally:
        private_pg["start"]()
        store.close()


@pytest.mark.postgres
def test_every_entry_point_says_unavailable_while_postgres_is_down(stopped_pg: Store) -> None:
    for name, call in ENTRY_POINTS.items():
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="the store is unavailable"):
            call(stopped_pg)
        assert time.monotonic() - started < 30, f"{name} took too long to fail"


@pytest.mark.postgres
def test_api_answers_503_with_retry_after_while_postgres_is_down(stopped_pg: Store) -> None:
    app = create_app(Settings(store=StoreSettings(url="sqlite://")), stopped_pg)
    with TestClient(app, raise_server_exceptions=False) as client:
        for path, params in [
            ("/api/v1/query", {"query": "gpu_power_watts"}),
            (
                "/api/v1/query_range",
                {"query": "gpu_power_watts", "start": NOW - 600, "end": NOW, "step": 15},
            ),
            ("/api/v1/devices", {}),
            ("/api/v1/incidents", {}),
            ("/api/v1/alerts", {}),
        ]:
            r = client.get(path, params=params)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["Retry-After"] == "5"
            assert r.json()["error"]["code"] == "store_unavailable"
            assert "Traceback" not in r.text
        assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.postgres
def test_store_recovers_when_postgres_is_back(private_pg: dict, clock: Clock) -> None:
    store = make_store(private_pg["url"], clock)
    try:
        private_pg["stop"]()
        with pytest.raises(StoreUnavailable):
            store.put_state("x", 1)
        private_pg["start"]()
        store.put_state("x", 2)  # the pool's dead connections are replaced, not reused
        assert store.get_state("x") == 2
    finally:
        store.close()


def test_a_locked_sqlite_store_is_unavailable_not_an_error(tmp_path: Path, clock: Clock) -> None:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", clock, sqlite_busy_timeout_seconds=0.2)
    other = sqlite3.connect(db, timeout=1, isolation_level=None)  # as another process would
    try:
        other.execute("BEGIN EXCLUSIVE")
        for name in ("write", "write new series", "put_state", "upsert_devices"):
            with pytest.raises(StoreUnavailable, match="locked"):
                ENTRY_POINTS[name](store)
        assert ENTRY_POINTS["findings.query"](store) == []  # WAL: readers are not blocked
        other.execute("COMMIT")
        assert ENTRY_POINTS["write"](store).accepted == 1
    finally:
        other.close()
        store.close()
