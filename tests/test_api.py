"""The REST API over a real store: queries, triage, silences, ingest, auth and errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.main import create_app
from hbmwatch.query import parse_selector
from hbmwatch.records import Device, Evidence, RankedCause, Sample, SeriesKey, Severity
from hbmwatch.settings import Settings
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from tests.conftest import NOW, Clock
from tests.test_alerting import stated
from tests.test_alerts_engine import gpu

READ, WRITE, ADMIN = "read-token-x", "write-token-x", "admin-token-x"
TEMP = "gpu_memory_temperature_celsius"


def settings_for(store: Store, **api: object) -> Settings:
    tokens = {"read_token": READ, "write_token": WRITE, "admin_token": ADMIN}
    return Settings(store={"url": str(store.engine.url)}, api={**tokens, **api})  # type: ignore[arg-type]


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    app = create_app(settings_for(store), store)
    with TestClient(app) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fill(store: Store, clock: Clock, minutes: int = 10) -> None:
    """Two GPUs' memory temperature at 1 s for ``minutes``, ending at the clock."""
    start_ms = int(clock() * 1000) - minutes * 60_000
    samples = [
        Sample(SeriesKey(TEMP, {**gpu("r0", "n1", g), "gpu": str(g)}), start_ms + i * 1000,
               60.0 + g + (i % 60) / 60)
        for g in (0, 1) for i in range(minutes * 60)
    ]  # fmt: skip
    assert store.write(samples).accepted == len(samples)
    store.upsert_devices([Device("n1", str(g), cluster="c0", rack="r0", sku="MI300X")
                          for g in (0, 1)])  # fmt: skip


# -- reads -------------------------------------------------------------------------------------
def test_devices_filter_page_and_topology(client: TestClient, store: Store) -> None:
    store.upsert_devices(
        [Device(f"n{h}", str(g), cluster="c0", rack=f"r{h % 2}", sku="H200") for h in range(3)
         for g in range(4)]
    )  # fmt: skip
    first = client.get("/api/v1/devices", params={"rack": "r0", "limit": 5}).json()
    assert len(first["items"]) == 5 and first["next_cursor"] == "5"
    rest = client.get("/api/v1/devices", params={"rack": "r0", "cursor": "5"}).json()
    assert len(rest["items"]) == 3 and rest["next_cursor"] is None
    assert {d["host"] for d in first["items"] + rest["items"]} == {"n0", "n2"}
    topo = client.get("/api/v1/topology").json()
    assert topo["gpus"] == 12
    (cluster,) = topo["clusters"]
    assert [r["rack"] for r in cluster["racks"]] == ["r0", "r1"]
    assert cluster["racks"][1]["hosts"] == [{"host": "n1", "gpus": ["0", "1", "2", "3"],
                                            "skus": ["H200"]}]  # fmt: skip
    for cursor in ("abc", "²"):  # '²' passes str.isdigit() and fails int(): was a 500
        bad = client.get("/api/v1/devices", params={"cursor": cursor})
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("cursor")


