"""Alerts and incidents name the workloads on their GPUs (SQLite and PostgreSQL)."""

from __future__ import annotations

from hbmwatch.records import Sample, SeriesKey, Workload
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from tests.conftest import Clock
from tests.test_alerting import alerting, ms, stated
from tests.test_alerts_engine import gpu

LLAMA = Workload(namespace="ml", pod="llama-7b-5d9f", container="vllm", host="n1", gpu="0",
                 cluster="c0")  # fmt: skip
JOB = Workload(job="4242", host="n1", gpu="1", cluster="c0")


def _attribute(store: Store, clock: Clock) -> None:
    """What the collector writes for n1: a vLLM pod on GPU 0, a Slurm job on GPU 1."""
    place = {"cluster": "c0", "rack": "r0", "host": "n1"}
    keys = [
        SeriesKey("gpu_workload_info", {**place, "gpu": "0", "namespace": "ml",
                                        "pod": "llama-7b-5d9f", "container": "vllm"}),
        SeriesKey("gpu_workload_info", {**place, "gpu": "1", "job": "4242"}),
        SeriesKey("gpu_workload_info", {**place, "host": "n2", "gpu": "0", "pod": "elsewhere"}),
    ]  # fmt: skip
    now = ms(clock)
    store.write([Sample(k, now - s * 1000, 1.0) for k in keys for s in range(30, 0, -5)])


def test_an_alert_names_the_workloads_and_the_incident_keeps_their_union(
    store: Store, clock: Clock
) -> None:
    _attribute(store, clock)
    svc = alerting(store)
    fa = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 0))
    svc.process([fa])
    (alert,) = store.alerts.alerts()
    assert alert.annotations["workloads"] == "ml/llama-7b-5d9f (vllm)"
    (inc,) = store.alerts.incidents()
    assert inc.workloads == (LLAMA,)

    clock.advance(5)
    fb = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 1))
    svc.process([fa, fb])  # the host's other GPU joins the incident: its job is named too
    (inc,) = store.alerts.incidents()
    assert set(inc.workloads) == {LLAMA, JOB}
    job_alert = next(a for a in store.alerts.alerts() if a.labels["gpu"] == "1")
    assert job_alert.annotations["workloads"] == "job 4242"

    restarted = alerting(store)  # the workloads are stored with the incident
    assert set(restarted.engine.incidents[inc.id].workloads) == {LLAMA, JOB}
    assert [i.id for i in store.alerts.incidents(workload={"pod": "llama-7b-5d9f"})] == [inc.id]
    assert [i.id for i in store.alerts.incidents(workload={"job": "4242"})] == [inc.id]
    assert store.alerts.incidents(workload={"pod": "elsewhere"}) == []
    assert store.alerts.incidents(workload={"namespace": "ml", "job": "4242"}) == []


def test_without_attribution_alerts_carry_no_workloads(store: Store, clock: Clock) -> None:
    svc = alerting(store)
    svc.process([stated(clock, FindingKind.THROTTLE, gpu("r0", "n1", 0))])
    (alert,) = store.alerts.alerts()
    assert "workloads" not in alert.annotations
    (inc,) = store.alerts.incidents()
    assert inc.workloads == ()
    assert store.alerts.incidents(workload={"pod": "x"}) == []


def test_a_host_finding_asks_nothing(store: Store, clock: Clock) -> None:
    _attribute(store, clock)
    svc = alerting(store)
    asked: list[object] = []
    svc.engine.attribution.lookup = lambda *a: asked.append(a) or ()  # type: ignore[func-returns-value]
    host = {"cluster": "c0", "rack": "r0", "host": "n1"}
    svc.process([stated(clock, FindingKind.THERMAL_EXCURSION, host)])
    assert asked == []


def test_without_attribution_a_cycle_asks_the_store_once(store: Store, clock: Clock) -> None:
    svc = alerting(store)
    calls: list[str] = []
    real_any, real_workloads = store.any_workloads, store.workloads
    store.any_workloads = lambda: calls.append("any") or real_any()  # type: ignore[method-assign]
    store.workloads = lambda *a, **k: calls.append("workloads") or real_workloads(*a, **k)  # type: ignore[method-assign]
    svc.process([stated(clock, FindingKind.THROTTLE, gpu("r0", "n1", g)) for g in range(8)])
    assert calls == ["any"]
