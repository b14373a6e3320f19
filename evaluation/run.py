"""``hbmwatch eval``: scenarios through the real collector, store and detectors, scored.

Each run serves a scenario's simulated fleet in-process (an httpx transport answers the
collector's requests with the simulator's pages: no sockets, the collector's own client,
parsers and translators; ``http_scrape`` serves it over HTTP on 127.0.0.1 instead) and
steps it in lockstep with the collector: one simulation step, one scrape round of every
target that is due (exporters every step, latency pages every ``workload_scrape_s``; the
real scrape engine, parsers and spool-backed writer into a fresh SQLite store), and every
``detect_every_s`` simulated seconds one detection cycle.  The simulated clock drives the
store and the detectors, so a 30-minute scenario runs in a minute or two of wall time and
gives the same answer every time.  ``scoring`` compares the findings with the scenario's
ground truth.  Each cycle's findings also go through the real alerting and delivery
(``pager``), so ``incident_scoring`` can score the incidents and pages on-call would have
got.  A run starts at ``EVAL_START`` (09:00) unless told
another instant (``start_time``: a chosen or a seeded random hour of the simulated day).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

from hbmwatch.collector.engine import BatchingSink, ScrapeEngine
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.collector.writer import SpoolingWriter
from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.context import Context
from hbmwatch.evaluation.pager import Pager, PagerRecord
from hbmwatch.records import Finding
from hbmwatch.runtime.detection import CycleReport, DetectionRunner
from hbmwatch.settings import CollectorSettings, StoreSettings
from hbmwatch.simulator.inprocess import InProcessServer
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import Scenario, load_scenario
from hbmwatch.simulator.server import SimServer
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store

#: Evaluations start at a fixed instant, so the daily load pattern is the same every run.
EVAL_START = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.UTC)
#: A scrape's wall-clock deadline.  The fleet answers in lockstep, so only a busy machine
#: makes it slow; with 5 s (the collector's default) a loaded host turned a run's first
#: scrapes into target-down findings and pages that no fault explains.
SCRAPE_TIMEOUT_S = 60.0


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
    pager: PagerRecord | None = None  # alerts, incidents and pages (None: not paged)


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
    page: bool = False,
    http_scrape: bool = False,
) -> RunResult:
    """One scenario through the real path; ``on_cycle`` sees each detection cycle's report,
    ``start_unix`` moves the simulated clock, ``page`` runs alerting and delivery too
    (``hbmwatch eval`` does; off by default, so a caller's own alerting has the store alone),
    ``http_scrape`` serves the fleet over loopback HTTP instead of in-process."""
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
        server = SimServer(sim) if http_scrape else InProcessServer(sim)
        served = await server.start()
        transport = server.transport() if isinstance(server, InProcessServer) else None
        settings = CollectorSettings(flush_samples=10**9)
        targets = [
            Target(
                t.kind,
                t.url,
                dict(t.labels),
                _interval(t.kind, workload_scrape_s),
                SCRAPE_TIMEOUT_S,
            )
            for t in served
        ]
        sink = BatchingSink(
            SpoolingWriter(store.write, Spool(folder / "spool", 2**30)), 10**9, 3600.0
        )
        collector = ScrapeEngine(
            TargetSet(settings, targets), sink, settings, clock=clock, transport=transport
        )
        runner = DetectionRunner(
            store, default_detectors(), context=Context(), clock=clock, state_every_seconds=600
        )
        runner.start()
        pager = Pager(store, clock) if page else None
        cycle_hook = _chain(pager, on_cycle)
        t0 = time.perf_counter()
        timings = {"simulate": 0.0, "scrape": 0.0, "store": 0.0, "detect": 0.0, "compact": 0.0,
                   "page": 0.0}  # fmt: skip
        reports: list[CycleReport] = []
        try:
            if pager is not None:
                await pager.start()
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
                        e = time.perf_counter()
                        timings["detect"] += e - d
                        if cycle_hook is not None:
                            await cycle_hook(store, reports[-1])
                        next_detect += detect_every_s
                        timings["page"] += time.perf_counter() - e
                    if int(sim.t) % 60 == 0:
                        e = time.perf_counter()
                        store.compact()
                        timings["compact"] += time.perf_counter() - e
                    if progress is not None and int(sim.t) % 60 == 0:
                        progress(sim.t, end_t)
            final = runner.cycle(int(sim.now_unix * 1000) + runner.settle_ms)
            if cycle_hook is not None:
                await cycle_hook(store, final)
            findings = store.findings.query(limit=100_000)
        finally:
            if pager is not None:
                await pager.close()
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
        pager=None if pager is None else pager.record,
    )


def _chain(
    pager: Pager | None, on_cycle: Callable[[Store, CycleReport], Awaitable[None]] | None
) -> Callable[[Store, CycleReport], Awaitable[None]] | None:
    """The pager first (as ``hbmwatch up`` alerts right after each cycle), then the caller's."""
    if pager is None or on_cycle is None:
        return on_cycle if pager is None else pager.on_cycle

    async def both(store: Store, report: CycleReport) -> None:
        await pager.on_cycle(store, report)
        await on_cycle(store, report)

    return both


def start_time(scenario: str, seed: int | None, *, hour: float | None = None,
               random_hour: bool = False) -> float | None:  # fmt: skip
    """When a run starts: ``hour`` of ``EVAL_START``'s day, or a random hour drawn from the
    scenario and seed (so reruns agree), to the minute; None keeps the scenario's own."""
    if random_hour:
        digest = hashlib.sha256(f"{scenario}|{seed}".encode()).digest()
        hour = int.from_bytes(digest[:4], "big") % (24 * 60) / 60.0
    if hour is None:
        return None
    if not 0 <= hour < 24:
        raise ValueError(f"start hour {hour:g} is not in [0, 24)")
    midnight = EVAL_START.replace(hour=0, minute=0, second=0)
    return midnight.timestamp() + hour * 3600.0


def _interval(kind: str, workload_scrape_s: float) -> float:
    """Exporters at 1 s; latency pages, whose quantiles span a minute, less often."""
    return 1.0 if kind in ("dme", "dcgm") else workload_scrape_s


def hourly_progress(label: str, stream: TextIO | None = None) -> Callable[[float, float], None]:
    """A ``progress`` that prints one line per simulated hour reached (a day-long run takes
    long enough that silence looks like a hang); runs under an hour print nothing."""
    printed = {"hour": 0}
    started = time.perf_counter()

    def report(t: float, end_t: float) -> None:
        hour = int(t // 3600)
        if hour > printed["hour"]:
            printed["hour"] = hour
            wall = time.perf_counter() - started
            print(f"{label}: simulated hour {hour} of {end_t / 3600:.1f} reached after "
                  f"{wall:.0f} s of wall time", file=stream or sys.stderr, flush=True)  # fmt: skip

    return report


def _run_one(
    source: str | Scenario, seed: int | None, duration_s: float | None, hour: float | None = None,
    random_hour: bool = False, http_scrape: bool = False, exporter_refresh: float | None = None,
) -> RunResult:  # fmt: skip
    scenario = source if isinstance(source, Scenario) else load_scenario(source)
    if exporter_refresh is not None:
        scenario = scenario.with_exporter_refresh(exporter_refresh)
    seed_used = scenario.seed if seed is None else seed
    start = start_time(scenario.name, seed_used, hour=hour, random_hour=random_hour)
    progress = hourly_progress(f"{scenario.name} seed {seed_used}")
    running = run_scenario(scenario, seed=seed, duration_s=duration_s, start_unix=start,
                           page=True, progress=progress, http_scrape=http_scrape)  # fmt: skip
    result = asyncio.run(running)
    result.cycles_detail = []  # the per-cycle reports stay in the worker
    return result


def _quiet_worker() -> None:
    from hbmwatch import log

    log.configure("warning")


def evaluate(
    sources: Sequence[str | Scenario],
    seeds: Sequence[int | None],
    *,
    jobs: int = 1,
    duration_s: float | None = None,
    done: Callable[[RunResult], None] | None = None,
    start_hour: float | None = None,
    random_start: bool = False,
    http_scrape: bool = False,
    exporter_refresh: float | None = None,
) -> list[RunResult]:
    """Every scenario (a name, a file or a ``Scenario``: ``eval --random``'s draws) at every
    seed, ``jobs`` runs at a time in worker processes; each run
    starts at ``start_hour`` of the simulated day, or a seeded random hour; ``http_scrape``
    scrapes the fleet over loopback HTTP (the default is in-process, same pages);
    ``exporter_refresh`` makes every node's exporter refresh its page that often (s)."""
    plan = [(s, seed) for s in sources for seed in seeds]
    for source, _ in plan:
        if not isinstance(source, Scenario):
            load_scenario(source)  # a bad name or file fails before any run starts
    start_time("check", None, hour=start_hour)  # a bad hour fails before any run starts
    when = (start_hour, random_start, http_scrape, exporter_refresh)
    results: list[RunResult] = []
    if jobs <= 1:
        for source, seed in plan:
            results.append(_run_one(source, seed, duration_s, *when))
            if done:
                done(results[-1])
        return results
    workers = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=get_context("spawn"),
        initializer=_quiet_worker,  # a spawned worker starts with the default (info) logging
    )
    with workers as pool:
        futures = [pool.submit(_run_one, s, seed, duration_s, *when) for s, seed in plan]
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
        "start_unix": r.truth.get("start_unix"),
        "truth": r.truth,
        "findings": [finding_to_dict(f) for f in r.findings],
    }
