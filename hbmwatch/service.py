"""The composition root: what ``hbmwatch up`` runs, wired from the settings.

For now: the store (migrated), its maintenance loop (compaction and retention) and the API.
Later rooms (simulator, collector, detectors, alerts) join the same task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

import uvicorn

from api.main import create_app
from hbmwatch import log
from hbmwatch.settings import Settings
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
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(maintain(store, stop))
            await server.serve()
            stop.set()
    finally:
        store.close()


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
