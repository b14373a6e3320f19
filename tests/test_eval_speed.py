"""``hbmwatch eval``'s in-process scrape: the same pages, the same samples, as over HTTP.

The eval serves its simulated fleet through an httpx transport instead of loopback sockets
(simulator/inprocess.py), and renders pages faster; neither may change what the collector,
and so the detectors and the alert engine, see.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
from typing import Any

import httpx
import pytest

from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.evaluation.run import hourly_progress
from hbmwatch.records import Sample
from hbmwatch.settings import CollectorSettings
from hbmwatch.simulator.inprocess import InProcessServer
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict
from hbmwatch.simulator.server import SimServer

START = 1_764_000_000.0
#: sha256 of ``_pages_digest`` as the renderer before the speed-up (commit 0b29f81) wrote it.
PAGES_BEFORE = "79d60c8f4fad531cc07468fc6db4f60ad39dc34bba3179c527c7785501cc2983"


def _scenario() -> dict[str, Any]:
    """Every rendering path within a minute: AMD (SPX and CPX), DCGM old and 4.6 names, a
    stuck sensor, dropouts on both vendors, an exporter down, PCIe and NVLink errors."""
    return {
        "name": "every_page_early",
        "duration": "10m",
        "seed": 5,
        "racks": [
            {"name": "r0", "nodes": 1, "sku": "MI300X"},
            {"name": "r1", "nodes": 1, "sku": "H200", "dcgm_names": "4.6"},
            {"name": "r2", "nodes": 1, "sku": "H100", "dcgm_names": "old"},
            {
                "name": "r3",
                "nodes": 1,
                "sku": "MI300X",
                "compute_partition": "cpx",
                "memory_partition": "nps4",
            },
        ],
        "workload": {"training": [{"name": "job", "racks": ["r2"]}]},
        "faults": [
            {
                "kind": "stuck_sensor",
                "target": {"host": "r0-node0", "gpu": 1, "sensor": "memory"},
                "onset": "5s",
                "end": "60s",
            },
            {
                "kind": "sensor_dropout",
                "target": {"host": "r1-node0", "gpu": 6, "sensor": "memory"},
                "onset": "10s",
                "end": "80s",
            },
            {
                "kind": "sensor_dropout",
                "target": {"host": "r3-node0", "gpu": 2, "sensor": "memory"},
                "onset": "10s",
                "end": "80s",
            },
            {"kind": "target_down", "target": {"host": "r2-node0"}, "onset": "8s", "end": "14s"},
            {
                "kind": "pcie_replay_storm",
                "target": {"host": "r1-node0", "gpu": 1},
                "onset": "3s",
                "end": "90s",
            },
            {
                "kind": "fabric_link_degradation",
                "target": {"host": "r2-node0", "gpu": 2, "link": 4},
                "onset": "3s",
                "end": "90s",
            },
        ],
    }


def _simulation(cpx: bool = True) -> Simulation:
    """The scenario; without its CPX rack (64 services) where every page is scraped."""
    scenario = _scenario()
    if not cpx:
        scenario["racks"] = scenario["racks"][:3]
        scenario["faults"] = [f for f in scenario["faults"] if f["target"]["host"] != "r3-node0"]
    return Simulation(scenario_from_dict(scenario), seed=7, start_unix=START)


def _pages_digest(steps: int) -> str:
    sim = _simulation()
    digest = hashlib.sha256()
    for step in range(steps):
        sim.step()
        for node in range(len(sim.fleet.nodes)):
            digest.update(repr(sim.node_page(node)).encode())
        if step % 5 == 0:
            for service in range(len(sim.fleet.services)):
                digest.update(sim.service_page(service).encode())
            for job in range(len(sim.fleet.jobs)):
                digest.update(sim.job_page(job).encode())
    return digest.hexdigest()


@pytest.mark.reference_dispatch
def test_pages_are_byte_for_byte_what_they_were_before_the_speed_up() -> None:
    assert _pages_digest(40) == PAGES_BEFORE


class _ListSink:
    """The part of a BatchingSink that a scrape round uses: ``add``."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, samples: list[Sample]) -> None:
        self.samples.extend(samples)


async def _scraped(
    http: bool, steps: int
) -> list[tuple[str, tuple[tuple[str, str], ...], int, float]]:
    """Every sample ``steps`` lockstep scrape rounds give, served over HTTP or in-process;
    the target's URL (its port differs) is read as its path, scrape durations are left out."""
    sim = _simulation(cpx=False)
    server = SimServer(sim) if http else InProcessServer(sim)
    served = await server.start()
    transport = server.transport() if isinstance(server, InProcessServer) else None
    settings = CollectorSettings()
    targets = [Target(t.kind, t.url, dict(t.labels), 1.0, 60.0) for t in served]
    sink = _ListSink()
    engine = ScrapeEngine(TargetSet(settings, targets), sink, settings,  # type: ignore[arg-type]
                          clock=lambda: sim.now_unix, transport=transport)  # fmt: skip
    try:
        for _ in range(steps):
            sim.step()
            await engine.scrape_round(round(sim.now_unix * 1000))
    finally:
        await engine.close()
        await server.close()
    out = []
    for s in sink.samples:
        if s.series.metric == "hbmwatch_scrape_duration_seconds":
            continue
        labels = dict(s.series.labels)
        if "target" in labels:
            labels["target"] = re.sub(r"^http://[^/]+", "", labels["target"])
        out.append((s.series.metric, tuple(sorted(labels.items())), s.timestamp_ms, s.value))
    return sorted(out)


@pytest.mark.slow
def test_in_process_and_http_scrapes_give_the_same_samples() -> None:
    steps = 20  # the exporter goes down at 8 s and back at 14 s: 503s are compared too
    over_http = asyncio.run(_scraped(True, steps))
    in_process = asyncio.run(_scraped(False, steps))
    assert len(over_http) > 1000
    assert in_process == over_http
    down = [s for s in in_process if s[0] == "hbmwatch_target_up" and s[3] == 0.0]
    assert down, "the target_down window was not scraped"


def test_in_process_transport_answers_like_the_server() -> None:
    async def ask() -> list[int]:
        server = InProcessServer(_simulation(cpx=False))
        served = await server.start()
        async with httpx.AsyncClient(transport=server.transport()) as client:
            node = served[0].url.rsplit("/", 1)[0]
            codes = [(await client.get(f"{node}/metrics")).status_code,
                     (await client.get(f"{node}/nowhere")).status_code,
                     (await client.post(f"{node}/metrics")).status_code,
                     (await client.get("http://127.0.0.1:1/metrics")).status_code]  # fmt: skip
        return codes

    assert asyncio.run(ask()) == [200, 404, 405, 404]


def test_a_long_run_prints_each_simulated_hour_reached() -> None:
    out = io.StringIO()
    report = hourly_progress("diurnal_power_day seed 101", out)
    for t in range(0, 3 * 3600 + 1, 60):
        report(float(t), 86_400.0)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].split(" of ")[0].strip() for line in lines] == [
        "simulated hour 1", "simulated hour 2", "simulated hour 3"]  # fmt: skip
    assert "of 24.0" in lines[0]


def test_a_short_run_prints_nothing() -> None:
    out = io.StringIO()
    report = hourly_progress("default seed 1", out)
    for t in range(0, 1200, 60):
        report(float(t), 1200.0)
    assert out.getvalue() == ""
