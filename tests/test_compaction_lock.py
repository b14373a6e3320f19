"""Several processes compacting one store: every compaction write transaction holds the
store's compaction lock, so no minute is stored twice nor its statistics counted twice.

Two ``Store`` objects, each with its own engine (as the service and the API's process have),
compact one database in threads.  ``Interleave`` makes the races of the old code happen every
time, without sleeps: it holds store A inside a write transaction until store B has got as far
as storing its own (B's ``_apply_minute``) or is asking for the compaction lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store import chunks
from hbmwatch.store.backend import DAY_MS
from hbmwatch.store.store import HOUR_MS, MINUTE_MS, Store
from tests.conftest import NOW, Clock, make_store

HOUR0 = int(NOW * 1000) - 3 * HOUR_MS
KEYS = [SeriesKey("gpu_power_watts", {"host": "n1", "gpu": str(g)}) for g in range(3)]
MATCHERS = [Matcher("__name__", MatchOp.EQ, "gpu_power_watts", None)]
WAIT = 60.0  # a failsafe only: a gate nobody opens fails the test instead of hanging it


class Written:
    """The samples the test wrote: (series, ms) -> value, the first written wins."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, int], float] = {}
        self.rng = np.random.default_rng(7)

    def write(self, store: Store, stamps: list[int]) -> None:
        batch = [Sample(k, t, float(self.rng.integers(100, 400))) for k in KEYS for t in stamps]
        new = {(s.series.text, s.timestamp_ms) for s in batch} - self.samples.keys()
        assert store.write(batch).accepted == len(new)
        for s in batch:
            self.samples.setdefault((s.series.text, s.timestamp_ms), s.value)

    def counts(self, size: int, before: int) -> Counter[tuple[str, int]]:
        """Samples per series and ``size``-aligned bucket, of those before ``before``."""
        return Counter((k, t - t % size) for k, t in self.samples if t < before)


class Interleave:
    """Holds store A inside one write transaction, just after one of its calls, until store B
    reaches ``_apply_minute`` (the old code: with no lock across processes) or asks for the
    database's compaction lock (then A must commit first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, a: Store, b: Store) -> None:
        self.holding = False
        self.held = threading.Event()
        self.reached = threading.Event()
        for obj, name in ((a, "_apply_minute"), (a.backend, "write_hours")):
            monkeypatch.setattr(obj, name, self._hold(getattr(obj, name), name))
        monkeypatch.setattr(b, "_apply_minute", self._reach(b._apply_minute))
        if hasattr(b.backend, "lock_compaction"):  # the old code has none
            monkeypatch.setattr(
                b.backend, "lock_compaction", self._reach(b.backend.lock_compaction)
            )
        self.hold_in = ""

    def _hold(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            if self.hold_in == name and not self.held.is_set():
                self.held.set()  # A's writes are done, not committed
                assert self.reached.wait(WAIT), "store B never got to storing"
            return out

        return held

    def _reach(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def reach(*args: Any, **kwargs: Any) -> Any:
            self.reached.set()
            return real(*args, **kwargs)

        return reach

    def run(self, hold_in: str, a_call: Callable[[], Any], b_call: Callable[[], Any]) -> None:
        """``a_call`` until it holds in ``hold_in``, then ``b_call`` beside it."""
        self.hold_in, errors = hold_in, []
        self.held.clear()
        self.reached.clear()
        a = _thread(a_call, errors, self.held)
        a.start()
        assert self.held.wait(WAIT)
        b = _thread(b_call, errors, self.reached)
        b.start()
        a.join(WAIT)
        b.join(WAIT)
        self.hold_in = ""
        assert not errors and not a.is_alive() and not b.is_alive(), errors
        assert self.held.is_set() and self.reached.is_set()


def _thread(call: Callable[[], Any], errors: list, done: threading.Event) -> threading.Thread:
    """``call`` in a thread; it opens ``done`` when it ends, whatever happens."""

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # reported by Interleave.run
            errors.append(exc)
        finally:
            done.set()

    return threading.Thread(target=run, daemon=True)


def _both(a: Callable[[], Any], b: Callable[[], Any]) -> None:
    """Two calls at once, free-running; both must succeed."""
    errors: list = []
    threads = [_thread(call, errors, threading.Event()) for call in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors, errors


@pytest.fixture
def stores(store_url: str, clock: Clock) -> Iterator[tuple[Store, Store]]:
    clock.advance(1800)
    a, b = make_store(store_url, clock), make_store(store_url, clock)
    yield a, b
    a.close()
    b.close()


def _now(clock: Clock) -> int:
    return int(clock.now * 1000)


def _late(hours: list[int], n: int) -> list[int]:
    """Off-grid instants in each of ``hours`` (the grid is every 10 s): new samples."""
    return [h + (7 + 11 * i) * MINUTE_MS + 1_234 + 17 * n for h in hours for i in range(3)]


def test_two_stores_compacting_at_once_store_each_sample_once(
    stores: tuple[Store, Store], clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = stores
    written = Written()
    written.write(a, list(range(HOUR0, _now(clock) - 90_000, 10_000)))
    a.compact()
    gate = Interleave(monkeypatch, a, b)
    for n in range(4):
        packed = [HOUR0 + i * HOUR_MS for i in range(3 + n)]  # hours already re-packed
        start = _now(clock) - 90_000
        clock.advance(3600)
        written.write(a, list(range(start, _now(clock) - 90_000, 10_000)))
        written.write(b, _late(packed, 3 * n))
        _both(lambda: a.compact(hours=False), lambda: b.compact(hours=False))
        # The same head minute (late samples into a re-packed hour) stored by both stores.
        written.write(b, [packed[n] + 40 * MINUTE_MS + 1_234 + 17 * n])
        gate.run("_apply_minute", lambda: a.compact(hours=False), lambda: b.compact(hours=False))
        # A late sample of the hour just closed, while A re-packs that hour.
        closed = packed[-1] + HOUR_MS
        written.write(b, _late([closed], 3 * n + 2))
        gate.run("write_hours", a.repack_hours, lambda: b.compact(hours=False))
        _both(a.compact, b.compact)
    a.compact()
    _check(a, written)


def _check(store: Store, written: Written) -> None:
    """Each minute in one table, the tiers' counts and the raw samples exactly as written."""
    watermark = store.watermark_ms()
    ids = {text: sid for text, sid in store.series_registry.ids.items()}
    names = {sid: text for text, sid in ids.items()}
    minute_rows, hour_minutes, rollup = Counter(), Counter(), Counter()
    with store.engine.connect() as conn:
        for sid, start, count in conn.execute(
            text("SELECT series_id, start_ms, count FROM samples_chunk")
        ):
            minute_rows[(names[sid], start)] += count
        for sid, hour, minutes in conn.execute(
            text("SELECT series_id, start_ms, minutes FROM samples_hour")
        ):
            stats = chunks.unpack_minutes(bytes(minutes), hour)
            for start, count in zip(stats.start_ms.tolist(), stats.count.tolist(), strict=True):
                hour_minutes[(names[sid], start)] += count
        for sid, hour, count in conn.execute(
            text("SELECT series_id, start_ms, count FROM rollup_1h")
        ):
            rollup[(names[sid], hour)] += count
    both = minute_rows.keys() & hour_minutes.keys()
    assert not both, f"minutes in both samples_chunk and samples_hour: {sorted(both)[:3]}"
    assert minute_rows + hour_minutes == written.counts(MINUTE_MS, watermark)
    assert rollup == written.counts(HOUR_MS, watermark)
    got, expired = store.select_samples(MATCHERS, HOUR0, watermark + HOUR_MS, "raw")
    raw = {
        (k.text, t): v
        for k, ts, vs, _ in got
        for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    }
    assert not expired and raw == written.samples
    closed = watermark - watermark % HOUR_MS
    hourly = store.range_query(parse_selector("gpu_power_watts"), HOUR0 / 1000, closed / 1000 - 1,
                               3600, Aggregation.COUNT)  # fmt: skip
    answered = {(s.series.text, int(p.timestamp * 1000)): p.value
                for s in hourly.series for p in s.points}  # fmt: skip
    assert answered == dict(written.counts(HOUR_MS, closed))


