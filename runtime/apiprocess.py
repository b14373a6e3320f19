"""The API in a process of its own, for ``hbmwatch up``.

On a thread of the service's process the API still shared its GIL and its core: 200
clients' request parsing, JSON encoding and query work left the collector 85% of its
scrapes (docs/reliability.md).  In a child process readers compete with ingest only as the
operating system schedules them, and the child runs at a lower priority (``api.nice``), so
when the CPU is short the collector gets it first and readers wait.

The child opens the store itself; what only the service knows (its status, its metrics, its
alerting engine) it asks for over a pipe (``runtime/relay.py``).  If the child dies the
service keeps collecting and starts another; if the service dies the child sees the pipe
close and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import CollectorRegistry

from hbmwatch import log
from hbmwatch.api.server import ApiServerError
from hbmwatch.runtime.relay import RelayServer, StatusView
from hbmwatch.settings import Settings
from hbmwatch.status import ServiceStatus

logger = log.get("hbmwatch.api")

START_TIMEOUT_SECONDS = 120.0
#: After SIGTERM: uvicorn's grace for open requests, then this long before a kill.
STOP_TIMEOUT_SECONDS = 15.0


class ApiProcessDied(RuntimeError):
    """The API's process ended without being asked to; the service starts another."""


@dataclass(frozen=True)
class ApiSpec:
    """What the child needs (picklable): the settings and the service's status at spawn."""

    settings: Settings
    status: StatusView
    dispatcher_registered: bool


class ApiProcess:
    """``await start()`` once (a bad port raises ApiServerError), then ``await serve(stop)``
    under ``supervise``: it returns at stop, raises if the child died, and starts a new
    child when called again."""

    def __init__(
        self,
        settings: Settings,
        status: ServiceStatus,
        registry: CollectorRegistry,
        alerting: Callable[[], Any],
        *,
        dispatcher_registered: bool = False,
    ) -> None:
        self.settings, self.status, self.registry = settings, status, registry
        self.alerting, self.dispatcher_registered = alerting, dispatcher_registered
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    async def start(self, timeout: float = START_TIMEOUT_SECONDS) -> str:
        """Spawn the child and wait until it listens; returns its address."""
        context = multiprocessing.get_context("spawn")  # no inherited threads or loop
        self._conn, child_conn = context.Pipe()
        spec = ApiSpec(_portable(self.settings), StatusView.of(self.status),
                       self.dispatcher_registered)  # fmt: skip
        self._process = context.Process(
            target=_child_main, args=(spec, child_conn), name="hbmwatch-api", daemon=True
        )
        self._process.start()
        child_conn.close()
        try:
            kind, payload = await asyncio.to_thread(self._first_message, timeout)
        except ApiServerError:
            await self.stop()
            raise
        if kind != "listening":
            await self.stop()
            raise ApiServerError(str(payload))
        RelayServer(self._conn, self.status, self.registry, self.alerting).start()
        logger.info("api serving in its own process", address=payload, pid=self._process.pid)
        return str(payload)

    def _first_message(self, timeout: float) -> tuple[str, Any]:
        assert self._conn is not None
        if not self._conn.poll(timeout):
            raise ApiServerError(f"the API's process did not listen within {timeout:g} s")
        try:
            return self._conn.recv()
        except EOFError:
            code = self._process.exitcode if self._process else None
            raise ApiServerError(f"the API's process exited while starting (code {code})") \
                from None  # fmt: skip

    async def serve(self, stop: asyncio.Event) -> None:
        if not self.alive:  # a restart after the child died
            await self.start()
        while not stop.is_set() and self.alive:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        if not stop.is_set():
            code = self._process.exitcode
            self._process = None
            raise ApiProcessDied(f"the API's process exited (code {code}); starting another")

    async def stop(self) -> None:
        """SIGTERM (open requests finish), then a kill if it outlives the timeout."""
        process, self._process = self._process, None
        if process is not None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await asyncio.to_thread(process.join, STOP_TIMEOUT_SECONDS)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, STOP_TIMEOUT_SECONDS)
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _portable(settings: Settings) -> Settings:
    """The same values in the ``Settings`` class itself: a TOML file's settings are a local
    subclass, which cannot be pickled to the child."""
    return Settings.model_construct(**{name: getattr(settings, name)
                                       for name in Settings.model_fields})  # fmt: skip


def _child_main(spec: ApiSpec, conn: Connection) -> None:
    """The API process: the app over its own store, serving until SIGTERM or orphaned."""
    settings = spec.settings
    log.configure(settings.log_level, settings.log_format)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with contextlib.suppress(OSError):  # readers yield the CPU to ingest
        os.nice(settings.api.nice)
    try:
        server, store, mirror = _build(spec, conn, stopping.set)
    except Exception as exc:  # every start failure goes back to the parent as one line
        with contextlib.suppress(OSError):
            conn.send(("failed", _start_error(exc)))
        return
    try:
        conn.send(("listening", server.address))
        mirror.start()
        stopping.wait()
    finally:
        mirror.stop()
        server.stop()
        store.close()


def _build(spec: ApiSpec, conn: Connection, on_gone: Callable[[], None]) -> tuple[Any, Any, Any]:
    from hbmwatch.api.main import create_app
    from hbmwatch.api.server import ApiServer
    from hbmwatch.runtime.relay import AlertingProxy, RelayClient, RelayedMetrics, StatusMirror
    from hbmwatch.store.store import open_store

    settings = spec.settings
    store = open_store(settings.store)
    try:
        client = RelayClient(conn)
        status = ServiceStatus()
        spec.status.apply_to(status)
        registry = CollectorRegistry()
        app = create_app(settings, store, registry=registry, status=status,
                         dispatcher_registered=spec.dispatcher_registered)  # fmt: skip
        app.state.alerting = AlertingProxy(client, store)
        registry.register(RelayedMetrics(client))
        server = ApiServer(app, settings.api.host, settings.api.port)
        server.start()
    except BaseException:
        store.close()
        raise
    return server, store, StatusMirror(client, status, on_gone)


def _start_error(exc: Exception) -> str:
    if isinstance(exc, ApiServerError):
        return str(exc)
    return f"cannot start the API: {type(exc).__name__}: {exc}"