def test_range_query_by_step_and_rfc3339_times(client: TestClient, store: Store,
                                               clock: Clock) -> None:  # fmt: skip
    fill(store, clock)
    store.compact(now_ms=int(clock() * 1000) + 600_000)
    series = client.get("/api/v1/series", params={"match": f'{TEMP}{{gpu="1"}}'}).json()
    assert [s["labels"]["gpu"] for s in series["items"]] == ["1"]
    body = client.get("/api/v1/query_range", params={
        "query": f'{TEMP}{{host="n1",gpu="0"}}', "start": "2027-01-15T07:50:00Z",
        "end": NOW, "step": "1m", "agg": "max",
    }).json()  # fmt: skip
    assert body["tier"] == "1m" and body["step"] == 60
    (s,) = body["series"]
    assert len(s["points"]) == 10
    assert s["points"][0][0] == NOW - 600 and s["points"][0][1] == pytest.approx(60 + 59 / 60)
    raw = client.get("/api/v1/query_range", params={
        "query": f'{TEMP}{{gpu="0"}}', "start": NOW - 60, "end": NOW, "step": 10, "agg": "min"
    }).json()  # fmt: skip
    assert raw["tier"] == "raw" and len(raw["series"][0]["points"]) == 6


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"query": "bad{", "step": "60"}, "cannot parse selector"),
        ({"query": TEMP, "step": "0"}, "step"),
        ({"query": TEMP, "step": "soon"}, "step"),
        ({"query": TEMP, "start": "yesterday"}, "start"),
        ({"query": TEMP, "start": "2027-01-15T08:00:00"}, "time zone"),
        ({"query": TEMP, "start": str(NOW), "end": str(NOW - 60)}, "must be after"),
        ({"query": TEMP, "start": "0", "end": str(NOW), "step": "1"}, "use a larger step"),
        ({"query": TEMP, "fn": "rate"}, "not a counter"),
        ({"query": TEMP, "agg": "quantile"}, "needs q"),
    ],
)
def test_bad_query_parameters_are_a_400_with_the_reason(
    client: TestClient, params: dict, says: str
) -> None:
    r = client.get("/api/v1/query_range", params=params)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_enum_and_range_violations_are_a_422_naming_the_field(client: TestClient) -> None:
    r = client.get("/api/v1/query_range", params={"query": TEMP, "agg": "mode"})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("query.agg")
    r = client.get("/api/v1/devices", params={"limit": 0})
    assert r.status_code == 422 and "limit" in r.json()["error"]["message"]


def test_latest_leaves_stale_series_out(client: TestClient, store: Store, clock: Clock) -> None:
    fill(store, clock, minutes=2)
    body = client.get("/api/v1/query", params={"query": TEMP, "lookback": "30s"}).json()
    assert sorted(s["labels"]["gpu"] for s in body["series"]) == ["0", "1"]
    clock.advance(120)
    assert client.get("/api/v1/query", params={"query": TEMP, "lookback": "30s"}).json() == {
        "series": []
    }


# -- ingest ------------------------------------------------------------------------------------
def test_ingest_reports_what_it_refused_and_why(client: TestClient, store: Store) -> None:
    ok = {"metric": TEMP, "labels": {"host": "n9", "gpu": "0"}, "timestamp": NOW, "value": 70.0}
    batch = {"samples": [
        ok, {**ok, "timestamp": "2027-01-15T08:00:00Z"},  # the same instant: a duplicate
        {**ok, "metric": "gpu_made_up"}, {**ok, "timestamp": "tomorrow"},
        {**ok, "timestamp": NOW + 86400},
    ]}  # fmt: skip
    r = client.post("/api/v1/ingest/samples", json=batch, headers=bearer(WRITE))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["received"], body["accepted"], body["duplicates"]) == (5, 1, 1)
    assert set(body["rejected"]) == {"unknown_metric", "malformed", "future"}, body
    (stored,) = store.latest(parse_selector(f'{TEMP}{{host="n9"}}'))
    assert stored.value == 70


def test_latencies_and_steps_become_quantiles(client: TestClient, store: Store) -> None:
    window = {"service": "chat", "phase": "e2e", "window_end": NOW,
              "latencies_seconds": [0.1] * 98 + [2.0, 3.0]}  # fmt: skip
    r = client.post("/api/v1/ingest/latencies", json=window, headers=bearer(WRITE))
    assert r.status_code == 200 and r.json()["rejected"] == {}, r.text
    p99 = store.latest(
        parse_selector('workload_latency_seconds{service="chat",quantile="0.99"}'), 60
    )
    assert p99[0].value == pytest.approx(2.01, abs=0.02)
    steps = {"service": "train", "window_end": NOW, "step_seconds": [1.0, 1.1, 0.9]}
    assert client.post("/api/v1/ingest/steps", json=steps, headers=bearer(WRITE)).status_code == 200
    bad = client.post("/api/v1/ingest/latencies", headers=bearer(WRITE),
                      json={**window, "latencies_seconds": [-1.0]})  # fmt: skip
    assert bad.status_code == 422 and "negative" in bad.json()["error"]["message"]


