"""What the API's process asks of the service's: its status, its metrics, its alerting.

Under ``hbmwatch up`` the API runs in a process of its own (``runtime/apiprocess.py``) so
that 200 readers cannot take the collector's CPU time or GIL.  Most of what the API serves
comes from the store, which both processes open; three things live only in the service:

- its status (the collector's last round, detection timing, the newest derived signals),
  which readiness and ``/metrics`` report;
- its metrics registry (collector, store and delivery counters), which ``/metrics`` serves;
- its alerting engine, the one writer of alert and incident state: an acknowledgement made
  on a second engine would be overwritten by the service's next save.

The API process asks for them over a pipe, one request at a time; a thread in the service
answers, so a busy event loop there never delays an answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from hbmwatch import log
from hbmwatch.status import FleetSnapshot, ServiceStatus
from hbmwatch.store.guard import StoreUnavailable

logger = log.get("hbmwatch.runtime.relay")

#: How long the API process waits for the service's answer before giving up (a 503).
CALL_TIMEOUT_SECONDS = 30.0
#: Sent instead of a snapshot the API process already has.
UNCHANGED: Any = "unchanged"
#: Alerting's calls the API makes; nothing else crosses the pipe to the engine.
ALERTING_CALLS = ("add_silence", "expire_silence", "acknowledge", "resolve")


class ServiceBusy(StoreUnavailable):
    """The service's process did not answer in time (stuck, or stopping): try again later."""


class ServiceGone(StoreUnavailable):
    """The service's process has ended: its end of the pipe is closed."""


@dataclass(frozen=True)
class StatusView:
    """A picklable copy of the service's ``ServiceStatus``."""

    started_at: float
    last_round_ms: int | None  # None: no collector runs
    collector_interval_seconds: float
    detection_interval_seconds: float | None
    last_cycle_at: float | None
    last_cycle_seconds: float | None
    snapshot: FleetSnapshot | None

    @classmethod
    def of(cls, status: ServiceStatus) -> StatusView:
        getter = status.collector_last_round_ms
        return cls(
            status.started_at, None if getter is None else getter(),
            status.collector_interval_seconds, status.detection_interval_seconds,
            status.last_cycle_at, status.last_cycle_seconds, status.snapshot,
        )  # fmt: skip

    def apply_to(self, status: ServiceStatus) -> None:
        last = self.last_round_ms
        status.started_at = self.started_at
        status.collector_last_round_ms = None if last is None else (lambda: last)
        status.collector_interval_seconds = self.collector_interval_seconds
        status.detection_interval_seconds = self.detection_interval_seconds
        status.last_cycle_at = self.last_cycle_at
        status.last_cycle_seconds = self.last_cycle_seconds
        status.snapshot = self.snapshot


class RelayServer:
    """The service's side: answers the API process's requests on a thread of its own."""

    def __init__(
        self,
        conn: Connection,
        status: ServiceStatus,
        registry: CollectorRegistry,
        alerting: Callable[[], Any],
    ) -> None:
        self.conn, self.status, self.registry, self.alerting = conn, status, registry, alerting
        self.thread = threading.Thread(target=self._serve, name="hbmwatch-relay", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                seq, request = self.conn.recv()
            except (EOFError, OSError):  # the API process ended: nothing more to answer
                return
            reply = self._answer(request)
            try:
                self.conn.send((seq, reply))
            except (OSError, ValueError):
                return
            except Exception as exc:  # an answer that cannot be pickled: say so instead
                self.conn.send((seq, ("error", RuntimeError(f"unsendable answer: {exc}"))))

    def _answer(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            match request:
                case ("status", known_frame_ms):
                    view = StatusView.of(self.status)
                    snap = view.snapshot
                    if snap is not None and snap.frame_end_ms == known_frame_ms:
                        view = dataclasses.replace(view, snapshot=UNCHANGED)
                    return "ok", view
                case ("metrics",):
                    return "ok", list(self.registry.collect())
                case ("alerting", str(call), args, kwargs) if call in ALERTING_CALLS:
                    return "ok", getattr(self.alerting(), call)(*args, **kwargs)
            return "error", ValueError(f"unknown request {request[:2]!r}")
        except Exception as exc:  # the caller re-raises it: a 404, a 409, a 503
            return "error", _picklable(exc)


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class RelayClient:
    """The API process's side: one request at a time over the pipe, each with a deadline."""

    def __init__(self, conn: Connection, timeout: float = CALL_TIMEOUT_SECONDS) -> None:
        self.conn, self.timeout = conn, timeout
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def call(self, *request: Any) -> Any:
        with self._lock:
            seq = next(self._seq)
            try:
                self.conn.send((seq, request))
                reply = self._reply(seq)
            except (EOFError, OSError) as exc:
                raise ServiceGone(f"the service's process is gone: {exc}") from None
        kind, value = reply
        if kind == "error":
            raise value
        return value

    def _reply(self, seq: int) -> tuple[str, Any]:
        while self.conn.poll(self.timeout):
            got, reply = self.conn.recv()
            if got == seq:
                return reply  # older ones timed out: their callers have had their 503
        raise ServiceBusy(f"the service did not answer within {self.timeout:g} s")


class AlertingProxy:
    """Stands in for ``Alerting`` in the API process: each action runs in the service."""

    def __init__(self, client: RelayClient, store: Any) -> None:
        self.client, self.store = client, store

    def __getattr__(self, call: str) -> Callable[..., Any]:
        if call not in ALERTING_CALLS:
            raise AttributeError(call)
        return lambda *args, **kwargs: self.client.call("alerting", call, args, kwargs)


class RelayedMetrics(Collector):
    """The service's registry, collected at each ``/metrics`` of the API process."""

    def __init__(self, client: RelayClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self.client.call("metrics")
        except StoreUnavailable as exc:  # the API's own metrics still answer
            logger.warning("service metrics unavailable", error=str(exc))

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only: no call at registration


class StatusMirror:
    """Keeps the API process's ``ServiceStatus`` a copy of the service's, every ``every`` s.

    ``on_gone`` runs once when the service's process no longer answers the pipe (it ended),
    so an orphaned API process stops rather than serve stale readiness.
    """

    def __init__(
        self, client: RelayClient, status: ServiceStatus, on_gone: Callable[[], None],
        every: float = 0.5,
    ) -> None:  # fmt: skip
        self.client, self.status, self.on_gone, self.every = client, status, on_gone, every
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hbmwatch-status", daemon=True)

    def refresh(self) -> None:
        """Copy the service's status; the snapshot (a value per GPU) only when it is new."""
        known = self.status.snapshot.frame_end_ms if self.status.snapshot else None
        view: StatusView = self.client.call("status", known)
        if view.snapshot == UNCHANGED:  # a copy across the pipe: compared by value
            view = dataclasses.replace(view, snapshot=self.status.snapshot)
        view.apply_to(self.status)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.refresh()
            except ServiceGone:
                self.on_gone()
                return
            except ServiceBusy as exc:
                logger.warning("service status unavailable", error=str(exc))
            except Exception:
                with contextlib.suppress(Exception):
                    logger.exception("status refresh failed")
