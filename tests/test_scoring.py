"""Scoring against hand-built ground truth: each definition of ``hbmwatch.evaluation.scoring``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from hbmwatch.detectors.base import make_finding
from hbmwatch.evaluation.scoring import group_incidents, healthy_gpu_hours, score
from hbmwatch.records import Finding, RankedCause, Severity
from hbmwatch.taxonomy import Cause

T0 = 1_800_000_000.0
SPECS = {
    "degraded_stack": (["thermal_excursion"], "thermal"),
    "coolant_degradation": (["thermal_excursion", "throttle", "p99_regression"], "cooling"),
    "noisy_neighbour": (["p99_regression"], "co_tenant"),
    "stuck_sensor": (["data_quality"], "sensor"),
}


@dataclass
class Run:
    truth: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    scenario: str = "test"
    seed: int = 0
    simulated_seconds: float = 3600.0


def fault(kind: str, gpus: list[tuple[str, str]], onset: float = 600, end: float = 1800,
          rack: str = "r1", i: int = 0) -> dict[str, Any]:  # fmt: skip
    expected, cause = SPECS[kind]
    return {
        "id": f"fault-{i}", "kind": kind, "onset_unix": T0 + onset, "end_unix": T0 + end,
        "affected_gpus": [{"cluster": "c", "rack": rack, "host": h, "gpu": g} for h, g in gpus],
        "affected_services": ["svc-a"], "affected_jobs": [],
        "expected_findings": expected, "expected_root_cause": cause,
    }  # fmt: skip


def truth(*faults: dict[str, Any], gpus: int = 64, evaluated_s: float = 3600) -> dict[str, Any]:
    return {"start_unix": T0, "gpus": gpus, "evaluated_s": evaluated_s, "faults": list(faults)}


def finding(kind: str, entity: dict[str, str], started: float, raised: float | None = None,
            ended: float | None = None, causes: tuple[str, ...] = ()) -> Finding:  # fmt: skip
    raised = started if raised is None else raised
    return make_finding(
        kind=kind, detector="test", entity={"cluster": "c", **entity}, severity=Severity.WARNING,
        summary="", started_ms=int((T0 + started) * 1000), raised_ms=int((T0 + raised) * 1000),
        updated_ms=int((T0 + (ended or raised)) * 1000),
        ended_ms=None if ended is None else int((T0 + ended) * 1000),
        causes=[RankedCause(c, 1.0 / (i + 1)) for i, c in enumerate(causes)],
    )  # fmt: skip


GPU = {"rack": "r1", "host": "n1", "gpu": "3"}
STACK = fault("degraded_stack", [("n1", "3")])


def test_detected_with_delay_from_raised_minus_onset() -> None:
    f = finding("thermal_excursion", GPU, started=610, raised=625, causes=("thermal",))
    report = score([Run(truth(STACK), [f])])
    k = report.kinds["degraded_stack"]
    assert (k.n, k.detected, k.recall) == (1, 1, 1.0)
    assert report.faults[0].delay_s == pytest.approx(25.0)
    assert k.delay_median_s == pytest.approx(25.0)
    assert report.false_incidents == 0


def test_delay_is_clipped_at_zero_and_uses_earliest_raised() -> None:
    early = finding("thermal_excursion", GPU, started=580, raised=590, causes=("thermal",))
    late = finding("thermal_excursion", GPU, started=700, raised=720, causes=("thermal",))
    report = score([Run(truth(STACK), [late, early])])
    assert report.faults[0].delay_s == 0.0


def test_missed_when_no_finding_or_wrong_kind() -> None:
    wrong_kind = finding("pcie_errors", GPU, started=620)
    report = score([Run(truth(STACK), [wrong_kind])])
    assert report.kinds["degraded_stack"].recall == 0.0
    assert report.faults[0].detected is False and report.faults[0].delay_s is None
    assert report.checks["recall:degraded_stack"] is False and not report.passed


def test_wrong_entity_is_missed_and_false() -> None:
    other_gpu = finding("thermal_excursion", {**GPU, "gpu": "4"}, started=620)
    other_cluster = finding("thermal_excursion", {**GPU, "cluster": "d"}, started=620)
    report = score([Run(truth(STACK), [other_gpu, other_cluster])])
    assert report.kinds["degraded_stack"].detected == 0
    assert report.false_incidents == 2  # different clusters: different places


@pytest.mark.parametrize(
    ("started", "hit"), [(569, False), (571, True), (1859, True), (1861, False)]
)
def test_detection_window_is_onset_minus_30_to_end_plus_60(started: float, hit: bool) -> None:
    f = finding("thermal_excursion", GPU, started=started)
    assert score([Run(truth(STACK), [f])]).faults[0].detected is hit


def test_rack_level_finding_matches_rack_of_affected_gpus() -> None:
    coolant = fault("coolant_degradation", [("n1", str(g)) for g in range(8)])
    same_rack = finding("thermal_excursion", {"rack": "r1"}, started=650, causes=("cooling",))
    assert score([Run(truth(coolant), [same_rack])]).faults[0].detected
    other_rack = finding("thermal_excursion", {"rack": "r2"}, started=650, causes=("cooling",))
    assert not score([Run(truth(coolant), [other_rack])]).faults[0].detected


def test_workload_finding_matches_by_placement_or_service() -> None:
    noisy = fault("noisy_neighbour", [("n1", "3")])
    placed = finding("p99_regression", {**GPU, "service": "svc-z", "phase": "e2e"}, 650)
    by_service = finding("p99_regression", {"service": "svc-a", "phase": "e2e"}, 650)
    assert score([Run(truth(noisy), [placed])]).faults[0].detected
    assert score([Run(truth(noisy), [by_service])]).faults[0].detected


def test_consequences_are_not_false_but_data_quality_needs_a_sensor_fault() -> None:
    throttle = finding("throttle", GPU, started=700)  # not expected, but on the faulty GPU
    outlier = finding("fleet_outlier", GPU, started=300, raised=600)  # started: window start
    sensor = finding("data_quality", GPU, started=700)
    report = score([Run(truth(STACK), [throttle, outlier, sensor])])
    assert report.false_incidents == 1 and report.incidents == [[sensor.id]]
    stuck = fault("stuck_sensor", [("n1", "3")], i=1)
    report = score([Run(truth(STACK, stuck), [throttle, outlier, sensor])])
    assert report.false_incidents == 0
    assert report.kinds["stuck_sensor"].recall == 1.0


def test_fleet_outlier_on_healthy_gpu_is_false() -> None:
    outlier = finding("fleet_outlier", {**GPU, "host": "n7"}, started=700)
    assert score([Run(truth(STACK), [outlier])]).false_incidents == 1


def test_false_findings_group_by_host_or_rack_within_five_minutes() -> None:
    a = finding("thermal_excursion", {"rack": "r5", "host": "n9", "gpu": "0"}, 100, ended=200)
    b = finding("throttle", {"rack": "r5", "host": "n9", "gpu": "1"}, 450)  # same host, 250 s
    c = finding("thermal_excursion", {"rack": "r5"}, 700)  # same rack, 250 s after b
    d = finding("thermal_excursion", {"rack": "r6", "host": "n20", "gpu": "0"}, 460)  # elsewhere
    e = finding("thermal_excursion", {"rack": "r5", "host": "n9", "gpu": "0"}, 2000)  # later
    groups = group_incidents([a, b, c, d, e])
    assert sorted(sorted(f.id for f in g) for g in groups) == sorted(
        [sorted([a.id, b.id, c.id]), [d.id], [e.id]]
    )
    report = score([Run(truth(gpus=10, evaluated_s=3600), [a, b, c, d, e])])
    assert report.false_incidents == 3
    assert report.healthy_gpu_hours == pytest.approx(10.0)
    assert report.false_per_1000_gpu_h == pytest.approx(300.0)
    assert report.checks["false_incidents"] is False


def test_healthy_hours_subtract_faulty_time_once_per_gpu() -> None:
    # Two overlapping faults on one GPU (600-1800 and 1200-2400 s): 1,800 s faulty, once.
    t = truth(STACK, fault("degraded_stack", [("n1", "3")], 1200, 2400, i=1), gpus=2)
    assert healthy_gpu_hours(t, 3600) == pytest.approx((2 * 3600 - 1800) / 3600)
    # A fault that runs past the evaluated time counts only up to it.
    t = truth(fault("degraded_stack", [("n1", "3")], 3000, 9000), gpus=1)
    assert healthy_gpu_hours(t, 3600) == pytest.approx(3000 / 3600)


def test_root_cause_prefers_regression_and_counts_top3() -> None:
    coolant = fault("coolant_degradation", [("n1", str(g)) for g in range(8)])
    heat = finding("thermal_excursion", {"rack": "r1"}, 620, causes=("cooling",))
    p99 = finding("p99_regression", {**GPU, "service": "svc-a"}, 700,
                  causes=("power_cap", "ambient", "cooling"))  # fmt: skip
    out = score([Run(truth(coolant), [heat, p99])]).faults[0]
    assert out.finding_id == p99.id
    assert (out.top1, out.top3) == (False, True)
    out = score([Run(truth(coolant), [heat])]).faults[0]  # no regression: the thermal one
    assert (out.top1, out.top3) == (True, True)


def test_hbm_thermal_throttle_counts_as_thermal_but_cooling_does_not() -> None:
    hbm = finding("thermal_excursion", GPU, 620, causes=(Cause.HBM_THERMAL_THROTTLE,))
    assert score([Run(truth(STACK), [hbm])]).top1 == 1.0
    cooling = finding("thermal_excursion", GPU, 620, causes=("cooling", "x", "y", "thermal"))
    report = score([Run(truth(STACK), [cooling])])
    assert (report.top1, report.top3) == (0.0, 0.0)
    assert report.checks["top1"] is False


def test_noisy_neighbour_control() -> None:
    noisy = [fault("noisy_neighbour", [("n1", str(g))], i=g) for g in range(4)]
    blamed = finding("p99_regression", {**GPU, "gpu": "0"}, 650, causes=("thermal", "co_tenant"))
    right = finding("p99_regression", {**GPU, "gpu": "1"}, 650, causes=("co_tenant",))
    none = finding("p99_regression", {**GPU, "gpu": "2"}, 650, causes=("none",))
    report = score([Run(truth(*noisy), [blamed, right, none])])
    assert report.noisy_control == pytest.approx(0.75)  # gpu 3 was missed, not blamed
    assert report.kinds["noisy_neighbour"].recall == pytest.approx(0.75)
    assert report.checks["noisy_control"] is False


def test_recall_and_delays_pool_over_runs_and_thermal_kinds() -> None:
    runs = [
        Run(truth(STACK), [finding("thermal_excursion", GPU, 600 + d, causes=("thermal",))])
        for d in (10, 20, 30, 100)
    ] + [Run(truth(STACK), [])]
    report = score(runs)
    k = report.kinds["degraded_stack"]
    assert (k.n, k.detected, k.recall) == (5, 4, 0.8)
    assert k.delay_median_s == pytest.approx(25.0)
    assert report.thermal_delay_median_s == pytest.approx(25.0)
    assert k.delay_p95_s == pytest.approx(89.5)
    assert report.checks["thermal_median_delay"] is True


def test_report_json_and_table() -> None:
    f = finding("thermal_excursion", GPU, 610, causes=("thermal",))
    report = score([Run(truth(STACK), [f])])
    data = json.loads(json.dumps(report.to_json()))
    assert data["passed"] is True and data["kinds"]["degraded_stack"]["recall"] == 1.0
    assert data["checks"]["noisy_control"] is None  # no noisy fault: no verdict
    assert report.table().row_count == len(report.rows()) == 6
    assert report.rows()[0][:3] == ("degraded_stack", "1", "100%")


def test_a_training_jobs_regression_matches_a_fault_on_any_of_its_hosts() -> None:
    """A job spans hosts; its step time is exported with one host's label (rank 0's):
    a fault on another of its GPUs still explains it, and only a job it affects."""
    from hbmwatch.evaluation.scoring import entity_matches, fault_truth

    truth = fault_truth({
        "id": "f", "kind": "fabric_link_degradation", "onset_unix": 0, "end_unix": 1,
        "affected_gpus": [{"cluster": "c0", "rack": "r0", "host": "r0-node1", "gpu": "5"}],
        "affected_jobs": ["train"],
    })  # fmt: skip
    job = {"cluster": "c0", "rack": "r0", "host": "r0-node0", "service": "train",
           "phase": "step"}  # fmt: skip
    assert entity_matches(job, truth)
    assert not entity_matches({**job, "service": "other-job"}, truth)
    assert not entity_matches({"cluster": "c0", "host": "r0-node0", "gpu": "1"}, truth)
