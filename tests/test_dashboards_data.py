"""Every dashboard query returns data: on a real Prometheus 2.42 and on hbmwatch's /prometheus.

The same half hour of a small fleet (tests/dashboard_data.py) is loaded into a real
Prometheus (``promtool tsdb create-blocks-from openmetrics``) and into hbmwatch's store on
SQLite and PostgreSQL; each panel, variable and annotation query is sent as Grafana sends
it, and must answer with at least one series (a variable with one value).  Queries on the
virtual series (ALERTS, hbmwatch_incident_open, hbmwatch_findings_open) must answer on
hbmwatch, whose store also holds an incident of firing thermal and fabric alerts on n0; a
Prometheus holds no such series, so they are not compared.  Self-health's process panels
read /metrics, not the store: tests/test_dashboards.py checks their names against a live
/metrics.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.main import create_app
from hbmwatch.metrics import METRICS
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import ApiSettings, Settings, StoreSettings
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from tests.conftest import Clock, make_store, private_schema, require_service
from tests.dashboard_data import END_S, answer, fleet_series, openmetrics
from tests.dashboard_queries import VIRTUAL, Query, all_queries, parse, selectors
from tests.test_alerting import stated
from tests.test_service import free_port

PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
READY_DEADLINE_S = 120.0  # a loaded 2-core machine: generous


def _names(query: Query) -> set[str]:
    return {s.name for s in selectors(parse(query.expr))}


#: Queries on series a store can hold or hbmwatch builds: all but self-health's process ones.
STORE_QUERIES = [q for q in all_queries() if _names(q) <= METRICS.keys() | VIRTUAL.keys()]
_IDS = [str(q) for q in STORE_QUERIES]


def _require(path: Path) -> None:
    if not path.exists():
        message = f"{path} not available"
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A real Prometheus serving the fleet's half hour from blocks, on a free port."""
    _require(PROMETHEUS)
    _require(PROMTOOL)
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "data.om").write_text(openmetrics(fleet_series()))
    (folder / "prometheus.yml").write_text("global: {}\n")
    subprocess.run(
        [str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", "data.om", "tsdb"],
        cwd=folder, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'tsdb'}", "--storage.tsdb.retention.time=100y",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_DEADLINE_S
        while True:
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready: {(folder / 'prometheus.log').read_text()}")
            time.sleep(0.2)
        with httpx.Client(base_url=f"{base}/", timeout=60) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.parametrize("query", STORE_QUERIES, ids=_IDS)
def test_query_returns_data_on_prometheus(query: Query, prometheus: httpx.Client) -> None:
    """The dashboards work on a Prometheus holding the canonical and virtual series."""
    assert answer(prometheus, query, END_S), f"{query}: no data on Prometheus"


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    """A private schema on the test server for this module, dropped afterwards."""
    with private_schema(require_service("HBMWATCH_TEST_PG_URL", "PostgreSQL")) as url:
        yield url


def _alerting_state(store: Store) -> None:
    """Thermal and fabric findings on n0's GPUs, old enough that their alerts fire by the
    dashboards' query time: one open incident, its alerts, four open findings."""
    clock: Clock = store._clock  # type: ignore[assignment]
    end = clock()
    clock.now = end - 900
    alerting = Alerting(store, Settings().alerts)
    alerting.start()
    entities = [{"cluster": "c0", "rack": "r0", "host": "n0", "gpu": str(g), "sku": "MI300X"}
                for g in (0, 1)]  # fmt: skip
    kinds = (FindingKind.THERMAL_EXCURSION, FindingKind.FABRIC_ERRORS)
    findings = [stated(clock, kind, e) for kind in kinds for e in entities]
    store.findings.save(findings)
    alerting.process(findings)
    clock.now = end - 300
    later = [dataclasses.replace(f, updated_ms=int(clock() * 1000)) for f in findings]
    store.findings.save(later)
    alerting.process(later)
    clock.now = end
    assert store.alerts.incidents(), "the findings opened no incident"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def hbmwatch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, set[str]]]:
    """hbmwatch's app over a store holding the fleet's canonical samples, and the metric
    names its /prometheus knows."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'hbmwatch.db'}"
    else:
        url = request.getfixturevalue("pg_module_url")
    store = make_store(url, Clock(float(END_S)))
    samples = [
        Sample(SeriesKey(s.name, dict(s.labels)), t * 1000, v)
        for s in fleet_series()
        if s.name in METRICS
        for t, v in s.points
    ]
    result = store.write(samples)
    assert result.accepted == len(samples), result
    _alerting_state(store)
    try:
        settings = Settings(store=StoreSettings(url=url))
        with TestClient(create_app(settings, store), base_url="http://testserver/prometheus/") as c:
            names = c.get("api/v1/label/__name__/values").json()["data"]
            yield c, set(names)
    finally:
        store.close()


@pytest.mark.parametrize("query", STORE_QUERIES, ids=_IDS)
def test_query_returns_data_on_hbmwatch(
    query: Query, hbmwatch: tuple[httpx.Client, set[str]]
) -> None:
    """The dashboards work on hbmwatch's own /prometheus over its store."""
    client, known = hbmwatch
    assert VIRTUAL.keys() <= known, "the alerting state is not served as series"
    assert answer(client, query, END_S), f"{query}: no data on hbmwatch"


