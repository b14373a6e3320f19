"""The scenarios of issue 13: each loads, its ground truth lists its faults, and the ones that
judge root cause on a regression make the workload they name regress."""

from __future__ import annotations

import numpy as np
import pytest

from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import load_scenario, scenario_from_dict
from hbmwatch.taxonomy import Cause, FindingKind
from hbmwatch.validation import ConfigError

START = 1_800_000_000.0 - 8 * 3600 + 9 * 3600  # 09:00 UTC, as `hbmwatch eval` starts
P99 = FindingKind.P99_REGRESSION.value
STEP = FindingKind.STEP_TIME_REGRESSION.value

#: scenario -> (fault kind, expected cause, findings the fault must raise), one per fault.
EXPECTED: dict[str, list[tuple[str, Cause, list[str] | None]]] = {
    "power_cap_regression": [("power_cap", Cause.POWER_CAP, [P99])],
    "pcie_regression": [("pcie_replay_storm", Cause.PCIE, [P99])],
    "fabric_regression": [("fabric_link_degradation", Cause.FABRIC, [STEP])],
    "cold_start_under_load": [("power_cap", Cause.POWER_CAP, [P99])],
    "two_faults_one_rack": [
        ("degraded_stack", Cause.THERMAL, None),
        ("noisy_neighbour", Cause.CO_TENANT, None),
    ],
    "diurnal_power_day": [],
    "short_sharp_regressions": [
        ("pcie_replay_storm", Cause.PCIE, [P99]),
        ("power_cap", Cause.POWER_CAP, [P99]),
        ("pcie_replay_storm", Cause.PCIE, [P99]),
    ],
    "bandwidth_contention": [("noisy_neighbour", Cause.CO_TENANT, None)],
}


def truth_of(name: str) -> dict:
    return Simulation(load_scenario(name), start_unix=START).ground_truth()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scenario_loads_and_its_truth_lists_the_faults(name: str) -> None:
    truth = truth_of(name)
    faults = truth["faults"]
    assert [(f["kind"], f["expected_root_cause"]) for f in faults] == [
        (kind, cause.value) for kind, cause, _ in EXPECTED[name]
    ]
    for f, (_, _, expect) in zip(faults, EXPECTED[name], strict=True):
        assert f["affected_gpus"] and f["onset_unix"] < f["end_unix"]
        if expect is None:  # the kind's own findings
            assert len(f["expected_findings"]) >= 1 and f["regressing_workloads"] == []
            continue
        # Judged on the regression alone: its ranking, not the throttle or link's label.
        assert f["expected_findings"] == expect
        wanted = f["affected_services"] if expect == [P99] else f["affected_jobs"]
        assert f["regressing_workloads"] == wanted and wanted


def test_the_diurnal_day_is_a_whole_day_without_faults() -> None:
    scenario = load_scenario("diurnal_power_day")
    assert scenario.duration == 86_400 and scenario.faults == []


def test_two_faults_share_a_rack_and_differ_in_cause() -> None:
    faults = truth_of("two_faults_one_rack")["faults"]
    racks = [{g["rack"] for g in f["affected_gpus"]} for f in faults]
    hosts = [{g["host"] for g in f["affected_gpus"]} for f in faults]
    assert racks[0] == racks[1] == {"r0"} and hosts[0] != hosts[1]
    assert faults[0]["onset_unix"] < faults[1]["onset_unix"] < faults[0]["end_unix"]


def p99_ttft(sim: Simulation, service: str, seconds: int) -> float:
    """The service's time-to-first-token p99 (a bucket bound) over the next ``seconds``."""
    w = sim.workloads
    i = next(n for n, s in enumerate(sim.fleet.services) if s.name == service)
    before = w.counts["ttft"][i].copy()
    sim.advance_to(sim.t + seconds)
    counts = w.counts["ttft"][i] - before
    k = int(np.searchsorted(np.cumsum(counts), 0.99 * counts.sum()))
    return float(w.buckets["ttft"][min(k, len(w.buckets["ttft"]) - 1)])


@pytest.mark.parametrize("name", ["power_cap_regression", "pcie_regression"])
def test_the_named_workload_regresses(name: str) -> None:
    sim = Simulation(load_scenario(name), start_unix=START)
    fault = sim.ground_truth()["faults"][0]
    service = fault["regressing_workloads"][0]
    onset = fault["onset_unix"] - START
    sim.advance_to(onset - 120)
    before = p99_ttft(sim, service, 120)
    after = p99_ttft(sim, service, 120)
    assert after >= 2.5 * before, (before, after)


def test_healthy_gpus_throttle_on_power_at_the_peak_of_the_day() -> None:
    scenario = load_scenario("diurnal_power_day")
    sim = Simulation(scenario, start_unix=scenario.start.timestamp() + 15 * 3600)  # 15:00
    sim.advance_to(120)
    power = sim.physics.throttle_s[:, 0]
    assert (power > 30).mean() >= 0.25  # many healthy GPUs throttled most of those 2 minutes


def test_bad_expect_names_the_field() -> None:
    data = {
        "name": "t",
        "duration": "10m",
        "racks": [{"name": "r0", "nodes": 1, "sku": "H200"}],
        "faults": [
            {"kind": "power_cap", "target": {"host": "r0-node0", "gpu": 1}, "onset": 60,
             "expect": ["p99_regresion"]}
        ],
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"faults\[0\]\.expect\[0\]"):
        scenario_from_dict(data)