def test_partly_expired_hour_keeps_its_retained_raw_samples(store_url: str, clock: Clock) -> None:
    """Raw retention's cutoff inside a closed hour that is not re-packed yet (a store down for
    a while, or a migrated backlog): the hour pass keeps its still-retained samples, and a late
    sample of a retained minute reaches the raw tier, the minute tier and rollup_1h."""
    store = make_store(store_url, clock)
    written = Written()
    hour = HOUR0
    try:
        written.write(store, list(range(hour, hour + HOUR_MS, 10_000)))
        clock.advance(600)
        store.compact(hours=False)
        cutoff = hour + 30 * MINUTE_MS + 5_000  # raw retention ends 30 min 5 s into the hour
        clock.now = (cutoff + 7 * DAY_MS) / 1000
        assert store.settings.raw_retention_days == 7
        store.apply_retention()
        store.compact()  # the hour pass meets the hour's minutes, their raw partly expired
        written.write(store, [hour + 45 * MINUTE_MS + 1_234])  # a still-retained minute
        store.compact()
        got, _ = store.select_samples(MATCHERS, cutoff, hour + HOUR_MS, "raw")
        raw = {
            (k.text, t): v
            for k, ts, vs, _ in got
            for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
        }
        assert raw == {k: v for k, v in written.samples.items() if k[1] >= cutoff}
        minute = store.select_samples(MATCHERS, hour, hour + HOUR_MS, "1m")[0]
        counts = {(k.text, t - t % MINUTE_MS): c for k, ts, _, s in minute
                  for t, c in zip(ts.tolist(), s.count.tolist(), strict=True)}  # fmt: skip
        for key in KEYS:
            assert counts[(key.text, hour + 45 * MINUTE_MS)] == 7
        hourly = store.range_query(parse_selector("gpu_power_watts"), hour / 1000,
                                   hour / 1000 + 3599, 3600, Aggregation.COUNT)  # fmt: skip
        assert [p.value for s in hourly.series for p in s.points] == [361.0] * len(KEYS)
    finally:
        store.close()