def _comparable(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], list[Any]]:
    """Series by label set -> [(time, value)], values as floats (NaN compares equal)."""
    out = {}
    for r in result:
        points = r["values"] if "values" in r else [r["value"]]
        out[tuple(sorted(r["metric"].items()))] = [(t, float(v)) for t, v in points]
    return out


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("query", STORE_QUERIES, ids=_IDS)
def test_query_answers_as_prometheus_does(
    query: Query, prometheus: httpx.Client, hbmwatch: tuple[httpx.Client, set[str]]
) -> None:
    """Over the same samples, hbmwatch answers each dashboard query with Prometheus' series,
    timestamps and values (relative 1e-9)."""
    client, _ = hbmwatch
    if _names(query) & VIRTUAL.keys():
        pytest.skip("alerting state: hbmwatch's series, which a Prometheus does not hold")
    theirs, ours = answer(prometheus, query, END_S), answer(client, query, END_S)
    if query.kind == "variable":
        assert sorted(ours) == sorted(theirs), query
        return
    want, got = _comparable(theirs), _comparable(ours)
    assert got.keys() == want.keys(), f"{query}: series differ: {set(got) ^ set(want)}"
    for key, points in want.items():
        assert [t for t, _ in got[key]] == [t for t, _ in points], f"{query}: times of {key}"
        bad = [(t, x, y) for (t, x), (_, y) in zip(points, got[key], strict=True)
               if not _same(x, y)]  # fmt: skip
        assert not bad, f"{query}: {key}: (time, Prometheus, hbmwatch) {bad[:3]}"


def test_grafana_reads_with_the_read_token(tmp_path: Path) -> None:
    """With reads closed, /prometheus answers Grafana's provisioned header (the read token,
    which can do nothing else) and refuses a request without it."""
    url = f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    store = make_store(url, Clock(float(END_S)))
    api = ApiSettings(read_token="r-token", write_token="w-token", open_reads=False)
    settings = Settings(store=StoreSettings(url=url), api=api)
    try:
        with TestClient(create_app(settings, store), base_url="http://testserver/") as client:
            query = {"query": "vector(1)", "time": END_S}
            grafana = {"Authorization": "Bearer r-token"}  # httpHeaderName1 / httpHeaderValue1
            ok = client.post("prometheus/api/v1/query", data=query, headers=grafana)
            assert ok.status_code == 200 and ok.json()["data"]["result"], ok.text
            assert client.post("prometheus/api/v1/query", data=query).status_code == 401
            silence = client.post("api/v1/silences", json={}, headers=grafana)
            assert silence.status_code in (401, 403), silence.text  # a read token cannot write
    finally:
        store.close()
