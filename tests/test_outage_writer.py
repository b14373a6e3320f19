"""The collector's writer while the store is locked or stuck (issue 12, points 2 and 11).

Another connection takes a real SQLite file's write lock, as another process would: the
event loop must keep running (scrapes, /healthz), batches must reach the spool rather than
wait in memory, and once the lock is gone every sample is stored, in scrape order.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hbmwatch.collector import writer as writer_module
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.writer import BatchingSink, SpoolingWriter
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.store import Store, WriteResult
from tests.conftest import NOW, Clock, make_store

KEY = SeriesKey("gpu_power_watts", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0"})
BATCH = 10


def batch(i: int) -> list[Sample]:
    """Batch ``i``: its own ten timestamps, each value saying which batch it came in."""
    base = int(NOW * 1000) - 3_600_000 + i * BATCH * 1000
    return [Sample(KEY, base + j * 1000, float(i)) for j in range(BATCH)]


@pytest.fixture
def locked(tmp_path: Path, clock: Clock) -> Iterator[tuple[Store, sqlite3.Connection]]:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", clock, sqlite_busy_timeout_seconds=3.0)
    store.write(batch(0))  # the series exists: a locked write then waits in the busy handler
    other = sqlite3.connect(db, timeout=1, isolation_level=None)
    yield store, other
    other.close()
    store.close()


def stored(store: Store) -> float:
    q = store.range_query(parse_selector("gpu_power_watts"), NOW - 7200, NOW, 3600,
                          Aggregation.COUNT)  # fmt: skip
    return sum(p.value for s in q.series for p in s.points)


def test_a_locked_store_neither_blocks_the_loop_nor_holds_batches_in_memory(
    locked: tuple[Store, sqlite3.Connection], tmp_path: Path
) -> None:
    store, other = locked
    order: list[float] = []

    def write(samples: list[Sample]) -> WriteResult:  # the real store, order recorded
        result = store.write(samples)
        order.extend(dict.fromkeys(s.value for s in samples))
        return result

    spool = Spool(tmp_path / "spool", 10**9)
    sink = BatchingSink(SpoolingWriter(write, spool, retry_seconds=0.0), 10**6, 3600.0)

    async def scrape_while_locked() -> float:
        other.execute("BEGIN EXCLUSIVE")
        worst, last = 0.0, time.monotonic()
        for i in range(1, 41):  # 40 flushes, 50 ms apart, while the lock is held
            sink.add(batch(i))
            sink.hand_off()
            await asyncio.sleep(0.05)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        spooled_while_locked = spool.pending()
        other.execute("COMMIT")
        sink.add(batch(41))
        await sink.flush()
        assert spooled_while_locked > 0, "batches waited in memory instead of the spool"
        return worst

    worst = asyncio.run(scrape_while_locked())
    assert worst < 1.0, f"the event loop stalled {worst:.2f} s behind a locked store"
    sink.add(batch(42))
    asyncio.run(sink.flush())  # the spool is replayed behind the retry
    assert spool.pending() == 0
    assert stored(store) == 43 * BATCH
    assert order == sorted(order), "samples reached the store out of scrape order"
    assert sink.totals.spooled > 0 and sink.totals.replayed == sink.totals.spooled


def test_a_stop_spools_what_a_stuck_write_holds(tmp_path: Path, clock: Clock) -> None:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", clock, sqlite_busy_timeout_seconds=60.0)
    store.write(batch(0))
    other = sqlite3.connect(db, timeout=1, isolation_level=None)
    spool = Spool(tmp_path / "spool", 10**9)
    sink = BatchingSink(SpoolingWriter(store.write, spool), 10**6, 3600.0, drain_seconds=0.5)
    other.execute("BEGIN EXCLUSIVE")
    for i in range(1, 4):
        sink.add(batch(i))
        sink.hand_off()
    sink.add(batch(4))
    started = time.monotonic()
    asyncio.run(sink.flush())  # a stop: the writer is stuck in the busy handler
    # The store's busy timeout is 60 s: a stop that waited for the stuck write takes that.
    assert time.monotonic() - started < 30, "the stop waited for the stuck write"
    # The batch inside the stuck write, the queued ones, the last: how many files they make
    # depends on which were merged (handed off while the writer was busy), not their samples.
    assert sink.totals.spooled == 4 * BATCH
    other.execute("COMMIT")
    deadline = time.monotonic() + 60
    while sink.queued() and time.monotonic() < deadline:  # the stuck write may still land
        time.sleep(0.05)
    # A restarted collector replays the spool; a batch stored twice counts once.
    replay = SpoolingWriter(store.write, Spool(tmp_path / "spool", 10**9), retry_seconds=0.0)
    replay.write(batch(5))
    assert replay.spool.pending() == 0
    assert stored(store) == 6 * BATCH
    other.close()
    store.close()


def test_a_batch_the_store_refuses_for_a_bug_is_set_aside_not_retried_forever(
    tmp_path: Path, clock: Clock
) -> None:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", clock)

    def write(samples: list[Sample]) -> WriteResult:  # batch 2 hits a bug in the write path
        if samples[0].value == 2:
            raise ValueError("a bug, not an outage")
        return store.write(samples)

    spool = Spool(tmp_path / "spool", 10**9)
    for i in (1, 2, 3):
        spool.append(batch(i))
    writer = SpoolingWriter(write, spool, retry_seconds=0.0)
    done = writer.write(batch(4))
    assert done.replayed == 2 * BATCH and done.accepted == BATCH
    assert spool.pending() == 0 and len(list(spool.directory.glob("*.failed"))) == 1
    assert stored(store) == 3 * BATCH
    store.close()


def test_batches_handed_off_while_the_writer_is_busy_are_written_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow write (not a stuck one) makes the next batches one write, up to flush_samples,
    in scrape order, none spooled."""
    monkeypatch.setattr(writer_module, "STUCK_SECONDS", 3600.0)  # slow, however busy the host
    release, writes = threading.Event(), []

    def write(samples: list[Sample]) -> WriteResult:
        writes.append([s.value for s in samples])
        if len(writes) == 1:
            release.wait(60)  # the first write is slow
        return WriteResult(received=len(samples), accepted=len(samples))

    sink = BatchingSink(SpoolingWriter(write, Spool(tmp_path / "spool", 10**9)), 3 * BATCH, 3600.0)

    async def scrape() -> None:
        sink.add(batch(1))
        sink.hand_off()
        deadline = time.monotonic() + 60
        while not writes and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # until the writer is inside the first write
        for i in range(2, 7):
            sink.add(batch(i))
            sink.hand_off()
        release.set()
        await sink.flush()

    asyncio.run(scrape())
    assert [sorted(set(w)) for w in writes] == [[1.0], [2.0, 3.0, 4.0], [5.0, 6.0]]
    assert [v for w in writes for v in w] == sorted(v for w in writes for v in w)
    assert sink.totals.accepted == 6 * BATCH and sink.totals.spooled == 0
