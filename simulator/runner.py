"""A simulation run: the fleet, its physics, workloads and faults, stepped in fixed steps.

The state at simulated time t depends only on the scenario, the seed and t, never on how
fast the wall clock ran: the same scenario and seed give identical samples and ground truth.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from hbmwatch.simulator.errors import GpuErrors
from hbmwatch.simulator.exposition import Exposition, Readings
from hbmwatch.simulator.faults import FaultPlan
from hbmwatch.simulator.fleet import Fleet
from hbmwatch.simulator.physics import Physics
from hbmwatch.simulator.pods import Placement
from hbmwatch.simulator.scenario import Scenario
from hbmwatch.simulator.workloads import Workloads

DIURNAL_AMBIENT_C = {"air": 2.0, "dlc": 0.5}
#: Spreads the nodes' refresh instants over the refresh period (exporters start apart).
GOLDEN = (math.sqrt(5) - 1) / 2


class Simulation:
    def __init__(
        self, scenario: Scenario, *, seed: int | None = None, start_unix: float | None = None
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        if start_unix is None:
            start_unix = scenario.start.timestamp() if scenario.start else math.floor(time.time())
        self.start_unix = float(start_unix)
        self.fleet = Fleet.build(scenario, self.seed)
        self.physics = Physics(self.fleet, self.seed)
        self.workloads = Workloads(self.fleet, self.seed)
        self.plan = FaultPlan(self.fleet)
        self.errors = GpuErrors(self.fleet)
        self.placement = Placement(self.fleet, self.seed)
        self.exposition = Exposition(
            self.fleet, self.physics, self.workloads, self.errors, self.placement
        )
        self.t = 0.0
        self.steps = 0
        self._cooling = np.array([r.effective_cooling for r in scenario.racks])
        self._held: dict[str, np.ndarray] = {}
        self._stuck = np.zeros((self.fleet.size, 2), dtype=bool)
        self.effects = self.plan.effects(0.0)
        self.readings: Readings = {}
        #: Each node's exporter refresh period (s) and the page it serves until the next.
        self.refresh = [scenario.refresh_of(scenario.racks[n.rack]) for n in self.fleet.nodes]
        self._node_pages: dict[int, tuple[int, str]] = {}
        self._warm_up()

    @property
    def now_unix(self) -> float:
        return self.start_unix + self.t

    @property
    def finished(self) -> bool:
        return self.t >= self.scenario.duration - 1e-9

    def _warm_up(self) -> None:
        """Settle the thermal state so the run starts from a machine that has been running."""
        t0 = self.t
        for _ in range(300):
            self._advance(2.0, record=False)
        self.t = t0
        self.readings = self.exposition.readings()

    def _ambient(self) -> np.ndarray:
        hour = (self.now_unix % 86_400) / 3600.0
        swing = math.sin(2 * math.pi * (hour - 9.0) / 24.0)
        return np.array([DIURNAL_AMBIENT_C[c] * swing for c in self._cooling])

    def _advance(self, dt: float, record: bool = True) -> None:
        effects = self.plan.effects(self.t) if record else self.plan.effects(-1.0)
        demand = self.workloads.demand(self.now_unix, dt)
        self.physics.step(dt, demand, effects, self._ambient())
        if record:
            self.workloads.step(
                dt,
                self.now_unix,
                self.physics,
                effects.co_tenant_duty,
                effects.pcie_replay_rate,
                effects.link_bandwidth,
                stalled=self.errors.dead if self.errors.faults else None,
            )
            self.effects = effects
        self.t += dt
        if record:
            self._errors_and_moves()

    def _errors_and_moves(self) -> None:
        """GPU error state and pod placement at the new time (both only where asked)."""
        if self.errors.faults:
            self.errors.update(self.t)
        moved = self.placement.advance(self.t)
        if moved:
            self.workloads.place(self.placement.service_gpu)
            self.exposition.relabel(moved)

    def step(self) -> None:
        """Advance one scenario step (``scenario.step`` seconds)."""
        self._advance(self.scenario.step)
        self.steps += 1
        self._update_readings()

    def advance_to(self, t: float) -> None:
        while self.t + self.scenario.step <= t + 1e-9:
            self.step()

    def _update_readings(self) -> None:
        fresh = self.exposition.readings()
        stuck = self.effects.stuck
        started = stuck & ~self._stuck
        names = ("gpu_memory_temperature_celsius", "gpu_hotspot_temperature_celsius")
        for col, name in enumerate(names):
            if started[:, col].any():
                held = self._held.setdefault(name, fresh[name].copy())
                held[started[:, col]] = self.readings.get(name, fresh[name])[started[:, col]]
            if stuck[:, col].any():
                fresh[name] = np.where(stuck[:, col], self._held[name], fresh[name])
        self._stuck = stuck.copy()
        self.readings = fresh

    # -- pages ------------------------------------------------------------------------------
    def node_page(self, node: int) -> str | None:
        """The node's exporter page, or None while its exporter is down.

        An exporter with a refresh period (``exporter_refresh``) serves the same text until
        its next refresh, as dcgm-exporter and DME do; each node refreshes at its own phase.
        """
        if self.effects.node_down[node]:
            self._node_pages.pop(node, None)  # a restarted exporter collects afresh
            return None
        every = self.refresh[node]
        if every <= 0:
            return self._render(node)
        epoch = math.floor(self.t / every + GOLDEN * node)
        cached = self._node_pages.get(node)
        if cached is None or cached[0] != epoch:  # refreshed since: collect now
            cached = self._node_pages[node] = (epoch, self._render(node))
        return cached[1]

    def _render(self, node: int) -> str:
        return self.exposition.node_page(
            self.fleet.nodes[node], self.readings, self.effects.dropout
        )

    def service_page(self, service: int) -> str:
        return self.exposition.service_page(service)

    def job_page(self, job: int) -> str:
        return self.exposition.job_page(job)

    # -- ground truth -----------------------------------------------------------------------
    def ground_truth(self) -> dict[str, Any]:
        services: dict[int, list[str]] = {}
        for s in self.fleet.services:
            services.setdefault(s.gpu, []).append(s.name)
        jobs: dict[int, list[str]] = {}
        for j in self.fleet.jobs:
            for g in j.gpus:
                jobs.setdefault(g, []).append(j.name)
        return {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "start_unix": self.start_unix,
            "duration_s": self.scenario.duration,
            "step_s": self.scenario.step,
            "gpus": self.fleet.size,
            "nodes": [
                {
                    "host": n.host,
                    "rack": n.rack_name,
                    "cluster": n.cluster,
                    "sku": n.sku.name,
                    "exporter": n.exporter,
                }
                for n in self.fleet.nodes
            ],
            "faults": self._with_pods(self.plan.ground_truth(self.start_unix, services, jobs)),
            **({"moves": self._moves_truth()} if self.scenario.moves else {}),
        }

    def _with_pods(self, faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Where racks run pods: each fault's ``affected_pods``, the pods on its GPUs between
        its onset and end (other scenarios' ground truth stays as it was)."""
        if not self.placement.labelled:
            return faults
        for f, gpus in zip(faults, self.plan.gpus, strict=True):
            onset, end = f["onset_unix"] - self.start_unix, f["end_unix"] - self.start_unix
            f["affected_pods"] = sorted(
                {p for g in gpus.tolist() for p in self.placement.pods_during(g, onset, end)}
            )
        return faults

    def _moves_truth(self) -> list[dict[str, Any]]:
        """Pod moves: no fault, so no incident is expected on their GPUs."""
        return [
            {"id": f"move-{i}", "at_unix": self.start_unix + m.at,
             "affected_gpus": [self._gpu_truth(m.source.host, m.source.gpu),
                               self._gpu_truth(m.destination.host, m.destination.gpu)]}
            for i, m in enumerate(self.placement.moves)
        ]  # fmt: skip

    def _gpu_truth(self, host: str, gpu: int) -> dict[str, str]:
        d = self.fleet.gpus[self.fleet.gpu_index(host, gpu)].device
        return {"cluster": d.cluster, "rack": d.rack, "host": d.host, "gpu": d.gpu}

    def write_ground_truth(self, path: Path) -> None:
        path.write_text(json.dumps(self.ground_truth(), indent=2) + "\n")
