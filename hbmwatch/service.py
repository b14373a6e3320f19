"""The composition root: what ``hbmwatch up`` runs, wired from the settings.

For now: the store (migrated), its maintenance loop (compaction and retention) and the API.
Later rooms (simulator, collector, detectors, alerts) join the same task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path

import uvicorn

from api.main import create_app
from hbmwatch import log
from hbmwatch.settings import Settings
from hbmwatch.validation import ConfigError
from simulator.runner import Simulation
from simulator.scenario import load_scenario
from simulator.server import SimServer, Target
from store.engine import create_store_engine
from store.migrate import upgrade
from store.store import Store, open_store

COMPACT_EVERY_SECONDS = 15.0
RETENTION_EVERY_SECONDS = 3600.0

logger = log.get("hbmwatch.service")


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
    engine = create_store_engine(settings.store.url)
    try:
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
        except Exception:
            logger.exception("store maintenance failed; retrying")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), COMPACT_EVERY_SECONDS)


async def start_simulator(settings: Settings) -> tuple[SimServer, list[Target]]:
    """Start the configured scenario's endpoints and write its ground truth."""
    sim_settings = settings.simulator
    scenario = load_scenario(sim_settings.scenario)
    sim = Simulation(scenario, seed=sim_settings.seed)
    server = SimServer(sim, base_port=sim_settings.base_port, speed=sim_settings.speed)
    try:
        targets = await server.start()
    except OSError as exc:
        await server.close()
        raise ConfigError(
            f"cannot serve the simulated fleet from port {sim_settings.base_port}: {exc}; set "
            "simulator.base_port (HBMWATCH_SIMULATOR__BASE_PORT=0 picks free ports)",
            field="simulator.base_port",
        ) from None
    sim.write_ground_truth(Path(sim_settings.truth_file))
    logger.info(
        "simulated fleet serving",
        scenario=scenario.name,
        gpus=sim.fleet.size,
        nodes=len(sim.fleet.nodes),
        targets=len(targets),
        first_port=server.ports[0],
        speed=sim_settings.speed,
        ground_truth=sim_settings.truth_file,
    )
    return server, targets


async def run(settings: Settings) -> None:
    revision = migrate(settings)
    store = open_store(settings.store)
    tune_gc()
    logger.info("store ready", url=_redact(settings.store.url), schema=revision)
    app = create_app(settings, store)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=settings.api.host, port=settings.api.port, log_config=None, access_log=False
        )
    )
    stop = asyncio.Event()
    logger.info("serving", url=f"http://{settings.api.host}:{settings.api.port}")
    sim_server: SimServer | None = None
    if settings.simulator.enabled is not False:
        logger.info(
            "no real targets configured: running the bundled simulated fleet",
            scenario=settings.simulator.scenario,
        )
        sim_server, _ = await start_simulator(settings)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(maintain(store, stop))
            if sim_server is not None:
                group.create_task(sim_server.run(stop))
            await server.serve()
            stop.set()
    finally:
        if sim_server is not None:
            await sim_server.close()
        store.close()


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
