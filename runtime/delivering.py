"""Alert delivery on a loop of its own: what the leader (or ``up`` on SQLite) runs to send.

Delivery reads the store synchronously; on its own thread and event loop a locked or slow
store cannot freeze the collector's or the detectors' loop while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from hbmwatch import log
from hbmwatch.alerts.delivery import Dispatcher
from hbmwatch.settings import Settings
from hbmwatch.store.store import Store

logger = log.get("hbmwatch.runtime.service")


async def deliver(
    store: Store, settings: Settings, stop: asyncio.Event, registry: CollectorRegistry | None = None
) -> None:
    """Send alerts to the configured receivers until told to stop.

    On a thread and loop of its own: delivery reads the store synchronously, and a locked or
    slow store must not freeze the collector's loop while it waits.
    """
    logger.info("alert delivery starting",
                receivers=[f"{r.kind}:{r.name}" for r in settings.alerts.receivers])  # fmt: skip

    async def dispatch(own_stop: asyncio.Event) -> None:
        dispatcher = Dispatcher(store.alerts, settings.alerts, clock=time.time, registry=registry)
        try:
            await dispatcher.run(own_stop)
        finally:
            await dispatcher.aclose()

    await on_own_loop(dispatch, stop)


async def on_own_loop(
    main: Callable[[asyncio.Event], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Run ``main(own_stop)`` on a new event loop in a worker thread until ``stop`` is set."""
    handle: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def body() -> None:
        handle.append((asyncio.get_running_loop(), asyncio.Event()))
        await main(handle[0][1])

    worker = asyncio.ensure_future(asyncio.to_thread(asyncio.run, body()))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([worker, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if handle:
            loop, own_stop = handle[0]
            with contextlib.suppress(RuntimeError):  # that loop already ended
                loop.call_soon_threadsafe(own_stop.set)
        await worker  # its errors are the caller's (supervise restarts it)
