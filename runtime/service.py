"""The composition root: what ``hbmwatch up`` runs, wired from the settings.

The store (migrated) and its maintenance loop (compaction, retention), the simulated fleet
when no real targets are configured, the collector, the detectors and the API, in one
task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from hbmwatch import log
from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.server import ApiServerError
from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.targets import Target as CollectorTarget
from hbmwatch.collector.targets import TargetSet, default_timeout
from hbmwatch.collector.writer import BatchingSink, SpoolingWriter
from hbmwatch.runtime import roles
from hbmwatch.runtime.apiprocess import ApiProcess
from hbmwatch.runtime.delivering import deliver
from hbmwatch.runtime.delivering import on_own_loop as on_own_loop  # re-exported
from hbmwatch.runtime.detecting import detect
from hbmwatch.runtime.detecting import detect_only as detect_only  # re-exported for the CLI
from hbmwatch.runtime.leader import AlertLeader
from hbmwatch.runtime.supervise import exit_deadline, exits_on_fatal, stop_on_signals, supervise
from hbmwatch.settings import Settings
from hbmwatch.simulator.process import FleetSpec, SimProcess, SimulatorFailed
from hbmwatch.simulator.server import Target
from hbmwatch.status import ServiceStatus
from hbmwatch.store.engine import create_store_engine, is_sqlite
from hbmwatch.store.guard import unavailable
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store, StoreUnavailable, open_store
from hbmwatch.validation import ConfigError

COMPACT_EVERY_SECONDS = 15.0
RETENTION_EVERY_SECONDS = 3600.0
#: At a stop, how long the collector waits for a stuck store write before spooling instead.
DRAIN_SECONDS = 20.0

logger = log.get("hbmwatch.runtime.service")


def tune_gc() -> None:
    """Keep the collector's full passes off the series registry.

    The registry holds a million small long-lived objects at fleet scale; every full
    collection would walk all of them, costing the write path a third of its speed
    (docs/benchmarks.md).  Freeze what start-up built and collect young garbage less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def migrate(settings: Settings) -> str | None:
    """Upgrade the schema; an unreachable database is a one-line StoreUnavailable."""
    engine = create_store_engine(settings.store.url)
    try:
        with unavailable():
            return upgrade(engine)
    finally:
        engine.dispose()


async def maintain(store: Store, stop: asyncio.Event) -> None:
    """Compact closed minutes and apply retention until told to stop."""
    since_retention = RETENTION_EVERY_SECONDS
    while not stop.is_set():
        try:
            report = await asyncio.to_thread(store.compact)
            if report.minutes:
                logger.debug("compacted", minutes=report.minutes, samples=report.samples)
            since_retention += COMPACT_EVERY_SECONDS
            if since_retention >= RETENTION_EVERY_SECONDS:
                expired = await asyncio.to_thread(store.apply_retention)
                logger.info("retention applied", **expired)
                since_retention = 0.0
        except StoreUnavailable as exc:
            logger.warning("store maintenance skipped: store unavailable", error=str(exc))
        except Exception:
            logger.exception("store maintenance failed; retrying")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), COMPACT_EVERY_SECONDS)


async def start_simulator(settings: Settings) -> tuple[SimProcess, list[Target]]:
    """Start the configured scenario's endpoints in their own process; it writes the
    ground truth."""
    sim_settings = settings.simulator
    process = SimProcess(
        FleetSpec(
            scenario=sim_settings.scenario,
            seed=sim_settings.seed,
            base_port=sim_settings.base_port,
            speed=sim_settings.speed,
            truth_file=sim_settings.truth_file,
            log_level=settings.log_level,
            log_format=settings.log_format,
        )
    )
    try:
        fleet = await process.start()
    except SimulatorFailed as exc:
        raise ConfigError(str(exc), field="simulator") from None
    logger.info(
        "simulated fleet serving",
        scenario=fleet.scenario,
        gpus=fleet.gpus,
        nodes=fleet.nodes,
        targets=len(fleet.targets),
        first_port=fleet.first_port,
        speed=sim_settings.speed,
        ground_truth=sim_settings.truth_file,
    )
    return process, fleet.targets


