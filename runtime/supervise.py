"""Keeping the service's long-running loops alive, and making sure the process ends.

Each loop (collector, detection, maintenance, delivery) runs under ``supervise``: an error
restarts that loop alone, after an exponentially growing pause, with a log line; only a
fatal error (the schema changed under us, bad configuration) ends the service.  A stop (a
signal, or a fatal error) arms a deadline after which the process exits even if a thread is
stuck in a database call, so it never hangs with its port open and silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

from hbmwatch import log
from hbmwatch.store.store import SchemaOutdated, StoreUnavailable
from hbmwatch.validation import ConfigError

logger = log.get("hbmwatch.runtime.service")

#: Errors no restart can fix: the service stops, exiting non-zero.
FATAL: tuple[type[BaseException], ...] = (SchemaOutdated, ConfigError, MemoryError)
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
#: A loop that ran this long before failing starts again from the first pause.
HEALTHY_RUN_SECONDS = 120.0
#: After a stop, the longest the process may take to end before it is ended for it.
EXIT_DEADLINE_SECONDS = 60.0


class FatalError(Exception):
    """A supervised loop failed in a way a restart cannot fix."""


async def supervise(
    name: str,
    loop: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    first_backoff: float = FIRST_BACKOFF_SECONDS,
    max_backoff: float = MAX_BACKOFF_SECONDS,
) -> None:
    """Run ``loop()`` until it returns or ``stop`` is set, restarting it after errors."""
    backoff = first_backoff
    while not stop.is_set():
        started = time.monotonic()
        try:
            await loop()
            return
        except FATAL as exc:
            raise FatalError(f"{name}: {type(exc).__name__}: {exc}") from exc
        except StoreUnavailable as exc:
            logger.warning("store unavailable; restarting", task=name, error=str(exc),
                           retry_in_s=backoff)  # fmt: skip
        except Exception:
            logger.exception("task failed; restarting", task=name, retry_in_s=backoff)
        if time.monotonic() - started >= HEALTHY_RUN_SECONDS:
            backoff = first_backoff
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff)
        backoff = min(backoff * 2, max_backoff)


@contextlib.contextmanager
def exits_on_fatal() -> Iterator[None]:
    """A fatal error out of a task group becomes one log line and exit status 1."""
    try:
        yield
    except* FatalError as group:
        for exc in group.exceptions:
            logger.error("fatal error; stopping", error=str(exc))
        raise SystemExit(1) from None  # the entry points' stop has armed exit_deadline


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, so every loop ends and the collector flushes its
    batch, instead of the process dying with samples in memory."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        if not stop.is_set():
            logger.info("stopping", signal=sig.name)
        stop.set()
        exit_deadline()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, handle, sig)


_deadline_armed = threading.Event()


def exit_deadline(seconds: float = EXIT_DEADLINE_SECONDS, code: int = 1) -> None:
    """Exit the process ``seconds`` from now unless it has ended by then (once).

    A daemon timer: a process that ends in time never waits for it.  What it guards against
    is a worker thread stuck in a database call that interpreter shutdown would wait on.
    For the process's own entry points (``run``, ``collect``) only: anything else sharing
    the process would be ended with it.
    """
    if _deadline_armed.is_set():
        return
    _deadline_armed.set()

    def expire() -> None:
        logger.error("shutdown did not finish in time; exiting", seconds=seconds)
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
