"""The bundled fleet in its own process: it serves, stops, and a death is not silent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import structlog

from hbmwatch.simulator.process import FleetSpec, SimProcess, SimulatorFailed


def spec(tmp_path: Path, **kw: object) -> FleetSpec:
    base = {"scenario": "healthy", "seed": 1, "base_port": 0, "speed": 1.0,
            "truth_file": str(tmp_path / "truth.json"), "log_level": "warning"}  # fmt: skip
    return FleetSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_serves_its_pages_then_stops(tmp_path: Path) -> None:
    async def main() -> int:
        fleet = SimProcess(spec(tmp_path))
        info = await fleet.start()
        async with httpx.AsyncClient(timeout=60) as client:
            page = await client.get(info.targets[0].url)
        await fleet.stop()
        assert not fleet.alive and (tmp_path / "truth.json").exists()
        return page.status_code

    assert asyncio.run(main()) == 200


def test_a_fleet_that_dies_is_logged(tmp_path: Path) -> None:
    async def main() -> None:
        fleet = SimProcess(spec(tmp_path))
        await fleet.start()
        fleet._process.kill()
        await asyncio.wait_for(fleet.wait(asyncio.Event()), 60)
        await fleet.stop()

    with structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    assert any(e["event"] == "the simulated fleet's process ended" for e in logs)


def test_a_bad_scenario_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SimulatorFailed, match="cannot start the simulated fleet"):
        asyncio.run(SimProcess(spec(tmp_path, scenario="no-such-scenario")).start())
