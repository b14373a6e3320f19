"""A fleet whose exporters refresh every 30 s, through the real path as ``hbmwatch eval``
runs it: the faults are still found with the right cause, and nothing else is raised."""

from __future__ import annotations

import asyncio

import pytest

from hbmwatch.evaluation.run import run_scenario
from hbmwatch.evaluation.scoring import score
from hbmwatch.simulator.scenario import scenario_from_dict

SCENARIO = {
    "name": "slow_refresh",
    "duration": "16m",
    "seed": 19,
    "exporter_refresh": "30s",  # dcgm-exporter's default, and DME's cache, on every node
    "racks": [
        {"name": "r0", "nodes": 1, "sku": "MI300X"},
        {"name": "r1", "nodes": 1, "sku": "H200"},
    ],
    "faults": [
        {"kind": "stuck_sensor", "target": {"host": "r0-node0", "gpu": 1, "sensor": "memory"},
         "onset": "1m", "end": "15m"},
        {"kind": "sensor_dropout", "target": {"host": "r1-node0", "gpu": 6, "sensor": "memory"},
         "onset": "3m", "end": "7m"},
        {"kind": "sensor_dropout", "target": {"host": "r0-node0", "gpu": 4, "sensor": "memory"},
         "onset": "4m", "end": "8m"},
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~40 CPU-s; minutes on two busy cores
def test_faults_are_found_and_nothing_else_at_a_30s_refresh() -> None:
    result = asyncio.run(run_scenario(scenario_from_dict(SCENARIO)))
    report = score([result])
    missed = [o for o in report.faults if not (o.detected and o.top1)]
    assert not missed, missed
    false = [f for ids in report.incidents for f in result.findings if f.id in ids]
    assert report.false_incidents == 0, [(f.entity, f.summary) for f in false]
