"""The HTTP server on a thread and event loop of its own.

``hbmwatch up`` runs the collector, detection and alerting on one asyncio loop.  Serving HTTP
on that loop too meant 200 clients' request parsing and responses competed with scrapes for
it; here uvicorn gets its own loop on its own thread, so ingest keeps its loop whatever the
API's load (and the admission limits in ``api.admission`` cap the handler threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import uvicorn
from starlette.types import ASGIApp

from hbmwatch import log

logger = log.get("hbmwatch.api")


class ApiServerError(RuntimeError):
    """The server could not start (port taken, bad address); the message says which."""


class _Server(uvicorn.Server):
    """uvicorn's server, telling the starting thread when it listens (or gave up)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


class ApiServer:
    """uvicorn on a daemon thread: ``start()``/``stop()``, or ``await serve(stop_event)``."""

    def __init__(
        self, app: ASGIApp, host: str = "127.0.0.1", port: int = 8427, *, grace: float = 5.0
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=grace,
        )
        self.server = _Server(config)
        self.address = f"{host}:{port}"
        self.thread: threading.Thread | None = None
        self._failure: str | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        sockets = [s for srv in self.server.servers for s in srv.sockets]
        if not sockets:
            raise ApiServerError("the API server is not listening")
        return int(sockets[0].getsockname()[1])

    def start(self, timeout: float = 60.0) -> None:
        """Start serving; returns once the socket listens, raises if it cannot."""
        self.thread = threading.Thread(target=self._run, name="hbmwatch-api", daemon=True)
        self.thread.start()
        self.server.ready.wait(timeout)
        if self.server.started:
            return
        self.stop(timeout=5.0)
        reason = self._failure or f"not listening after {timeout:g} s"
        raise ApiServerError(f"cannot serve the API on {self.address}: {reason}")

    def _run(self) -> None:
        try:  # signals stay with the main thread; serve() turns them into a stop
            asyncio.run(self.server.serve())
        except SystemExit:  # uvicorn's answer to a failed bind (it logs the OS error)
            self._failure = "the address is taken or cannot be bound (the log has the error)"
        except BaseException as exc:
            self._failure = repr(exc)
        finally:
            self.server.ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to finish open requests and exit, and wait for its thread."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.server.force_exit = True
                self.thread.join(timeout)

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or the server dies, then stop it.

        Drop-in for ``await uvicorn.Server(...).serve()`` in a composition root: the caller's
        loop only waits, HTTP runs on the server's own thread.  Signals stay with the caller
        (uvicorn cannot take them off the main thread): it sets ``stop`` on them.
        """
        try:
            await asyncio.to_thread(self.start)
            logger.info("api serving on its own thread", address=self.address)
            while not stop.is_set() and self.running:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        finally:
            await asyncio.to_thread(self.stop)
