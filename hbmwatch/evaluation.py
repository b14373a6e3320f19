"""``hbmwatch eval``: scenarios through the real collector, store and detectors, scored.

Each run serves a scenario's simulated fleet over HTTP on 127.0.0.1 and steps it in
lockstep with the collector: one simulation step, one scrape round of every target that is
due (exporters every step, latency pages every ``workload_scrape_s``; the real scrape
engine, parsers and spool-backed writer into a fresh SQLite store), and every
``detect_every_s`` simulated seconds one detection cycle.  The simulated clock drives the
store and the detectors, so a 30-minute scenario runs in a minute or two of wall time and
gives the same answer every time.  ``hbmwatch.scoring`` compares the findings with the
scenario's ground truth.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from collector.engine import BatchingSink, ScrapeEngine
from collector.spool import Spool
from collector.targets import Target, TargetSet
from collector.writer import SpoolingWriter
from detectors import default_detectors
from detectors.context import Context
from hbmwatch.detection import CycleReport, DetectionRunner
from hbmwatch.records import Finding
from hbmwatch.settings import CollectorSettings, StoreSettings
from simulator.runner import Simulation
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimServer
from store.engine import create_store_engine
from store.migrate import upgrade
from store.store import Store

#: Evaluations start at a fixed instant, so the daily load pattern is the same every run.
EVAL_START = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.UTC)


@dataclass
class RunResult:
    scenario: str
    seed: int
    truth: dict[str, Any]
    findings: list[Finding]
    simulated_seconds: float
    wall_seconds: float
    samples: int
    cycles: int
    detect_seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    cycles_detail: list[CycleReport] = field(default_factory=list)


async def run_scenario(
    scenario: Scenario,
    *,
    seed: int | None = None,
    duration_s: float | None = None,
    detect_every_s: float = 5.0,
    workload_scrape_s: float = 5.0,
    workdir: Path | None = None,
    progress: Callable[[float, float], None] | None = None,
    on_cycle: Callable[[Store, CycleReport], Awaitable[None]] | None = None,
    start_unix: float | None = None,
) -> RunResult:
    """One scenario through the real path; ``on_cycle`` sees each detection cycle's report
    (alerting and delivery hook in there), ``start_unix`` moves the simulated clock."""
    start = scenario.start.timestamp() if scenario.start else EVAL_START.timestamp()
    start = start if start_unix is None else start_unix
    sim = Simulation(scenario, seed=seed, start_unix=start)
    end_t = min(scenario.duration, duration_s) if duration_s else scenario.duration
    clock = lambda: sim.now_unix  # noqa: E731 - the simulated clock drives everything
    with tempfile.TemporaryDirectory(dir=workdir, prefix="hbmwatch-eval-") as tmp:
        folder = Path(tmp)
        url = f"sqlite:///{folder / 'eval.db'}"
        engine = create_store_engine(url)
        upgrade(engine)
        engine.dispose()
        store = Store(create_store_engine(url), StoreSettings(url=url), clock=clock)
        server = SimServer(sim, base_port=0)
        served = await server.start()
        settings = CollectorSettings(flush_samples=10**9)
        targets = [
            Target(t.kind, t.url, dict(t.labels), _interval(t.kind, workload_scrape_s), 5.0)
            for t in served
        ]
        sink = BatchingSink(
            SpoolingWriter(store.write, Spool(folder / "spool", 2**30)), 10**9, 3600.0
        )
        collector = ScrapeEngine(TargetSet(settings, targets), sink, settings, clock=clock)
        runner = DetectionRunner(
            store, default_detectors(), context=Context(), clock=clock, state_every_seconds=600
        )
        runner.start()
        t0 = time.perf_counter()
        timings = {"simulate": 0.0, "scrape": 0.0, "store": 0.0, "detect": 0.0, "compact": 0.0}
        reports: list[CycleReport] = []
        try:
            async with collector:
                next_detect = detect_every_s
                while sim.t < end_t - 1e-9:
                    a = time.perf_counter()
                    sim.step()
                    b = time.perf_counter()
                    await collector.scrape_round(round(sim.now_unix * 1000), due_only=True)
                    c = time.perf_counter()
                    await sink.flush()
                    d = time.perf_counter()
                    timings["simulate"] += b - a
                    timings["scrape"] += c - b
                    timings["store"] += d - c
                    if sim.t + 1e-9 >= next_detect:
                        reports.append(runner.cycle(int(sim.now_unix * 1000)))
                        if on_cycle is not None:
                            await on_cycle(store, reports[-1])
                        next_detect += detect_every_s
                        timings["detect"] += time.perf_counter() - d
                    if int(sim.t) % 60 == 0:
                        e = time.perf_counter()
                        store.compact()
                        timings["compact"] += time.perf_counter() - e
                    if progress is not None and int(sim.t) % 60 == 0:
                        progress(sim.t, end_t)
            final = runner.cycle(int(sim.now_unix * 1000) + runner.settle_ms)
            if on_cycle is not None:
                await on_cycle(store, final)
            findings = store.findings.query(limit=100_000)
        finally:
            await server.close()
            store.close()
    truth = sim.ground_truth()
    truth["evaluated_s"] = end_t
    return RunResult(
        scenario=scenario.name,
        seed=sim.seed,
        truth=truth,
        findings=findings,
        simulated_seconds=end_t,
        wall_seconds=time.perf_counter() - t0,
        samples=sink.totals.accepted,
        cycles=len(reports),
        detect_seconds=timings["detect"],
        timings=timings,
        cycles_detail=reports,
    )


def _interval(kind: str, workload_scrape_s: float) -> float:
    """Exporters at 1 s; latency pages, whose quantiles span a minute, less often."""
    return 1.0 if kind in ("dme", "dcgm") else workload_scrape_s


def _run_one(source: str, seed: int | None, duration_s: float | None) -> RunResult:
    scenario = load_scenario(source)
    result = asyncio.run(run_scenario(scenario, seed=seed, duration_s=duration_s))
    result.cycles_detail = []  # the per-cycle reports stay in the worker
    return result


def evaluate(
    sources: Sequence[str],
    seeds: Sequence[int | None],
    *,
    jobs: int = 1,
    duration_s: float | None = None,
    done: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Every scenario at every seed, ``jobs`` runs at a time in worker processes."""
    plan = [(s, seed) for s in sources for seed in seeds]
    for source, _ in plan:
        load_scenario(source)  # a bad name or file fails before any run starts
    results: list[RunResult] = []
    if jobs <= 1:
        for source, seed in plan:
            results.append(_run_one(source, seed, duration_s))
            if done:
                done(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_run_one, s, seed, duration_s) for s, seed in plan]
        for future in as_completed(futures):
            results.append(future.result())
            if done:
                done(results[-1])
    return sorted(results, key=lambda r: (r.scenario, r.seed))


def run_summary(r: RunResult) -> dict[str, Any]:
    """What a report keeps of a run: its figures and its findings, without the samples."""
    from hbmwatch.records import finding_to_dict

    return {
        "scenario": r.scenario,
        "seed": r.seed,
        "simulated_seconds": r.simulated_seconds,
        "wall_seconds": round(r.wall_seconds, 2),
        "samples": r.samples,
        "cycles": r.cycles,
        "detect_seconds": round(r.detect_seconds, 3),
        "timings": {k: round(v, 2) for k, v in r.timings.items()},
        "truth": r.truth,
        "findings": [finding_to_dict(f) for f in r.findings],
    }
