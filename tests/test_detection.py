"""The detection runner on real stores: findings persisted, state kept across a restart."""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.base import make_finding
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.signals import WATCHED_METRICS, route
from hbmwatch.records import Evidence, RankedCause, Sample, SeriesKey, Severity
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import Cause, FindingKind
from tests.conftest import Clock

GPU = {"cluster": "c", "rack": "r0", "host": "n1", "gpu": "0", "sku": "H200", "vendor": "nvidia"}


def write_seconds(store: Store, clock: Clock, seconds: int, temp: float, start: int = 0) -> None:
    """One GPU's memory temperature, power and bandwidth, one sample a second."""
    rng = np.random.default_rng(start)
    t0 = int(clock() * 1000)
    samples = []
    for i in range(seconds):
        ts = t0 + i * 1000
        samples += [
            Sample(SeriesKey("gpu_memory_temperature_celsius", GPU), ts,
                   float(round(temp + rng.normal(0, 0.3)))),
            Sample(SeriesKey("gpu_power_watts", GPU), ts, 400.0 + rng.normal(0, 3)),
            Sample(SeriesKey("gpu_memory_bandwidth_utilization_ratio", GPU), ts, 0.5),
        ]  # fmt: skip
    store.write(samples)
    clock.advance(seconds)


def runner(store: Store, clock: Clock) -> DetectionRunner:
    r = DetectionRunner(store, default_detectors(), settle_seconds=0, backfill_seconds=60,
                        context=Context(), clock=clock)  # fmt: skip
    r.start()
    return r


def test_findings_persist_and_a_restart_keeps_the_baseline(store: Store, clock: Clock) -> None:
    first = runner(store, clock)
    for _ in range(5):  # five minutes of a steady 50 C: the baseline
        write_seconds(store, clock, 60, 50.0)
        first.cycle()
    assert store.findings.query() == []
    first.save_state()

    # A new runner (a restart) loads the baseline and catches the excursion at once,
    # where a cold one would still be warming up.
    second = runner(store, clock)
    write_seconds(store, clock, 60, 65.0, start=1)
    report = second.cycle()
    opened = [f for f in report.opened if f.kind == FindingKind.THERMAL_EXCURSION]
    assert len(opened) == 1 and opened[0].entity["host"] == "n1"
    stored = store.findings.query(open_only=True, kind=FindingKind.THERMAL_EXCURSION)
    assert [f.id for f in stored] == [opened[0].id]
    assert store.findings.get(opened[0].id) == stored[0]
    assert stored[0].evidence[0].series.startswith("gpu_memory_temperature_celsius{")

    # Without the saved state a hot minute opens nothing: the detectors are warming up.
    cold = DetectionRunner(store, default_detectors(), settle_seconds=0, backfill_seconds=60,
                           context=Context(), clock=clock)  # fmt: skip
    store.watch(WATCHED_METRICS)
    write_seconds(store, clock, 60, 65.0, start=2)
    assert cold.cycle().opened == []


def test_finding_log_round_trips_and_filters(store: Store) -> None:
    f = make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency",
        entity={"cluster": "c", "rack": "r0", "host": "n1", "gpu": "0", "service": "chat"},
        severity=Severity.CRITICAL, summary="p99 3x", started_ms=1_000, raised_ms=2_000,
        updated_ms=3_000,
        evidence=[Evidence("workload_latency_seconds{quantile=\"0.99\"}", "ratio", 3.0, 1.5)],
        causes=[RankedCause(Cause.CO_TENANT, 0.7,
                            (Evidence("bw", "mean", 0.09, 0.05, lag_seconds=5.0),),
                            "no thermal cause")],
    )  # fmt: skip
    other = make_finding(
        kind=FindingKind.THERMAL_EXCURSION, detector="thermal", entity={"rack": "r9"},
        severity=Severity.WARNING, summary="rack", started_ms=5_000, raised_ms=5_000,
        updated_ms=6_000, ended_ms=7_000,
    )  # fmt: skip
    assert store.findings.save([f, other]) == 2
    assert store.findings.get(f.id) == f
    assert [x.id for x in store.findings.query()] == [other.id, f.id]  # newest first
    assert [x.id for x in store.findings.query(open_only=True)] == [f.id]
    assert [x.id for x in store.findings.query(host="n1")] == [f.id]
    assert [x.id for x in store.findings.query(rack="r9")] == [other.id]
    assert store.findings.query(since_ms=8_000, kind=FindingKind.THERMAL_EXCURSION) == []
    updated = make_finding(
        kind=f.kind, detector=f.detector, entity=f.entity, severity=f.severity,
        summary="p99 back", started_ms=1_000, raised_ms=2_000, updated_ms=9_000, ended_ms=9_000,
    )  # fmt: skip
    store.findings.save([updated])
    assert store.findings.get(f.id).ended_ms == 9_000  # updated in place, same id
    assert len(store.findings.query()) == 2


def test_the_store_hands_the_runner_only_the_series_it_reads(store: Store, clock: Clock) -> None:
    read = SeriesKey("gpu_memory_temperature_celsius", GPU)
    ignored = SeriesKey("gpu_clock_hertz", {**GPU, "domain": "soc"})  # watched metric, no route
    other = SeriesKey("gpu_memory_used_bytes", GPU)  # a metric no detector reads
    store.watch(WATCHED_METRICS, wants=lambda key: route(key) is not None)
    now = int(clock() * 1000)
    store.write([Sample(k, now, 1.0) for k in (read, ignored, other)])
    cursor, fresh = store.read_new(0, now - 1000)  # from memory
    restarted, again = store.read_new(None, now - 1000)  # from SQL, as after a restart
    for block in (fresh, again):
        assert {store.key_of(int(s)) for s in block.series_ids} == {read}
    assert cursor == restarted


def test_samples_held_past_a_cycle_come_back_once_in_front(store: Store, clock: Clock) -> None:
    """Samples newer than a cycle's end wait for the next cycle, which reads them from the
    store's feed in front of the new ones: every counter sample is differenced once."""
    r = DetectionRunner(store, default_detectors(), settle_seconds=2, backfill_seconds=60,
                        context=Context(), clock=clock)  # fmt: skip
    r.start()
    key = SeriesKey("gpu_pcie_replays_total", GPU)
    t0 = int(clock() * 1000)
    for part in range(3):
        seconds = range(part * 30, part * 30 + 30)
        store.write([Sample(key, t0 + i * 1000, 10.0 * i) for i in seconds])
        clock.advance(30)
        report = r.cycle()
        assert r.last_frame is not None and report.end_ms == t0 + (part * 30 + 28) * 1000
        replays = r.last_frame.g("pcie_replays")[0]
        if part == 0:  # from SQL (a start): the first sample has nothing before it
            assert np.isnan(replays[0]) and (replays[1:] == 10.0).all()
        else:  # from memory: the two held back, then the new ones
            assert report.samples == 32 and replays.tolist() == [10.0] * 30
