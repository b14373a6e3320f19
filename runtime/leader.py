"""The alert leader: exactly one process builds incidents and delivers, elected in PostgreSQL.

Every detection process writes its findings to the store; every candidate (``hbmwatch
detect`` or ``up`` with alerting on) tries the leader lock (``store/leader.py``) every
``POLL_SECONDS``, its first try ``STANDBY_SECONDS`` after it starts (a leader restarted at
once must not win the lock back from the candidates already standing).  The winner loads
the alerting state from the store, then feeds ``Alerting.process`` with the findings any
process stated since its cursor (re-reading an ``OVERLAP_MS`` window, as a shard may write
a cycle late, and skipping the statements it already took) and runs the dispatcher.  When
the leader dies its lock goes with its connection; the next candidate resumes from the
saved cursor.  What the dead leader sent but had not yet recorded is sent again:
Alertmanager de-duplicates it (the same labels are the same alert), so on-call is paged
once.  A webhook receiver has no such de-duplication: behind a leader change it may get a
notification twice (docs/scale.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from hbmwatch import log
from hbmwatch.alerts.runner import Alerting
from hbmwatch.records import Finding
from hbmwatch.settings import Settings
from hbmwatch.store.leader import LeaderLock, OnlyProcess, leader_lock
from hbmwatch.store.store import Store, StoreUnavailable

POLL_SECONDS = 2.0
#: A candidate that just started waits this long before its first try, so every candidate
#: already standing (trying every ``POLL_SECONDS``) tries at least twice first.  The lock
#: is free the moment its holder dies; without the wait, a leader restarted by its
#: supervisor could win it back before the survivors' next poll: leadership would return
#: to the process that just failed (a crash loop leads again each time), and each change
#: of leader is a window for a duplicate webhook page.
STANDBY_SECONDS = 3 * POLL_SECONDS
FEED_SECONDS = 1.0
OVERLAP_MS = 600_000
CURSOR_STATE = "alerts:leader:findings_ms"

logger = log.get("hbmwatch.runtime.leader")


class FindingFeed:
    """Findings stated since a cursor, each statement handed over once."""

    def __init__(self, store: Store, overlap_ms: int = OVERLAP_MS) -> None:
        self.store = store
        self.overlap_ms = overlap_ms
        saved = store.get_state(CURSOR_STATE)
        self.cursor_ms: int = int(saved) if saved is not None else store.now_ms()
        self._taken: dict[str, Finding] = {}

    def first(self) -> list[Finding]:
        """At taking over: every open finding, and what was stated since the saved cursor."""
        stated = self.store.findings.updated_since(self.cursor_ms - self.overlap_ms)
        live = self.store.findings.query(open_only=True, limit=5000)
        return self._new([*live, *stated])

    def next(self) -> list[Finding]:
        return self._new(self.store.findings.updated_since(self.cursor_ms - self.overlap_ms))

    def _new(self, findings: list[Finding]) -> list[Finding]:
        fresh = {f.id: f for f in findings if self._taken.get(f.id) != f}
        return list(fresh.values())

    def taken(self, findings: list[Finding]) -> None:
        """Remember what alerting took, move the cursor, forget what left the window."""
        for f in findings:
            self._taken[f.id] = f
            self.cursor_ms = max(self.cursor_ms, f.updated_ms)
        low = self.cursor_ms - 2 * self.overlap_ms
        self._taken = {k: f for k, f in self._taken.items() if f.updated_ms >= low or f.open}
        if findings:
            self.store.put_state(CURSOR_STATE, self.cursor_ms)


class AlertLeader:
    """Candidate, then leader while the lock holds: alerting fed from the store, delivery."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        deliver: Callable[..., object] | None = None,
        lock: LeaderLock | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.registry = registry
        self.lock = lock or leader_lock(settings.store.url)
        self.alerting: Alerting | None = None
        self._deliver = deliver
        self._gauge = Gauge("hbmwatch_alert_leader", "1 while this process leads alerting "
                            "(builds incidents and delivers), else 0.",
                            registry=registry)  # fmt: skip
        self._gauge.set(0)
        self._led = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by ``STANDBY_SECONDS``, then try the lock every ``POLL_SECONDS``; lead while
        it holds.  On SQLite the one process has no one to stand by for."""
        if not isinstance(self.lock, OnlyProcess):
            await _pause(stop, STANDBY_SECONDS)
        while not stop.is_set():
            try:
                won = await asyncio.to_thread(self.lock.try_acquire)
            except Exception as exc:  # the database is down: candidates wait it out
                logger.warning("alert leader election failed; retrying", error=str(exc))
                won = False
            if won:
                await self._lead(stop)
            await _pause(stop, POLL_SECONDS)
        await asyncio.to_thread(self.lock.release)

    async def _lead(self, stop: asyncio.Event) -> None:
        logger.info("alert leader acquired")
        self._gauge.set(1)
        self._led += 1
        lead_stop = asyncio.Event()
        delivery: asyncio.Task[object] | None = None
        try:
            alerting = Alerting(self.store, self.settings.alerts)
            await asyncio.to_thread(alerting.start)
            self.alerting = alerting
            feed = await asyncio.to_thread(FindingFeed, self.store)
            await self._feed(alerting, feed, first=True)
            if self._deliver is not None:  # metrics are registered by the first leadership
                registry = self.registry if self._led == 1 else None
                delivery = asyncio.ensure_future(
                    self._deliver(self.store, self.settings, lead_stop, registry)
                )
            while not stop.is_set() and await asyncio.to_thread(self.lock.held):
                if delivery is not None and delivery.done():
                    delivery.result()  # its error ends this leadership (and is logged)
                await self._feed(alerting, feed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), FEED_SECONDS)
        except StoreUnavailable as exc:
            logger.warning("alert leader stepping down: store unavailable", error=str(exc))
        except Exception:
            logger.exception("alert leader failed; stepping down")
        finally:
            lead_stop.set()
            if delivery is not None:
                with contextlib.suppress(Exception):
                    await delivery
            self.alerting = None
            self._gauge.set(0)
            await asyncio.to_thread(self.lock.release)
            if not stop.is_set():
                logger.warning("alert leader lost")

    async def _feed(self, alerting: Alerting, feed: FindingFeed, first: bool = False) -> None:
        findings = await asyncio.to_thread(feed.first if first else feed.next)
        if findings:
            await asyncio.to_thread(alerting.process, findings)
        await asyncio.to_thread(feed.taken, findings)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
