"""Writes collected samples to the store in batches; spools them while the store is down.

The event loop only batches: a writer thread of its own does the store writes, so a slow or
blocked store (a PostgreSQL connect timeout, another process holding SQLite's lock) never
freezes scraping or the API.  Batches wait for that thread in a short queue; when the queue
is full (the writer is stuck in a write) the loop spools the batch itself, which costs a
gzip and an fsync, never a store round trip.  Every batch is numbered when it is handed
off, and the spool replays in number order, so samples reach the store in scrape order.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hbmwatch import log
from hbmwatch.collector.spool import Spool
from hbmwatch.records import Sample
from hbmwatch.store.store import StoreUnavailable, WriteResult

logger = log.get("hbmwatch.collector")

#: Batches that may wait for the writer thread before the loop spools them itself.
MAX_QUEUED_BATCHES = 4
#: A writer thread with nothing to do for this long ends; the next batch starts another.
WRITER_IDLE_SECONDS = 5.0
#: A write in progress for longer than this is stuck, not slow: batches stop being merged.
STUCK_SECONDS = 1.0


@dataclass
class Flushed:
    samples: int = 0
    accepted: int = 0
    rejected: int = 0
    spooled: int = 0
    replayed: int = 0

    def add(self, other: Flushed) -> None:
        self.samples += other.samples
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.spooled += other.spooled
        self.replayed += other.replayed


class SpoolingWriter:
    """Order is kept: while anything waits in the spool, new batches queue behind it.

    After a failed attempt the store is tried again ``retry_seconds`` later; with
    ``retry_max_seconds`` the wait doubles after each further failure up to that bound (a
    remote-write receiver that is down is not hammered), and is reset by a success.
    """

    def __init__(
        self,
        write: Callable[[list[Sample]], WriteResult],
        spool: Spool,
        retry_seconds: float = 2.0,
        retry_max_seconds: float | None = None,
    ) -> None:
        self._write = write
        self.spool = spool
        self.retry_seconds = retry_seconds
        self.retry_max_seconds = retry_max_seconds or retry_seconds
        self._delay = retry_seconds
        self._lock = threading.Lock()
        self._last_attempt = -float("inf")
        self._failing = False  # the last store attempt failed: wait retry_seconds
        self.last_result: WriteResult | None = None

    def write(self, samples: list[Sample], seq: int | None = None) -> Flushed:
        """Write one batch (numbered ``seq`` when handed off), or spool it.

        While the spool holds batches the store is retried at most every ``retry_seconds``,
        so an outage costs one failed attempt per retry, not one per batch.
        """
        with self._lock:
            done = Flushed(samples=len(samples))
            if self.spool.pending():
                waited = time.monotonic() - self._last_attempt
                if self._failing and waited < self._delay:
                    return self._spooled(samples, seq, done)
                self._last_attempt = time.monotonic()
                try:  # once the store answers, every batch drains what is spooled ahead of it
                    done.replayed = self.spool.replay(self._write, before=seq)
                except StoreUnavailable:
                    self._failed()
                    return self._spooled(samples, seq, done)
                self._succeeded()
                if done.replayed:
                    logger.info("store is back; spool replayed", samples=done.replayed)
            try:
                result = self._write(samples)
            except StoreUnavailable as exc:
                if not self.spool.pending():
                    logger.warning("store unavailable; spooling", error=str(exc))
                self._last_attempt = time.monotonic()
                self._failed()
                return self._spooled(samples, seq, done)
            self._succeeded()
            self.last_result = result
            done.accepted, done.rejected = result.accepted, result.rejected_total
            return done

    def _failed(self) -> None:
        if self._failing:
            self._delay = min(self._delay * 2, self.retry_max_seconds)
        self._failing = True

    def _succeeded(self) -> None:
        self._failing = False
        self._delay = self.retry_seconds

    def _spooled(self, samples: list[Sample], seq: int | None, done: Flushed) -> Flushed:
        self.spool.append(samples, seq)
        done.spooled = len(samples)
        return done


@dataclass
class _Batch:
    samples: list[Sample]
    seq: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Flushed = field(default_factory=Flushed)
    waiter: asyncio.Future[None] | None = None


class BatchingSink:
    """Collects samples from many scrapes and writes them in batches (see module doc).

    What a kill -9 can lose is what is still in memory: the pending batch (at most
    ``flush_seconds`` or ``flush_samples``) and up to ``MAX_QUEUED_BATCHES`` + 1 batches
    waiting for, or inside, a store write.  A stop flushes all of them (``flush``).

    A batch handed off while the last one still waits for a busy writer joins it, up to
    ``flush_samples``: a slow store then takes fewer, larger writes (each costs a
    transaction) instead of falling behind until batches spool, which costs a gzip and an
    fsync here and a decode in the writer.  A writer stuck in one write for
    ``STUCK_SECONDS`` gets no more merges, so the queue fills and the spool takes over.
    """

    def __init__(
        self,
        writer: SpoolingWriter,
        flush_samples: int,
        flush_seconds: float,
        *,
        max_queued: int = MAX_QUEUED_BATCHES,
        drain_seconds: float | None = None,
    ) -> None:
        self.writer = writer
        self.flush_samples = flush_samples
        self.flush_seconds = flush_seconds
        self.max_queued = max_queued
        #: How long ``flush`` waits for the writer before spooling what is left; None: always.
        self.drain_seconds = drain_seconds
        self._pending: list[Sample] = []
        self._oldest = 0.0
        self._queue: deque[_Batch] = deque()
        self._inflight: _Batch | None = None
        self._inflight_since = 0.0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._last: _Batch | None = None
        self.totals = Flushed()

    def add(self, samples: list[Sample]) -> None:
        if samples and not self._pending:
            self._oldest = time.monotonic()
        self._pending.extend(samples)

    def due(self) -> bool:
        return bool(self._pending) and (
            len(self._pending) >= self.flush_samples
            or time.monotonic() - self._oldest >= self.flush_seconds
        )

    def queued(self) -> int:
        """Batches handed off and not yet written or spooled."""
        with self._cond:
            return len(self._queue) + (self._inflight is not None)

    def hand_off(self) -> None:
        """Pass the pending samples to the writer thread without waiting for the store."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        with self._cond:
            if self._merged(batch):
                return
        job = _Batch(batch, self.writer.spool.reserve())
        with contextlib.suppress(RuntimeError):
            job.waiter = asyncio.get_running_loop().create_future()
        self._last = job
        with self._cond:
            if len(self._queue) < self.max_queued:
                self._queue.append(job)
                self._ensure_thread()
                self._cond.notify()
                return
        # The writer is stuck in a write: spool here, in the batch's own place in the order.
        self.writer.spool.append(job.samples, job.seq)
        self._finish(job, Flushed(samples=len(batch), spooled=len(batch)))

    def _merged(self, batch: list[Sample]) -> bool:
        """Whether ``batch`` joined the last queued one (called with ``_cond`` held)."""
        tail = self._queue[-1] if self._queue else None
        if tail is None or tail is not self._last:  # none waits, or one spooled after it
            return False
        if len(tail.samples) + len(batch) > self.flush_samples:
            return False
        if self._inflight is not None and time.monotonic() - self._inflight_since > STUCK_SECONDS:
            return False
        if _loop_of(tail.waiter) is not _running_loop():  # ``flush`` must see it: a waiter
            return False  # of this loop, or none (handed off outside a loop) both times
        tail.samples.extend(batch)  # still queued: the writer has not taken it yet
        return True

    async def flush(self) -> Flushed:
        """Hand off the pending samples and wait until everything handed off is written or
        spooled; past ``drain_seconds`` what is left is spooled here (a batch that is still
        being written may then be stored twice, which the store ignores as duplicates).
        Returns what became of the last batch."""
        self.hand_off()
        last = self._last
        with self._cond:
            waiting = [*self._queue, *([self._inflight] if self._inflight else []), last]
        waiters = [j.waiter for j in waiting if j is not None and j.waiter and not j.done.is_set()]
        if waiters:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.gather(*waiters)), self.drain_seconds)
            except TimeoutError:
                self._spool_leftovers()
        return last.result if last is not None else Flushed()

    def _spool_leftovers(self) -> None:
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            if self._inflight is not None:
                left.insert(0, self._inflight)
        logger.warning("store write stuck; spooling the queued batches", batches=len(left))
        for job in left:
            self.writer.spool.append(job.samples, job.seq)
            self._finish(job, Flushed(samples=len(job.samples), spooled=len(job.samples)))

    def _ensure_thread(self) -> None:
        if self._thread is None:
            # A daemon: a write stuck in the database must not keep the process from exiting.
            self._thread = threading.Thread(target=self._run, name="hbmwatch-writer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait(WRITER_IDLE_SECONDS)
                if not self._queue:
                    self._thread = None
                    return
                job = self._inflight = self._queue.popleft()
                self._inflight_since = time.monotonic()
            try:
                result = self.writer.write(job.samples, job.seq)
            except Exception as exc:  # never drop a batch for an error nobody expected
                logger.error("store write failed; spooling", error=f"{type(exc).__name__}: {exc}")
                self.writer.spool.append(job.samples, job.seq)
                result = Flushed(samples=len(job.samples), spooled=len(job.samples))
            with self._cond:
                self._inflight = None
            self._finish(job, result)

    def _finish(self, job: _Batch, result: Flushed) -> None:
        with self._cond:
            if job.done.is_set():  # spooled at a stop while its write was stuck
                return
            job.result = result
            self.totals.add(result)
            job.done.set()
        waiter = job.waiter
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                waiter.get_loop().call_soon_threadsafe(_resolve, waiter)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _loop_of(waiter: asyncio.Future[None] | None) -> asyncio.AbstractEventLoop | None:
    return waiter.get_loop() if waiter is not None else None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
