"""``/metrics`` and ``/readyz`` from the service's status: derived signals, counts, health."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.api.main import create_app
from hbmwatch.detectors.frame import Entities
from hbmwatch.metrics import EXPORTED
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.skus import lookup
from hbmwatch.status import ServiceStatus, snapshot_from_frame
from hbmwatch.store.store import Store
from tests.conftest import Clock
from tests.test_api import open_incident, settings_for
from tests.test_detect_thermal import SKU, make_frame


def scrape(client: TestClient) -> dict[str, list]:
    text = client.get("/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def frame_with_scores():
    mem = np.array([[70.0, 71.0, np.nan], [80.0, np.nan, np.nan]])
    f = make_frame(0, {"mem_temp": mem, "hot_temp": np.full((2, 3), 60.0)})
    f.scores["thermal"] = np.array([[0.1, 0.2, 0.3], [0.5, np.nan, np.nan]])
    f.scores["latency"] = np.array([[9.0, 9.0, 9.0]])  # a workload table: not per GPU
    f.workloads = Entities()
    f.workloads.add("chat/e2e", {"service": "chat", "phase": "e2e", "quantile": "0.99"})
    f.wl["p99"] = np.array([[0.2, 0.3, np.nan]])
    return f


def test_snapshot_takes_each_rows_newest_finite_value() -> None:
    snap = snapshot_from_frame(frame_with_scores())
    limit = lookup(SKU).memory_slowdown_c
    memory = {
        m.labels["gpu"]: m.value for m in snap.thermal_margin if m.labels["sensor"] == "memory"
    }
    assert memory == {"0": limit - 71.0, "1": limit - 80.0}
    assert {(s.labels["gpu"], s.labels["detector"], s.value) for s in snap.anomaly_score} == {
        ("0", "thermal", 0.3),
        ("1", "thermal", 0.5),
    }
    assert [(p.labels, p.value) for p in snap.latency_p99] == [
        ({"cluster": "", "service": "chat", "model": "", "phase": "e2e"}, 0.3)
    ]


def test_metrics_serves_every_exported_family_with_values(store: Store, clock: Clock) -> None:
    status = ServiceStatus(clock=clock)
    status.record_cycle(0.42, snapshot_from_frame(frame_with_scores()))
    app = create_app(settings_for(store), store, status=status)
    open_incident(store, clock)
    store.write([Sample(SeriesKey("hbmwatch_target_up", {"target": "n1:9400", "host": "n1"}),
                        int(clock() * 1000), 0.0)])  # fmt: skip
    with TestClient(app) as client:
        families = scrape(client)
    for name, definition in EXPORTED.items():
        assert name.removesuffix("_total") in families, name
        assert definition.help
    assert families["hbmwatch_detection_cycle_seconds"][0].value == 0.42
    margin = families["hbmwatch_gpu_thermal_margin_celsius"]
    assert {s.labels["sku"] for s in margin} == {SKU} and len(margin) == 4
    assert [(s.labels, s.value) for s in families["hbmwatch_findings_open"]] == [
        ({"kind": "thermal_excursion", "severity": "critical"}, 2.0)
    ]
    (incidents,) = families["hbmwatch_incidents_open"]
    assert incidents.labels == {"severity": "critical", "kind": "thermal_excursion",
                                "state": "open"} and incidents.value == 1  # fmt: skip
    assert sum(s.value for s in families["hbmwatch_alerts"]) == 2
    (up,) = families["hbmwatch_target_up"]
    assert up.labels == {"host": "n1", "target": "n1:9400"} and up.value == 0
    lag = families["hbmwatch_detection_lag_seconds"][0].value
    assert lag == pytest.approx(clock() - 0.003)  # the frame ended at 3 ms after the epoch


def test_readyz_fails_when_the_collector_stalls_or_detection_falls_behind(
    store: Store, clock: Clock
) -> None:
    status = ServiceStatus(clock=clock, started_at=clock(), collector_interval_seconds=1.0,
                           collector_last_round_ms=lambda: int(clock() * 1000) - 3_000,
                           detection_interval_seconds=5.0)  # fmt: skip
    with TestClient(create_app(settings_for(store), store, status=status)) as client:
        assert client.get("/readyz").status_code == 200
        clock.advance(200)  # no detection cycle yet after 200 s
        body = client.get("/readyz").json()
        assert body["checks"]["detection"] == "no detection cycle in 200 s"
        status.collector_last_round_ms = lambda: int((clock() - 60) * 1000)
        status.record_cycle(0.5, snapshot_from_frame(frame_with_scores()))  # frame at epoch
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["collector"] == "last scrape round 60 s ago"
        assert r.json()["checks"]["detection"].startswith("detection ")