def test_a_body_over_the_limit_is_refused_with_413(store: Store) -> None:
    app = create_app(settings_for(store, max_body_bytes=2048), store)
    with TestClient(app) as c:
        big = {"samples": [{"metric": TEMP, "labels": {"host": "n", "gpu": "0"},
                            "timestamp": NOW, "value": 1.0}] * 100}  # fmt: skip
        r = c.post("/api/v1/ingest/samples", json=big, headers=bearer(WRITE))
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


# -- auth --------------------------------------------------------------------------------------
def test_writes_need_a_write_token_and_reads_may_be_open(client: TestClient) -> None:
    batch = {"samples": []}
    silence = {"matchers": [{"name": "rack", "value": "r0"}], "duration": "1h",
               "created_by": "me", "comment": "maintenance"}  # fmt: skip
    assert client.post("/api/v1/ingest/samples", json=batch).status_code == 401
    assert client.post("/api/v1/silences", json=silence).status_code == 401
    for path, body in (("/api/v1/ingest/samples", batch), ("/api/v1/silences", silence)):
        r = client.post(path, json=body, headers=bearer(READ))
        assert r.status_code == 403 and "needs write" in r.json()["error"]["message"]
    assert client.post("/api/v1/ingest/samples", json=batch,
                       headers=bearer("wrong")).status_code == 401  # fmt: skip
    assert client.post("/api/v1/silences", json=silence, headers=bearer(WRITE)).status_code == 201
    assert client.post("/api/v1/admin/compact", headers=bearer(WRITE)).status_code == 403
    assert client.post("/api/v1/admin/compact", headers=bearer(ADMIN)).status_code == 200
    assert client.get("/api/v1/devices").status_code == 200  # open reads (the default)


def test_closed_reads_need_a_token(store: Store) -> None:
    with TestClient(create_app(settings_for(store, open_reads=False), store)) as c:
        r = c.get("/api/v1/incidents")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/api/v1/incidents", headers=bearer(READ)).status_code == 200
        assert c.get("/api/v1/incidents", headers=bearer(ADMIN)).status_code == 200
        assert c.get("/metrics").status_code == 401
        assert c.get("/healthz").status_code == 200


def test_writes_are_refused_when_no_token_is_configured(store: Store) -> None:
    settings = Settings(store={"url": str(store.engine.url)})  # type: ignore[arg-type]
    with TestClient(create_app(settings, store)) as c:
        r = c.post("/api/v1/ingest/samples", json={"samples": []}, headers=bearer("anything"))
        assert r.status_code == 401


# -- triage ------------------------------------------------------------------------------------
def open_incident(store: Store, clock: Clock) -> tuple[Alerting, str]:
    alerting = Alerting(store, settings_for(store).alerts)
    alerting.start()
    cause = RankedCause("hbm_thermal_throttle", 0.8, (
        Evidence(f'{TEMP}{{gpu="0",host="n1"}}', "rise_c", 9.0, 5.0, lag_seconds=20.0,
                 strength=0.9),
    ), "HBM throttling on n1 GPU 0")  # fmt: skip
    findings = [dataclasses.replace(stated(clock, FindingKind.THERMAL_EXCURSION,
                                           gpu("r0", "n1", g)), causes=(cause,),
                                    severity=Severity.CRITICAL) for g in (0, 1)]  # fmt: skip
    store.findings.save(findings)
    alerting.process(findings)
    (incident,) = store.alerts.incidents()
    return alerting, incident.id


