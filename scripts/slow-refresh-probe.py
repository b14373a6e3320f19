#!/usr/bin/env python
"""CPU of scraping and storing exporter pages that refresh every scrape vs every 30 s.

A simulated fleet of 8 nodes (4 MI300X on DME, 4 H200 on dcgm-exporter, 64 GPUs) is served
in-process (no sockets) and its node pages scraped in 1 s rounds into a scratch SQLite
store; the CPU of the rounds (scrape, translate, store; not the simulator's steps, not the
first two rounds, which register every series) and the samples written are printed for an
exporter refresh of 0 (a fresh page every scrape) and 30 s (dcgm-exporter's default).

Usage: ``.venv/bin/python scripts/slow-refresh-probe.py [--rounds 150]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from hbmwatch import log
from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.records import Sample
from hbmwatch.settings import CollectorSettings, StoreSettings
from hbmwatch.simulator.inprocess import InProcessServer
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store


class StoreSink:
    """Each scrape's samples straight into the store (no batching: the same for both)."""

    def __init__(self, store: Store) -> None:
        self.store, self.samples = store, 0

    def add(self, samples: list[Sample]) -> None:
        self.samples += len(samples)
        self.store.write(samples)


async def measure(refresh: float, rounds: int, folder: Path) -> tuple[float, int]:
    scenario = scenario_from_dict({
        "name": "probe", "duration": "1h", "seed": 1, "exporter_refresh": refresh,
        "racks": [{"name": "r0", "nodes": 4, "sku": "MI300X"},
                  {"name": "r1", "nodes": 4, "sku": "H200"}],
    })  # fmt: skip
    sim = Simulation(scenario, start_unix=1_795_000_000)
    server = InProcessServer(sim)
    served = [t for t in await server.start() if t.kind in ("dme", "dcgm")]
    url = f"sqlite:///{folder / f'refresh{refresh:g}.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    store = Store(create_store_engine(url), StoreSettings(url=url), clock=lambda: sim.now_unix)
    settings = CollectorSettings()
    targets = [Target(t.kind, t.url, dict(t.labels), 1.0, 60.0) for t in served]
    sink = StoreSink(store)
    scraper = ScrapeEngine(TargetSet(settings, targets), sink, settings,  # type: ignore[arg-type]
                           clock=lambda: sim.now_unix, transport=server.transport())  # fmt: skip
    cpu = 0.0
    try:
        for i in range(rounds + 2):
            sim.step()
            started = time.process_time()
            await scraper.scrape_round(round(sim.now_unix * 1000))
            cpu += time.process_time() - started if i >= 2 else 0.0
    finally:
        await scraper.close()
        store.close()
    return cpu, sink.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    log.configure("warning")
    with tempfile.TemporaryDirectory(prefix="hbmwatch-refresh-") as tmp:
        for refresh in (0.0, 30.0):
            cpu, samples = asyncio.run(measure(refresh, args.rounds, Path(tmp)))
            print(f"exporter refresh {refresh:g} s: 8 node targets x {args.rounds} rounds: "
                  f"{cpu:.2f} CPU-s, {samples:,} samples written")  # fmt: skip


if __name__ == "__main__":
    main()
