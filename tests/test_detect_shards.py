"""Detector shards over one store say what one process says (runtime/roles.py).

The scenario runs once through the real collector, store and detection runner
(``evaluation.run``); beside it, on every cycle, the runners of N shard processes read the
same store back (each its own ``Store`` object, as another process would) and write their
findings to a second database.  The two sets of findings must be the same, finding for
finding: the per-rack detectors on their racks, the fleet-wide ones beside shard 0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hbmwatch.evaluation.run import run_scenario
from hbmwatch.records import Finding, finding_to_dict
from hbmwatch.runtime import roles
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.settings import DetectionSettings, StoreSettings
from hbmwatch.sharding import Shard
from hbmwatch.simulator.scenario import load_scenario
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.findings import FindingLog
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store

SHARDS = 4  # c0/r0 and c0/r1 hash to shards 1 and 3 of 4: the fault's rack and another


def _racks_split() -> None:
    owners = {Shard(i, SHARDS).index for i in range(SHARDS) if Shard(i, SHARDS).owns("c0/r0")}
    others = {Shard(i, SHARDS).index for i in range(SHARDS) if Shard(i, SHARDS).owns("c0/r1")}
    assert owners != others, "the two racks must land on different shards"


def _comparable(findings: list[Finding]) -> list[dict]:
    return sorted((finding_to_dict(f) for f in findings), key=lambda d: d["id"])


#: The bundled coolant_loss and diurnal_heat, cut to one node a rack and a fault at 4 min
#: (the thermal baselines warm for 3): their rack fault (cooling) and room fault (ambient).
FAULTS = {
    "coolant_loss": 'kind = "coolant_degradation"\ntarget = { rack = "r0" }',
    "diurnal_heat": 'kind = "ambient_heat"\ntarget = { cluster = "c0" }',
}
SCENARIO = """name = "{name}"
duration = "8m"
seed = 12
[[racks]]
name = "r0"
nodes = 1
sku = "MI300X"

[[racks]]
name = "r1"
nodes = 1
sku = "H200"

[[faults]]
{fault}
onset = "4m"
ramp = "1m"
end = "7m"
"""


def _sharded_run(scenario: str, tmp_path: Path, minutes: float) -> tuple[list, list]:
    other = f"sqlite:///{tmp_path / 'shards.db'}"
    engine = create_store_engine(other)
    upgrade(engine)
    engine.dispose()
    findings = FindingLog(create_store_engine(other))
    shards: list[list[DetectionRunner]] = []

    async def beside(store: Store, report) -> None:  # type: ignore[no-untyped-def]
        if not shards:  # one Store per shard process, over the same database
            for i in range(SHARDS):
                own = Store(store.engine, StoreSettings(url=str(store.engine.url)),
                            clock=store._clock)  # fmt: skip
                own.findings = findings
                settings = DetectionSettings(shard=f"{i}/{SHARDS}")
                shards.append(roles.runners(own, settings, shared=True))
        settle = shards[0][0].settle_ms
        now = report.end_ms + settle if report.end_ms else store.now_ms()
        for runner in (r for process in shards for r in process):
            runner.cycle(now)

    path = tmp_path / f"{scenario}.toml"
    path.write_text(SCENARIO.format(name=scenario, fault=FAULTS[scenario]))
    result = asyncio.run(run_scenario(load_scenario(path), duration_s=minutes * 60,
                                      on_cycle=beside))  # fmt: skip
    sharded = findings.query(limit=100_000)
    findings.engine.dispose()
    return _comparable(result.findings), _comparable(sharded)


@pytest.mark.slow
@pytest.mark.timeout(900)  # 80-150 s each on 2 busy cores: the shards read SQLite back
@pytest.mark.parametrize(
    "scenario",
    # The room-wide fault needs every rack (the fleet-wide runner); the rack fault adds
    # 80-150 s for what the e2e test's per-rack pages also show: it runs with -m soak.
    [pytest.param("coolant_loss", marks=pytest.mark.soak), "diurnal_heat"],
)
def test_shards_find_what_one_process_finds(scenario: str, tmp_path: Path) -> None:
    _racks_split()
    single, sharded = _sharded_run(scenario, tmp_path, minutes=7)
    assert single, "the fault must be found at all"
    assert [f["id"] for f in sharded] == [f["id"] for f in single]
    assert sharded == single


def test_plan() -> None:
    assert roles.plan(DetectionSettings()).single
    p = roles.plan(DetectionSettings(shard="0/3"))
    assert p.fleet_wide and p.racks == Shard(0, 3) and not p.single
    assert not roles.plan(DetectionSettings(shard="1/3")).fleet_wide
    only = roles.plan(DetectionSettings(shard="1/3", fleet_wide="only"))
    assert only.racks is None and only.fleet_wide
    assert roles.plan(DetectionSettings(shard="2/3", fleet_wide="also")).fleet_wide
    assert not roles.plan(DetectionSettings(fleet_wide="off")).fleet_wide