def local_sources(settings: Settings) -> list[Any]:
    """This host's own GPUs, read in-process (NVML, amd-smi), as configured."""
    from hbmwatch.collector.sources.amdsmi import (
        AmdSmiCollector,
        AmdSmiLibraryCollector,
        SourceUnavailable,
        import_amdsmi,
    )
    from hbmwatch.collector.sources.nvidia_smi import NvidiaSmiCollector
    from hbmwatch.collector.sources.nvml import NvmlCollector, import_pynvml

    sources: list[Any] = []
    for kind in settings.collector.local_sources:
        try:
            if kind == "nvml":
                source: Any = NvmlCollector(import_pynvml())
                source.open()
            elif kind == "amdsmi-library":
                source = AmdSmiLibraryCollector(import_amdsmi(), host=socket.gethostname())
                source.open()
            elif kind == "amdsmi":
                source = AmdSmiCollector(host=socket.gethostname())
            else:
                source = NvidiaSmiCollector(host=socket.gethostname())
        except SourceUnavailable as exc:
            raise ConfigError(
                f"collector.local_sources: {kind}: {exc}", field="collector.local_sources"
            ) from None
        sources.append(source)
    if settings.collector.slurm_job_mapping_dir:
        from hbmwatch.collector.sources.slurm import SlurmJobMapping

        sources.append(SlurmJobMapping(settings.collector.slurm_job_mapping_dir))
    return sources


def build_collector(
    settings: Settings,
    store: Store,
    extra: list[CollectorTarget],
    registry: CollectorRegistry | None = None,
) -> ScrapeEngine:
    """The collector wired to the store: spool, batching sink, targets, inventory."""
    c, remote = settings.collector, settings.store.remote
    spool = Spool(Path(c.spool_dir), c.spool_max_bytes, registry)
    if remote.enabled:  # one batch, one remote-write request; back off while it is down
        writer = SpoolingWriter(store.write, spool, remote.retry_min_seconds,
                                remote.retry_max_seconds)  # fmt: skip
        batch = min(c.flush_samples, remote.max_samples_per_request)
    else:
        writer, batch = SpoolingWriter(store.write, spool), c.flush_samples
    sink = BatchingSink(writer, batch, c.flush_seconds, drain_seconds=DRAIN_SECONDS)
    return ScrapeEngine(
        TargetSet(c, extra),
        sink,
        c,
        inventory=store.upsert_devices,
        local_sources=local_sources(settings),
        registry=registry,
    )


def simulator_targets(targets: list[Target], settings: Settings) -> list[CollectorTarget]:
    interval = settings.collector.interval_seconds
    timeout = settings.collector.timeout_seconds or default_timeout(interval)
    return [CollectorTarget(t.kind, t.url, dict(t.labels), interval, timeout) for t in targets]


