"""Faults as time-varying effects on the physics, and the ground truth they leave behind.

A fault's intensity is 0 before its onset, rises over its ramp to 1 (linearly unless its
``shape`` says otherwise), stays 1 until its end and is 0 after: what it did to
temperatures then relaxes physically.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hbmwatch.simulator.fleet import MAX_LINKS, MAX_STACKS, Fleet
from hbmwatch.simulator.scenario import FAULT_SPECS, Fault, FaultKind
from hbmwatch.taxonomy import Cause, FindingKind


def intensity(fault: Fault, t: float) -> float:
    """0..1 at ``t`` seconds into the run.

    >>> from hbmwatch.simulator.scenario import Fault, Target
    >>> f = Fault(kind="power_cap", target=Target(host="r0-node0", gpu=1), onset=10, ramp=10,
    ...           end=60)
    >>> [intensity(f, t) for t in (5, 15, 30, 60)]
    [0.0, 0.5, 1.0, 0.0]
    """
    if t < fault.onset or (fault.end is not None and t >= fault.end):
        return 0.0
    if fault.ramp <= 0:
        return 1.0
    u = min(1.0, (t - fault.onset) / fault.ramp)
    return u if fault.shape == "linear" else ramp_shape(fault.shape, u)


#: The ``exponential`` shape's rate: at half the ramp it has reached 12% of the way.
EXP_RATE = 4.0
STEPS = 4


def ramp_shape(shape: str, u: float) -> float:
    """The fraction of full intensity ``u`` (0..1) of the way through a ramp.

    >>> [round(ramp_shape(s, 0.5), 3) for s in ("linear", "exponential", "s_curve", "step")]
    [0.5, 0.119, 0.5, 0.75]
    """
    match shape:
        case "exponential":
            return math.expm1(EXP_RATE * u) / math.expm1(EXP_RATE)
        case "s_curve":
            return u * u * (3.0 - 2.0 * u)
        case "step":
            return min(1.0, (math.floor(u * STEPS) + 1) / STEPS)
        case _:
            return u


@dataclass
class Effects:
    """What the active faults do at one instant, as arrays over the fleet."""

    inlet_rise_c: np.ndarray  # per rack
    stack_resistance: np.ndarray  # per GPU x stack, multiplier
    co_tenant_duty: np.ndarray  # per GPU
    link_bandwidth: np.ndarray  # per GPU x link, fraction left
    link_error_rate: np.ndarray  # per GPU x link, errors per second
    pcie_replay_rate: np.ndarray  # per GPU, per second
    power_cap_fraction: np.ndarray  # per GPU, of board power (1 = none)
    stuck: np.ndarray  # per GPU x sensor (0 memory, 1 hotspot)
    dropout: np.ndarray  # per GPU x sensor
    node_down: np.ndarray  # per node


class FaultPlan:
    """The scenario's faults resolved onto fleet indices."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.faults = list(fleet.scenario.faults)
        self._gpus = [self._affected_gpus(f) for f in self.faults]

    @property
    def gpus(self) -> list[np.ndarray]:
        """Each fault's GPUs (fleet indices), in the scenario's order."""
        return self._gpus

    def _affected_gpus(self, fault: Fault) -> np.ndarray:
        t = fault.target
        fleet = self.fleet
        if t.host is not None and t.gpu is not None:
            return np.array([fleet.gpu_index(t.host, t.gpu)])
        if t.host is not None:
            return np.array(fleet.nodes[fleet.node_index(t.host)].gpus)
        picked = [
            g.index
            for g in fleet.gpus
            if (t.rack is None or g.device.rack == t.rack)
            and (t.cluster is None or g.device.cluster == t.cluster)
        ]
        return np.array(picked, dtype=np.int64)

    def effects(self, t: float) -> Effects:
        fleet = self.fleet
        n, racks = fleet.size, len(fleet.scenario.racks)
        e = Effects(
            inlet_rise_c=np.zeros(racks),
            stack_resistance=np.ones((n, MAX_STACKS)),
            co_tenant_duty=np.zeros(n),
            link_bandwidth=np.ones((n, MAX_LINKS)),
            link_error_rate=np.zeros((n, MAX_LINKS)),
            pcie_replay_rate=np.zeros(n),
            power_cap_fraction=np.ones(n),
            stuck=np.zeros((n, 2), dtype=bool),
            dropout=np.zeros((n, 2), dtype=bool),
            node_down=np.zeros(len(fleet.nodes), dtype=bool),
        )
        for fault, gpus in zip(self.faults, self._gpus, strict=True):
            k = intensity(fault, t)
            if k <= 0:
                continue
            m, tgt = fault.effective_magnitude, fault.target
            sensor = 0 if tgt.sensor == "memory" else 1
            match fault.kind:
                case FaultKind.COOLANT_DEGRADATION | FaultKind.AMBIENT_HEAT:
                    for rack in {fleet.gpus[g].rack for g in gpus.tolist()}:
                        e.inlet_rise_c[rack] += k * m
                case FaultKind.DEGRADED_STACK:
                    e.stack_resistance[gpus, tgt.stack] *= 1 + k * (m - 1)
                case FaultKind.NOISY_NEIGHBOUR:
                    e.co_tenant_duty[gpus] += k * m
                case FaultKind.FABRIC_LINK_DEGRADATION:
                    e.link_bandwidth[gpus, tgt.link] *= 1 - k * m
                    e.link_error_rate[gpus, tgt.link] += k * 40.0
                case FaultKind.PCIE_REPLAY_STORM:
                    e.pcie_replay_rate[gpus] += k * m
                case FaultKind.POWER_CAP:
                    e.power_cap_fraction[gpus] = np.minimum(
                        e.power_cap_fraction[gpus], 1 - k * (1 - m)
                    )
                case FaultKind.STUCK_SENSOR:
                    e.stuck[gpus, sensor] = True
                case FaultKind.SENSOR_DROPOUT:
                    e.dropout[gpus, sensor] = True
                case FaultKind.TARGET_DOWN:
                    e.node_down[list({fleet.gpus[g].node for g in gpus.tolist()})] = True
        return e

    def ground_truth(
        self, start: float, services_by_gpu: dict[int, list[str]], jobs_by_gpu: dict[int, list[str]]
    ) -> list[dict[str, Any]]:
        """What each fault is, where, when, and what a detector should say about it."""
        out = []
        for i, (fault, gpus) in enumerate(zip(self.faults, self._gpus, strict=True)):
            spec = FAULT_SPECS[fault.kind]
            devices = [self.fleet.gpus[g].device for g in gpus.tolist()]
            end = fault.end if fault.end is not None else self.fleet.scenario.duration
            services = sorted({s for g in gpus.tolist() for s in services_by_gpu.get(g, [])})
            jobs = sorted({j for g in gpus.tolist() for j in jobs_by_gpu.get(g, [])})
            out.append(
                {
                    "id": f"fault-{i}",
                    "kind": fault.kind.value,
                    "target": fault.target.model_dump(exclude_none=True),
                    "magnitude": fault.effective_magnitude,
                    "magnitude_unit": spec["unit"],
                    "onset": _iso(start + fault.onset),
                    "onset_unix": start + fault.onset,
                    "full_unix": start + fault.onset + fault.ramp,
                    "end": _iso(start + end),
                    "end_unix": start + end,
                    "affected_gpus": [
                        {"cluster": d.cluster, "rack": d.rack, "host": d.host, "gpu": d.gpu}
                        for d in devices
                    ],
                    "affected_services": services,
                    "affected_jobs": jobs,
                    "expected_findings": [f.value for f in fault.expected_findings],
                    "expected_root_cause": Cause(spec["cause"]).value,
                    "regressing_workloads": _regressing(fault, services, jobs),
                    "thermal_cause": Cause(spec["cause"]).is_thermal,
                }
            )
        return out


def _regressing(fault: Fault, services: list[str], jobs: list[str]) -> list[str]:
    """The workloads a regression scenario's fault must slow (its ``expect`` names the kind):
    the services on its GPUs for a p99 regression, the jobs for a step-time one."""
    kinds = set(fault.expect or ())
    return (services if FindingKind.P99_REGRESSION in kinds else []) + (
        jobs if FindingKind.STEP_TIME_REGRESSION in kinds else []
    )


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, tz=dt.UTC).isoformat().replace("+00:00", "Z")
