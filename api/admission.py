"""Admission control: a cap on requests served at once, a bounded wait, a deadline per request.

Handlers run on worker threads that share the GIL with the collector, so 200 clients at once
must not mean 200 busy threads.  At most ``api.max_concurrent_requests`` requests are in the
app; up to ``api.max_queued_requests`` more wait at most ``api.queue_timeout_seconds`` for a
slot; the rest get a 503 with ``Retry-After`` at once.  A request not answered within
``api.request_timeout_seconds`` gets a 503; its handler finishes in the background and keeps
its slot until then, so abandoned work still counts against the cap.  Health checks and
``/metrics`` have a small lane of their own, so a busy API never looks dead to a prober.
"""

from __future__ import annotations

import asyncio
from collections import deque

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hbmwatch.api.middleware import send_error
from hbmwatch.settings import ApiSettings

#: Paths served from their own lane: probes and scrapes must get through a busy API.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
PROBE_CONCURRENCY = 2
RETRY_AFTER_SECONDS = "1"


class Lane:
    """``size`` slots and a FIFO of at most ``queue`` waiters (one event loop's)."""

    def __init__(self, size: int, queue: int) -> None:
        self.size, self.queue = size, queue
        self.active = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, timeout: float) -> str | None:
        """None once a slot is ours, else why not ("queue full", "waited too long")."""
        if self.active < self.size and not self.waiters:
            self.active += 1
            return None
        if len(self.waiters) >= self.queue:
            return "queue full"
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            if waiter.done():
                return None  # granted just as the wait ran out
            self._drop(waiter)
            return "waited too long"
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()
            else:
                self._drop(waiter)
            raise
        return None

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        waiter.cancel()
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def release(self) -> None:
        """Hand the slot to the oldest waiter, or free it."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; active stays
                return
        self.active -= 1


class Admission:
    """ASGI middleware: admission limits and request deadlines (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app = app
        self.settings = settings
        self.main = Lane(settings.max_concurrent_requests, settings.max_queued_requests)
        self.probes = Lane(PROBE_CONCURRENCY, settings.max_queued_requests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lane = self.probes if scope["path"] in PROBE_PATHS else self.main
        refused = await lane.acquire(self.settings.queue_timeout_seconds)
        if refused is not None:
            await send_error(
                send, 503, "overloaded",
                f"the API is busy ({lane.size} requests in flight, api.max_concurrent_requests; "
                f"{refused}); retry shortly",
                {"Retry-After": RETRY_AFTER_SECONDS},
            )  # fmt: skip
            return
        await self._serve(scope, receive, send, lane)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, lane: Lane) -> None:
        state = {"started": False, "abandoned": False}

        async def guarded(message: Message) -> None:
            if state["abandoned"]:
                return  # the client already has its 503
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, guarded))
        task.add_done_callback(lambda _: lane.release())
        done, _ = await asyncio.wait({task}, timeout=self.settings.request_timeout_seconds)
        if task in done or state["started"]:
            await task  # finished, or already answering: let it finish (or raise)
            return
        state["abandoned"] = True
        task.add_done_callback(_consume)
        limit = self.settings.request_timeout_seconds
        await send_error(
            send, 503, "request_timeout",
            f"no answer within {limit:g} s (api.request_timeout_seconds); narrow the request "
            "or retry later",
            {"Retry-After": RETRY_AFTER_SECONDS},
        )  # fmt: skip


def _consume(task: asyncio.Future[None]) -> None:
    """Read an abandoned request's outcome so its error is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()