async def run(settings: Settings) -> None:
    revision = migrate(settings)
    registry = CollectorRegistry()
    store = open_store(settings.store, registry=registry)
    tune_gc()
    logger.info("store ready", url=_redact(settings.store.url), schema=revision)
    delivering = settings.alerts.enabled and bool(settings.alerts.receivers)
    status = ServiceStatus(collector_interval_seconds=settings.collector.interval_seconds)
    alerting: Alerting | None = None
    leader: AlertLeader | None = None

    def alerting_for_api() -> Alerting:  # the service's (or leader's) engine, else one made
        nonlocal alerting
        if leader is not None and leader.alerting is not None:
            return leader.alerting
        if alerting is None:
            alerting = Alerting(store, settings.alerts)
            alerting.start()
        return alerting

    api = ApiProcess(settings, status, registry, alerting_for_api,
                     dispatcher_registered=delivering)  # fmt: skip
    stop = asyncio.Event()
    logger.info("serving", url=f"http://{settings.api.host}:{settings.api.port}")
    sim_server: SimProcess | None = None
    extra: list[CollectorTarget] = []
    simulate = settings.simulator.enabled
    if simulate or (simulate is None and not settings.collector.configured):
        logger.info(
            "no real targets configured: running the bundled simulated fleet",
            scenario=settings.simulator.scenario,
        )
        sim_server, sim_targets = await start_simulator(settings)
        extra = simulator_targets(sim_targets, settings)
    collector = build_collector(settings, store, extra, registry)
    status.collector_last_round_ms = lambda: collector.last_round_ms
    _log_start(collector)
    stop_on_signals(stop)
    if settings.detection.enabled:
        status.detection_interval_seconds = settings.detection.interval_seconds
    try:
        # HTTP first, in its own process (readers never starve ingest): it answers, and says
        # what is not ready yet, while the detectors load their state and warm up.
        try:
            await api.start()
        except ApiServerError as exc:
            raise ConfigError(str(exc), field="api.port") from None
        with exits_on_fatal():
            async with asyncio.TaskGroup() as group:
                spawn = functools.partial(_spawn, group, stop)
                spawn("maintenance", lambda: maintain(store, stop))
                if sim_server is not None:
                    group.create_task(sim_server.wait(stop))
                spawn("collector", lambda: collector.run(stop))
                inline = is_sqlite(settings.store.url)  # else one process leads, elected
                if settings.alerts.enabled and inline:
                    alerting = Alerting(store, settings.alerts)
                    await asyncio.to_thread(alerting.start)
                    if delivering:
                        spawn("delivery", lambda: deliver(store, settings, stop, registry))
                elif settings.alerts.enabled:
                    leader = AlertLeader(store, settings, registry, deliver if delivering else None)
                    spawn("alert leader", lambda: leader.run(stop))
                if settings.detection.enabled:
                    sharded = not roles.plan(settings.detection).single
                    detecting = functools.partial(detect, store, settings.detection, stop,
                                                  alerting, status, shared=sharded)  # fmt: skip
                    spawn("detection", detecting)
                try:
                    await supervise("api", lambda: api.serve(stop), stop)
                finally:  # cancelled too: every loop ends
                    stop.set()
                    exit_deadline()
    finally:
        await api.stop()
        if sim_server is not None:
            await sim_server.stop()
        store.close()


def _spawn(
    group: asyncio.TaskGroup, stop: asyncio.Event, name: str, loop: Callable[[], Awaitable[None]]
) -> None:
    """Run ``loop`` in ``group``, restarted after errors (runtime/supervise.py)."""
    group.create_task(supervise(name, loop, stop))


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


async def collect(
    settings: Settings, *, once: bool = False, seconds: float | None = None
) -> list[Any]:
    """``hbmwatch collect``: the collector and the store's maintenance, nothing else."""
    store = open_store(settings.store)
    tune_gc()
    collector = build_collector(settings, store, [])
    stop = asyncio.Event()
    try:
        if once:
            async with collector:
                reports = await collector.scrape_round()
            await collector.sink.flush()
            return reports
        _log_start(collector)
        stop_on_signals(stop)
        with exits_on_fatal():
            async with asyncio.TaskGroup() as group:
                _spawn(group, stop, "maintenance", lambda: maintain(store, stop))
                _spawn(group, stop, "collector", lambda: collector.run(stop))
                group.create_task(_report_progress(collector, stop))
                if seconds is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), seconds)
                    stop.set()
        _log_totals(collector, "collector stopped")
        return []
    finally:
        stop.set()
        exit_deadline()
        store.close()


async def _report_progress(
    collector: ScrapeEngine, stop: asyncio.Event, every: float = 60.0
) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        _log_totals(collector, "collector progress")


def _log_start(collector: ScrapeEngine) -> None:
    logger.info(
        "collector starting",
        shard=str(collector.targets.shard),
        targets=len(collector.current_targets()),
        targets_total=collector.targets.total,
        local_sources=len(collector.local_sources),
    )


def _log_totals(collector: ScrapeEngine, event: str) -> None:
    """What the collector has written so far (``bench scale`` checks it against the engine)."""
    t = collector.sink.totals
    down = [s.target.url for s in collector.states if s.up is False]
    logger.info(
        event,
        written=t.accepted,
        rejected=t.rejected,
        spooled=t.spooled,
        replayed=t.replayed,
        targets=len(collector.states),
        down=len(down),
    )
