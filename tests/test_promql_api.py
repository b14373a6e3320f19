"""The /prometheus API: Prometheus' envelopes, parameters and errors, reads by form POST,
the tiers long spans read, and the budgets every query runs under.

Answers are compared with a real Prometheus in tests/test_promql_diff.py; here are the
shapes and the behaviour of hbmwatch's own choices (tiers, errors, tokens).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hbmwatch.api.main import create_app
from hbmwatch.promql import resolution
from hbmwatch.promql.engine import parse
from hbmwatch.promql.values import Grid
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.store import Store
from tests.conftest import NOW, Clock, make_store
from tests.test_api import READ, bearer, open_incident, settings_for

API = "/prometheus/api/v1"
POWER = "gpu_power_watts"
REPLAYS = "gpu_pcie_replays_total"
HOSTS = ("n1", "n2")


def _fill(store: Store, clock: Clock, hours: float, every_s: int = 10) -> None:
    start = int(clock() * 1000) - int(hours * 3600_000)
    samples = []
    for h, host in enumerate(HOSTS):
        labels = {"host": host, "gpu": "0", "rack": "r0"}
        for i in range(int(hours * 3600 / every_s)):
            t = start + i * every_s * 1000
            samples.append(Sample(SeriesKey(POWER, labels), t, 300.0 + h + (i % 97)))
            samples.append(Sample(SeriesKey(REPLAYS, labels), t, float(i * 2 % 500)))
    assert store.write(samples).accepted == len(samples)


@pytest.fixture
def sqlite_store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    """Shapes and errors do not depend on the database: SQLite alone; what reads the
    tables (tiers, label ranges, alerting series) runs on both stores."""
    store = make_store(f"sqlite:///{tmp_path / 'hbmwatch.db'}", clock)
    yield store
    store.close()


@pytest.fixture
def client(sqlite_store: Store, clock: Clock) -> Iterator[TestClient]:
    _fill(sqlite_store, clock, hours=1)
    with TestClient(create_app(settings_for(sqlite_store), sqlite_store)) as c:
        yield c


def test_instant_answers_have_prometheus_shapes(client: TestClient) -> None:
    at = NOW - 60.5
    got = client.get(f"{API}/query", params={"query": POWER, "time": at})
    assert got.status_code == 200
    assert f"[{int(at)}.500," in got.text  # seconds with three decimals, as Prometheus writes
    body = got.json()
    assert body["status"] == "success" and body["data"]["resultType"] == "vector"
    assert {r["metric"]["host"] for r in body["data"]["result"]} == set(HOSTS)
    assert all(isinstance(r["value"][1], str) for r in body["data"]["result"])
    scalar = client.get(f"{API}/query", params={"query": "1 / 0", "time": at}).json()
    assert scalar["data"] == {"resultType": "scalar", "result": [at, "+Inf"]}
    text = client.get(f"{API}/query", params={"query": '"hi"', "time": at}).json()
    assert text["data"]["result"] == [at, "hi"]
    last = NOW - 10  # the newest sample
    matrix = client.get(f"{API}/query", params={"query": f"{POWER}[1m]", "time": last}).json()
    assert matrix["data"]["resultType"] == "matrix"
    assert all(len(s["values"]) == 7 for s in matrix["data"]["result"])  # [t-60s, t] closed


def test_range_queries_by_get_and_form_post_agree(client: TestClient) -> None:
    params = {"query": f"sum by (host) (rate({REPLAYS}[5m]))", "start": NOW - 1800,
              "end": NOW, "step": "1m"}  # fmt: skip
    by_get = client.get(f"{API}/query_range", params=params)
    by_post = client.post(f"{API}/query_range", data=params)
    assert by_get.status_code == by_post.status_code == 200
    assert by_get.json() == by_post.json()
    result = by_get.json()["data"]["result"]
    assert [s["metric"] for s in result] == [{"host": "n1"}, {"host": "n2"}]  # sorted
    assert [float(t) for t, _ in result[0]["values"]] == [NOW - 1800 + 60 * i for i in range(31)]


def test_a_form_post_is_a_read_not_a_write(sqlite_store: Store) -> None:
    store = sqlite_store
    app = create_app(settings_for(store, open_reads=False), store)
    with TestClient(app) as c:
        form = {"query": "1", "time": NOW}
        assert c.post(f"{API}/query", data=form).status_code == 401
        assert c.post(f"{API}/query", data=form, headers=bearer(READ)).status_code == 200
        assert c.post("/api/v1/silences", json={}, headers=bearer(READ)).status_code == 403


@pytest.mark.parametrize(
    ("params", "status", "kind", "words"),
    [
        ({"query": "sum("}, 400, "bad_data", "parse error"),
        ({"query": POWER, "time": "yesterday"}, 400, "bad_data", 'parameter "time"'),
        ({"query": f'{POWER}{{host=~"(?=n)"}}'}, 400, "bad_data", "regex"),
        ({"query": f"{POWER} + on(rack) {POWER}"}, 422, "execution", "many-to-many"),
        ({"query": f"max_over_time({POWER}[5m:1m] @ 100)"}, 422, "unsupported", "@ modifier"),
        ({"query": f'{POWER}{{host="n1" or host="n2"}}'}, 422, "unsupported", "'or'"),
        ({"query": f"holt_winters({POWER}[5m], 2, 0.5)"}, 422, "execution", "smoothing"),
    ],
)
def test_bad_queries_get_prometheus_errors(client, params, status, kind, words) -> None:
    got = client.get(f"{API}/query", params={"time": NOW, **params})
    assert got.status_code == status, got.text
    body = got.json()
    assert body["status"] == "error" and body["errorType"] == kind
    assert words in body["error"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"start": NOW, "end": NOW - 60, "step": "60"}, "end timestamp must not be before"),
        ({"start": NOW - 60, "end": NOW, "step": "0"}, "zero or negative"),
        ({"start": NOW - 60, "end": NOW, "step": "1x"}, 'parameter "step"'),
        ({"start": NOW - 86400, "end": NOW, "step": "1"}, "11,000 points"),
    ],
)
def test_bad_range_parameters_are_bad_data(client: TestClient, params, words) -> None:
    got = client.get(f"{API}/query_range", params={"query": POWER, **params})
    assert got.status_code == 400
    assert got.json()["errorType"] == "bad_data" and words in got.json()["error"]


def test_range_vector_is_not_a_range_query(client: TestClient) -> None:
    params = {"query": f"{POWER}[5m]", "start": NOW - 60, "end": NOW, "step": 15}
    got = client.get(f"{API}/query_range", params=params)
    assert got.status_code == 400 and "range vector" in got.json()["error"]


def test_query_budget_is_a_422_naming_the_limit(store: Store, clock: Clock) -> None:
    _fill(store, clock, hours=1)
    app = create_app(settings_for(store), store)
    store.settings = store.settings.model_copy(update={"max_points_per_query": 100})
    with TestClient(app) as c:
        got = c.get(f"{API}/query", params={"query": f"max_over_time({POWER}[1h])", "time": NOW})
    assert got.status_code == 422
    assert "store.max_points_per_query" in got.json()["error"]


def test_labels_series_values_metadata_and_buildinfo(client: TestClient) -> None:
    names = client.get(f"{API}/labels").json()["data"]
    assert {"__name__", "host", "gpu", "rack"} <= set(names)
    assert client.post(f"{API}/labels", data={"match[]": REPLAYS}).json()["data"] == sorted(
        ["__name__", "gpu", "host", "rack"]
    )
    hosts = client.get(f"{API}/label/host/values", params={"match[]": f'{POWER}{{host!="n2"}}'})
    assert hosts.json()["data"] == ["n1"]
    names = client.get(f"{API}/label/__name__/values").json()["data"]
    assert names == sorted([POWER, REPLAYS])
    series = client.get(f"{API}/series", params={"match[]": '{__name__=~"gpu_.*",host="n1"}'})
    assert len(series.json()["data"]) == 2
    assert client.get(f"{API}/series").json()["errorType"] == "bad_data"
    meta = client.get(f"{API}/metadata", params={"metric": REPLAYS}).json()["data"]
    assert meta[REPLAYS][0]["type"] == "counter"
    info = client.get(f"{API}/status/buildinfo").json()["data"]
    assert info["version"].startswith("2.")


def test_long_spans_read_the_minute_tier_and_say_so(store: Store, clock: Clock) -> None:
    _fill(store, clock, hours=8)
    store.compact(now_ms=int(NOW * 1000) + 600_000)
    query = {"query": f"max_over_time({POWER}{{host='n1'}}[10m])", "start": NOW - 7 * 3600,
             "end": NOW - 3600, "step": "5m"}  # fmt: skip
    # the tier holds whole minutes, [t - 10m, t); raw [t - 10m, t] would add the sample at t
    shifted = {**query, "query": query["query"].replace("[10m]", "[10m] offset 1ms")}
    with TestClient(create_app(settings_for(store), store)) as c:
        tiered = c.get(f"{API}/query_range", params=query).json()
        raw = c.get(f"{API}/query_range", params={**shifted, "resolution": "raw"}).json()
        bad = c.get(f"{API}/query_range", params={**query, "resolution": "5m"})
    assert "1m tier" in tiered["warnings"][0] and "warnings" not in raw
    assert bad.status_code == 400
    peak = [float(v) for _, v in tiered["data"]["result"][0]["values"]]
    exact = [float(v) for _, v in raw["data"]["result"][0]["values"]]
    assert len(peak) == len(exact) == 73
    # each minute's max survives in the tier: the peak of a 10-minute window is kept
    assert all(math.isclose(a, b) for a, b in zip(peak, exact, strict=True))


def test_a_tier_sample_stands_at_its_minutes_last_sample(store: Store, clock: Clock) -> None:
    _fill(store, clock, hours=8)
    store.compact(now_ms=int(NOW * 1000) + 600_000)
    at = NOW - 3 * 3600 - 1  # just before a minute: raw and tier see the same last sample
    query = {"query": f"timestamp({POWER}{{host='n1'}})", "start": at - 600, "end": at,
             "step": "60"}  # fmt: skip
    with TestClient(create_app(settings_for(store), store)) as c:
        tiered = c.get(f"{API}/query_range", params={**query, "resolution": "1m"}).json()
        raw = c.get(f"{API}/query_range", params={**query, "resolution": "raw"}).json()
    assert tiered["data"]["result"] == raw["data"]["result"]
    assert float(raw["data"]["result"][0]["values"][-1][1]) == at - 9  # every 10 s


@pytest.mark.parametrize(
    ("query", "grid", "tier"),
    [
        ("rate(x[5m])", Grid(0, 86_400_000, 60_000), "1m"),
        ("rate(x[1m])", Grid(0, 86_400_000, 60_000), "raw"),  # a minute holds too few
        ("rate(x[5m])", Grid(0, 3_600_000, 60_000), "raw"),  # short span: exact
        ("x", Grid(0, 86_400_000, 15_000), "raw"),  # step under a minute
        ("x", Grid(0, 30 * 86_400_000, 3_600_000), "1m"),  # bare selector: no hour tier
        ("avg_over_time(x[6h])", Grid(0, 30 * 86_400_000, 3_600_000), "1h"),
        ("max_over_time(x[10m:1m])", Grid(0, 86_400_000, 60_000), "raw"),  # subquery
        ("avg_over_time(x[30d])", Grid(0, 0, 1), "1h"),  # an instant query reaching far
        ("x - avg_over_time(x[30d])", Grid(0, 0, 1), "1m"),
    ],
)
def test_tier_choice(query: str, grid: Grid, tier: str) -> None:
    assert resolution.choose(parse(query), grid, 6 * 3_600_000) == tier


def test_answers_are_json_prometheus_clients_parse(client: TestClient) -> None:
    got = client.get(f"{API}/query", params={"query": f"{POWER} / 3", "time": NOW})
    values = [r["value"][1] for r in json.loads(got.text)["data"]["result"]]
    assert all(float(v) == float(v) for v in values)


def test_alerts_incidents_and_findings_are_series(store: Store, clock: Clock) -> None:
    """ALERTS, hbmwatch_incident_open and hbmwatch_findings_open over the alerting tables:
    present while the row is in its state, gone at once when it is resolved."""
    alerting, incident_id = open_incident(store, clock)
    opened = clock()
    clock.advance(600)
    with TestClient(create_app(settings_for(store), store)) as c:

        def instant(query: str, at: float) -> list[dict]:
            got = c.get(f"{API}/query", params={"query": query, "time": at})
            assert got.status_code == 200, got.text
            return got.json()["data"]["result"]

        (incident,) = instant("hbmwatch_incident_open", clock())
        assert incident["metric"]["incident_id"] == incident_id
        assert incident["metric"]["state"] == "open" and incident["metric"]["cluster"] == "c0"
        alerts = instant('ALERTS{alertstate="firing"}', clock())
        assert {a["metric"]["incident"] for a in alerts} == {incident_id}
        assert {a["metric"]["muted"] for a in alerts} == {"false"}
        counted = instant("sum by (kind) (hbmwatch_findings_open)", clock())
        assert counted[0]["value"][1] == "2"
        assert instant("hbmwatch_incident_open", opened - 60) == []
        names = c.get(f"{API}/label/__name__/values").json()["data"]
        assert {"ALERTS", "hbmwatch_incident_open", "hbmwatch_findings_open"} <= set(names)
        ids = c.get(f"{API}/label/incident_id/values").json()["data"]
        assert ids == [incident_id]

        alerting.resolve(incident_id, "ci")
        resolved = clock()
        clock.advance(60)
        assert instant("hbmwatch_incident_open", resolved + 1) == []  # no 5-minute tail
        assert len(instant("hbmwatch_incident_open", resolved - 1)) == 1
        span = {"query": "count(hbmwatch_incident_open)", "start": opened,
                "end": resolved + 60, "step": 60}  # fmt: skip
        values = c.get(f"{API}/query_range", params=span).json()["data"]["result"][0]["values"]
        assert float(values[0][0]) == opened and float(values[-1][0]) <= resolved


def test_grafana_side_calls_answer_empty_or_from_alerting(sqlite_store: Store, clock: Clock):
    store = sqlite_store
    open_incident(store, clock)
    with TestClient(create_app(settings_for(store), store)) as c:
        assert c.post(f"{API}/query_exemplars", data={"query": POWER}).json()["data"] == []
        assert c.get(f"{API}/rules").json()["data"] == {"groups": []}
        alerts = c.get(f"{API}/alerts").json()["data"]["alerts"]
    assert len(alerts) == 2 and {a["state"] for a in alerts} <= {"pending", "firing"}
    assert all(a["activeAt"].endswith("+00:00") for a in alerts)
