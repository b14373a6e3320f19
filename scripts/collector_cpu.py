"""CPU a scrape of the collector's running engine, store excluded (issue 17).

    python scripts/collector_cpu.py [--gpus 256] [--seconds 20] [--warmup 8]

Unlike ``scripts/bench_fetch.py`` (``scrape_round``: every target at once), this runs
``ScrapeEngine.run`` as ``hbmwatch collect`` does: every target on its own tick, the loop's
timers and wake-ups, node pages' worker threads, the batching sink and its writer thread,
against the versus fleet (``hbmwatch sim``, real time, one vLLM page a GPU), with a store
write that discards.  Prints one JSON line: scrapes and rounds kept in the window, this
process's CPU (``time.process_time``: the host is shared, wall time is noise) and the loop
thread's, a scrape and a million samples.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from hbmwatch.bench.scale import simulated_fleet
from hbmwatch.bench.versus import inference_fleet_toml
from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.targets import TargetSet
from hbmwatch.collector.writer import BatchingSink, SpoolingWriter
from hbmwatch.records import Sample
from hbmwatch.runtime.service import tune_gc
from hbmwatch.settings import CollectorSettings
from hbmwatch.store.results import WriteResult


async def measure(targets: Path, folder: Path, warmup: float, seconds: float) -> dict:
    written = [0]

    def discard(samples: list[Sample]) -> WriteResult:
        written[0] += len(samples)
        return WriteResult(received=len(samples), accepted=len(samples))

    settings = CollectorSettings(target_file=str(targets), spool_dir=str(folder / "spool"))
    writer = SpoolingWriter(discard, Spool(folder / "spool", 10**9))
    sink = BatchingSink(writer, settings.flush_samples, settings.flush_seconds)
    engine = ScrapeEngine(TargetSet(settings), sink, settings)
    tune_gc()
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    await asyncio.sleep(warmup)
    scrapes, samples = sum(s.scrapes for s in engine.states), written[0]
    loop_cpu, cpu, wall = time.thread_time(), time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    loop_cpu, cpu = time.thread_time() - loop_cpu, time.process_time() - cpu
    wall = time.monotonic() - wall
    scrapes = sum(s.scrapes for s in engine.states) - scrapes
    samples = written[0] - samples
    stop.set()
    await task
    return {"targets": len(engine.states), "scrapes": scrapes,
            "rounds_kept": scrapes / len(engine.states) / wall, "samples": samples,
            "cpu_s": cpu, "loop_cpu_s": loop_cpu,
            "us_per_scrape": cpu / scrapes * 1e6, "loop_us_per_scrape": loop_cpu / scrapes * 1e6,
            "cpu_s_per_million_samples": cpu / samples * 1e6}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        toml = inference_fleet_toml(args.gpus)
        with simulated_fleet(folder, args.gpus, toml=toml, speed=1.0):
            report = asyncio.run(measure(folder / "targets.json", folder, args.warmup,
                                         args.seconds))  # fmt: skip
    print(json.dumps({"gpus": args.gpus, **report}))


if __name__ == "__main__":
    main()
