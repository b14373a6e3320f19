"""Work that may block on the store runs off the collector's event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hbmwatch.runtime.service import on_own_loop


def test_a_blocking_loop_on_its_own_thread_leaves_the_main_loop_free() -> None:
    """Delivery reads the store synchronously: a locked store must not freeze scraping."""
    release = threading.Event()
    seen: dict[str, object] = {}

    async def blocking(own_stop: asyncio.Event) -> None:
        seen["thread"] = threading.current_thread()
        release.wait(60)  # a store call stuck on a lock, as far as the loop can tell
        await own_stop.wait()

    async def main() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(on_own_loop(blocking, stop))
        ticks = 0
        deadline = time.monotonic() + 60
        while ticks < 20 and time.monotonic() < deadline:  # the main loop keeps running
            await asyncio.sleep(0.01)
            ticks += 1
        release.set()
        stop.set()
        await asyncio.wait_for(task, 60)
        return ticks

    assert asyncio.run(main()) == 20
    assert seen["thread"] is not threading.main_thread()


def test_errors_of_the_own_loop_reach_the_caller() -> None:
    async def failing(own_stop: asyncio.Event) -> None:
        raise ValueError("boom")

    async def main() -> None:
        await on_own_loop(failing, asyncio.Event())

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())
