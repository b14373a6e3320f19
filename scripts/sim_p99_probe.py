"""The p99 of a fault's first affected service before and during the fault, from the
simulator alone (no collector, store or detectors): does the fault move the p99 at all?

    python scripts/sim_p99_probe.py power_cap_regression 202 1795402740 ttft

Arguments: a bundled scenario (or file), a seed, the run's start (unix seconds, as
``hbmwatch eval --json`` reports it) and a phase (ttft, inter_token or e2e). Prints the
median of per-minute p99s (at bucket resolution) before the onset and during the fault.
"""

from __future__ import annotations

import sys

import numpy as np

from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import load_scenario


def p99(counts: np.ndarray, edges: np.ndarray) -> float:
    """The upper edge of the bucket holding the 99th percentile of one minute's counts."""
    cum = np.cumsum(counts)
    if cum[-1] == 0:
        return float("nan")
    return float(edges[min(int(np.searchsorted(cum, 0.99 * cum[-1])), len(edges) - 1)])


def main(name: str, seed: int, start: float, phase: str) -> None:
    scenario = load_scenario(name)
    sim = Simulation(scenario, seed=seed, start_unix=start)
    fault = sim.ground_truth()["faults"][0]
    service = next(i for i, s in enumerate(sim.fleet.services)
                   if s.name == fault["affected_services"][0])  # fmt: skip
    edges = sim.workloads.buckets[phase]
    onset, end = fault["onset_unix"] - start, fault["end_unix"] - start
    before, during = [], []
    prev = sim.workloads.counts[phase][service].copy()
    while sim.t < min(end, scenario.duration):
        sim.advance_to(sim.t + 60)
        cur = sim.workloads.counts[phase][service].copy()
        value = p99(cur - prev, edges)
        if 120 < sim.t <= onset:
            before.append(value)
        elif onset + 60 < sim.t <= end:
            during.append(value)
        prev = cur
    load = sim.workloads.load(start + onset)
    b, d = float(np.nanmedian(before)), float(np.nanmedian(during))
    print(
        f"{name} seed {seed}, {phase} p99 of {fault['affected_services'][0]} at load "
        f"{load:.2f}: {b:.3f} s before, {d:.3f} s during {fault['kind']} ({d / b:.2f}x)"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