def test_incident_detail_ack_and_resolve(client: TestClient, store: Store, clock: Clock) -> None:
    client.app.state.alerting, incident_id = open_incident(store, clock)  # type: ignore[attr-defined]
    listed = client.get("/api/v1/incidents", params={"state": "open"}).json()["items"]
    assert [i["id"] for i in listed] == [incident_id] and listed[0]["alerts"] == 2
    d = client.get(f"/api/v1/incidents/{incident_id}").json()
    assert d["severity"] == "critical" and d["url"] == f"/incidents/{incident_id}"
    assert {tuple(sorted(e["labels"].items())) for e in d["entities"]} == {
        (("cluster", "c0"), ("gpu", g), ("host", "n1")) for g in ("0", "1")
    }
    assert d["causes"][0]["cause"] == "hbm_thermal_throttle"
    assert d["causes"][0]["evidence"][0]["lag_seconds"] == 20
    link = d["series_to_check"][0]
    assert link["series"] == f'{TEMP}{{gpu="0",host="n1"}}'
    assert client.get(link["query_range"]).status_code == 200
    assert d["timeline"][0]["kind"] == "opened"
    assert len(d["alert_list"]) == 2

    assert client.post(f"/api/v1/incidents/{incident_id}/acknowledge",
                       json={"comment": "looking"}).status_code == 401  # fmt: skip
    ack = client.post(f"/api/v1/incidents/{incident_id}/acknowledge", headers=bearer(WRITE),
                      json={"by": "alice", "comment": "looking"})  # fmt: skip
    assert ack.status_code == 200 and ack.json()["state"] == "acknowledged"
    assert ack.json()["acknowledged_by"] == "alice"
    done = client.post(f"/api/v1/incidents/{incident_id}/resolve", headers=bearer(WRITE))
    assert done.json()["state"] == "resolved"
    d = client.get(f"/api/v1/incidents/{incident_id}").json()
    assert [e["actor"] for e in d["timeline"] if e["kind"] in ("acknowledged", "resolved")] == [
        "alice",
        "api:write",
    ]
    missing = client.post("/api/v1/incidents/nope/resolve", headers=bearer(WRITE))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # a resolved incident cannot be acknowledged (409 with the reason); resolving is idempotent
    again = client.post(f"/api/v1/incidents/{incident_id}/acknowledge", headers=bearer(WRITE))
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "incident_closed"
    assert "is resolved" in again.json()["error"]["message"]
    redo = client.post(f"/api/v1/incidents/{incident_id}/resolve", headers=bearer(WRITE))
    assert redo.status_code == 200 and redo.json()["state"] == "resolved"


def test_alerts_filter_by_state_severity_and_labels(client: TestClient, store: Store,
                                                    clock: Clock) -> None:  # fmt: skip
    client.app.state.alerting, _ = open_incident(store, clock)  # type: ignore[attr-defined]
    everything = client.get("/api/v1/alerts").json()["items"]
    assert len(everything) == 2
    one = client.get("/api/v1/alerts", params={"match": ["gpu=1", "rack=~r.*"]}).json()["items"]
    assert [a["labels"]["gpu"] for a in one] == ["1"]
    assert client.get("/api/v1/alerts", params={"severity": "info"}).json()["items"] == []
    assert client.get("/api/v1/alerts", params={"state": "firing"}).json()["items"]
    bad = client.get("/api/v1/alerts", params={"match": "rack=~("})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("match")
    assert client.get("/api/v1/alerts", params={"state": "burning"}).status_code == 422


def test_silence_create_list_expire(client: TestClient, store: Store, clock: Clock) -> None:
    client.app.state.alerting, _ = open_incident(store, clock)  # type: ignore[attr-defined]
    body = {"matchers": [{"name": "gpu", "value": "1"}], "duration": "2h", "created_by": "bob",
            "comment": "reseating"}  # fmt: skip
    made = client.post("/api/v1/silences", json=body, headers=bearer(WRITE))
    assert made.status_code == 201, made.text
    silence = made.json()
    assert silence["active"] and silence["ends_at"].startswith("2027-01-15T10:00:00")
    muted = client.get("/api/v1/alerts", params={"match": "gpu=1"}).json()["items"][0]
    assert muted["silenced_by"] == [silence["id"]]
    assert [s["id"] for s in client.get("/api/v1/silences").json()] == [silence["id"]]
    gone = client.delete(f"/api/v1/silences/{silence['id']}", headers=bearer(WRITE))
    assert gone.status_code == 200 and not gone.json()["active"]
    assert client.get("/api/v1/silences").json() == []
    assert len(client.get("/api/v1/silences", params={"expired": True}).json()) == 1
    assert client.delete("/api/v1/silences/nope", headers=bearer(WRITE)).status_code == 404
    for wrong, says in (
        ({**body, "ends_at": NOW + 60}, "exactly one"),
        ({**body, "duration": "900h"}, "30 days"),
        ({**body, "matchers": [{"name": "gpu", "value": "(", "op": "=~"}]}, ""),
    ):
        r = client.post("/api/v1/silences", json=wrong, headers=bearer(WRITE))
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
