"""The write path: resolve series, judge each sample, insert into the head.

Bad input policy (docs/store.md): every sample is judged on its own, and a batch is never
refused whole.  Rejected samples are counted by reason and the first few are described in
the ``WriteResult``; nothing already accepted is lost.

* NaN and +/-Inf: rejected (``non_finite``).  Prometheus staleness markers are NaNs; hbmwatch
  marks staleness by absence instead.
* Timestamps more than ``max_future_skew_seconds`` ahead of the store's clock: rejected
  (``future``).  Older than raw retention: rejected (``too_old``).
* Out-of-order samples inside retention: accepted; a minute already compacted is merged.
* Duplicates (same series and timestamp): ignored, so a retried write never duplicates; the
  first value written wins, as in Prometheus.  A sample newer than the newest this process
  wrote of its series is taken without a lookup; an older one is looked up in the head
  batches of its minute and, below the compaction watermark, in the chunks.  Across two
  processes writing one series both may count a sample as accepted; readers and compaction
  still keep only the first written (store/head.py).
* A negative value of a counter: rejected (``negative_counter``).
* Unknown metric names, undeclared labels or values: rejected (``unknown_metric``,
  ``invalid_labels``).  A new series past a cardinality cap: rejected (``cardinality``).
"""

from __future__ import annotations

import itertools
import math
import operator
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Engine

from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store import codec, head
from hbmwatch.store.backend import DAY_MS, Backend
from hbmwatch.store.chunks import chunk_blobs
from hbmwatch.store.feed import RecentSamples
from hbmwatch.store.guard import guarded
from hbmwatch.store.guard import unavailable as _unavailable
from hbmwatch.store.registry import SeriesRegistry
from hbmwatch.store.results import StoreMetrics, WriteResult
from hbmwatch.store.tiers import floor, read_watermark
from hbmwatch.validation import (
    CardinalityExceeded,
    HbmwatchError,
    InvalidLabels,
    InvalidName,
    UnknownMetric,
)

_TIMESTAMP_OF_ROW = operator.itemgetter(0)
_REASONS = {
    UnknownMetric: "unknown_metric",
    InvalidLabels: "invalid_labels",
    InvalidName: "invalid_labels",
    CardinalityExceeded: "cardinality",
}


def _columns(rows: Sequence[tuple[int, int, float]]) -> np.ndarray:
    """``(timestamp_ms, series_id, value)`` rows as one (n, 3) float64 array: ms times and
    ids are exact below 2**53, and ``fromiter`` over the flattened rows is 2.5x cheaper
    than ``np.array`` of the tuples."""
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.float64, 3 * len(rows))
    return flat.reshape(-1, 3)


@guarded
class Writing:
    """The write half of ``Store``, a mixin over the attributes ``Store.__init__`` sets.

    Relies on: ``engine``, ``settings``, ``backend``, ``series_registry``, ``metrics``,
    ``feed``, ``now_ms``; the lock ``_write_lock`` (shared with compaction), the cache of
    prepared ``_partition_days``, the cached watermark (``_watermark``,
    ``_watermark_read_at``; compaction clears the latter), ``_watched_metrics`` (the feed
    is fed only while something is watched), ``_newest_written`` (store/head.py) and
    ``_known_mask`` (the resolved ids, as of a registry size).
    """

    engine: Engine
    settings: StoreSettings
    backend: Backend
    series_registry: SeriesRegistry
    metrics: StoreMetrics
    feed: RecentSamples
    now_ms: Callable[[], int]
    _write_lock: threading.Lock
    _partition_days: set[int]
    _watermark: int
    _watermark_read_at: float
    _watched_metrics: frozenset[str]
    _newest_written: head.NewestWritten
    _known_mask: tuple[int, np.ndarray]

    def resolve(self, keys: Iterable[SeriesKey]) -> dict[SeriesKey, int | HbmwatchError]:
        """Series ids for ``keys``, registering new series; a key that fails maps to its error.

        Callers that write the same series again and again (collectors) resolve once and
        then call ``write_rows`` with the ids, as Prometheus' appenders hand out series refs.
        """
        with _unavailable():
            outcome = self.series_registry.create(keys)
        self.metrics.series.set(len(self.series_registry))
        return outcome

    def write(self, samples: Iterable[Sample]) -> WriteResult:
        """Store a batch; see the module doc for what is rejected and why."""
        batch = samples if isinstance(samples, list) else list(samples)
        result = WriteResult(received=len(batch))
        ids = self.series_registry.ids
        try:
            rows = [(s[1], ids[s[0].text], s[2]) for s in batch]
        except KeyError:
            rows = self._rows_registering(batch, result)
        return self._store_rows(rows, result)

    def write_rows(self, rows: Sequence[tuple[int, int, float]]) -> WriteResult:
        """Store ``(timestamp_ms, series_id, value)`` rows whose ids came from ``resolve``."""
        result = WriteResult(received=len(rows))
        table = _columns(rows)
        if not self._all_known(table[:, 1]):
            known = self.series_registry.keys
            rows = [
                r
                for r in rows
                if r[1] in known
                or result.reject("unknown_series", f"series id {r[1]} was never resolved here")
            ]
            table = _columns(rows)
        return self._store_rows(rows, result, table)

    def _all_known(self, sids: np.ndarray) -> bool:
        """Whether every id was resolved here: one mask lookup, not a set of the batch."""
        known = self.series_registry.keys
        seen, mask = self._known_mask
        if seen != len(known):  # the registry only appends: take in the ids added since
            try:
                added = np.fromiter(itertools.islice(known, seen, None), np.int64)
            except RuntimeError:  # another thread is registering series right now
                return known.keys() >= set(sids.astype(np.int64).tolist())
            top = int(added.max()) + 1 if len(added) else 0
            if top > len(mask):
                mask = np.r_[mask, np.zeros(max(top, 2 * len(mask)) - len(mask), dtype=bool)]
            mask[added] = True
            self._known_mask = (seen + len(added), mask)
        if not len(sids):
            return True
        return bool(
            sids.min() >= 0
            and sids.max() < len(mask)
            and (sids == np.floor(sids)).all()
            and mask[sids.astype(np.int64)].all()
        )

    def _rows_registering(
        self, batch: list[Sample], result: WriteResult
    ) -> list[tuple[int, int, float]]:
        ids = self.series_registry.ids
        outcome = self.resolve({s.series for s in batch if s.series.text not in ids})
        rows = []
        for series, ts, value in batch:
            sid = ids.get(series.text)
            if sid is not None:
                rows.append((ts, sid, value))
            else:
                error = outcome[series]
                result.reject(_REASONS.get(type(error), "invalid"), str(error))
        return rows

    def _store_rows(
        self,
        rows: list[tuple[int, int, float]],
        result: WriteResult,
        table: np.ndarray | None = None,
    ) -> WriteResult:
        table = _columns(rows) if table is None else table
        checked = self._checked(rows, result, table)
        if checked:
            rows = checked
            if len(rows) != len(table):
                table = _columns(rows)
            with _unavailable():
                self._prepare_partitions(rows)
                with self._write_lock:
                    with self.engine.begin() as conn:
                        fresh = (
                            self._drop_compacted_duplicates(conn, rows)
                            if table[:, 0].min() < self._cached_watermark(conn)
                            else rows
                        )
                        if fresh is not rows:
                            table = _columns(fresh)
                        stored = self._insert_head(conn, table) if fresh else None
                    if stored is not None and self._watched_metrics:
                        self.feed.append_columns(*stored)
            result.accepted = len(stored[0]) if stored is not None else 0
            result.duplicates = len(checked) - result.accepted
        self._count(result)
        return result

    def _insert_head(
        self, conn: Any, table: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Store the rows (``_columns``) not in the head yet, the first of any repeated;
        return them as columns (times, series ids, values), or None when none was new."""
        ts, sids, values = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]
        newest = self._newest_written
        if not newest.loaded:
            newest.load(conn, self._cached_watermark(conn))
        before = newest.of(sids)
        unique = newest.distinct(sids)  # each series once, the common case: no repeats
        keep = np.ones(len(ts), dtype=bool)
        if not unique:
            keep[:] = False
            keep[head.first_written(ts, sids)] = True
        suspect = np.flatnonzero(keep & (ts <= before))
        if len(suspect):
            keep[suspect[head.already_stored(conn, ts[suspect], sids[suspect])]] = False
        if not keep.all():
            if not keep.any():
                return None
            ts, sids, values = ts[keep], sids[keep], values[keep]
        self.backend.insert_head(conn, head.batch_rows(ts, sids, values))
        newest.update(ts, sids, unique)
        return ts, sids, values

    def _bounds(self) -> tuple[int, int]:
        now = self.now_ms()
        return (
            now - int(self.settings.raw_retention_days * DAY_MS),
            now + int(self.settings.max_future_skew_seconds * 1000),
        )

    def _checked(
        self,
        rows: list[tuple[int, int, float]],
        result: WriteResult,
        table: np.ndarray | None = None,
    ) -> list[tuple[int, int, float]]:
        """The rows that pass; each one that does not is rejected with its reason.

        A batch with nothing wrong is checked over whole columns (``table``: ``_columns`` of
        the rows), with no Python-level branch per sample; only a batch with a suspect goes
        row by row.
        """
        if not rows:
            return rows
        oldest, newest = self._bounds()
        table = _columns(rows) if table is None else table
        stamps, values = table[:, 0], table[:, 2]
        counters = self.series_registry.counter_ids
        if (
            stamps.min() >= oldest
            and stamps.max() <= newest
            and np.isfinite(values).all()
            and (values.min() >= 0 or not any(r[2] < 0 and r[1] in counters for r in rows))
        ):
            return rows
        isfinite = math.isfinite
        kept = []
        for row in rows:
            ts, sid, value = row
            if oldest <= ts <= newest and isfinite(value) and (value >= 0 or sid not in counters):
                kept.append(row)
            else:
                self._reject_sample(
                    result, self.series_registry.keys[sid], ts, value, oldest, newest
                )
        return kept

    def _drop_compacted_duplicates(
        self, conn: Any, rows: list[tuple[int, int, float]]
    ) -> list[tuple[int, int, float]]:
        """Leave out late rows whose sample is already in a chunk (a retry after compaction)."""
        watermark = self._cached_watermark(conn)
        if min(map(_TIMESTAMP_OF_ROW, rows)) >= watermark:
            return rows
        late = [r for r in rows if r[0] < watermark]
        wanted: dict[int, set[int]] = {}
        for ts, sid, _ in late:
            wanted.setdefault(sid, set()).add(ts)
        stored: set[tuple[int, int]] = set()
        lo = min(map(_TIMESTAMP_OF_ROW, late))
        hi = max(map(_TIMESTAMP_OF_ROW, late)) + 1
        for sid, start_ms, blob in chunk_blobs(conn, sorted(wanted), lo, hi):
            ts_wanted = wanted[int(sid)]
            if blob is not None:
                present = codec.decode(bytes(blob), int(start_ms))[0].tolist()
                stored.update((int(sid), t) for t in present if t in ts_wanted)
        if not stored:
            return rows
        return [r for r in rows if r[0] >= watermark or (r[1], r[0]) not in stored]

    def _cached_watermark(self, conn: Any) -> int:
        """The compaction watermark, re-read at most every few seconds on the write path.

        A stale (lower) value only means a retried late sample is counted as accepted and
        deduplicated at compaction instead of at write time.
        """
        now = time.monotonic()
        if now - self._watermark_read_at > 5.0:
            self._watermark = read_watermark(conn)
            self._watermark_read_at = now
        return self._watermark

    def _reject_sample(
        self,
        result: WriteResult,
        series: SeriesKey,
        ts: int,
        value: float,
        oldest: int,
        newest: int,
    ) -> None:
        if not math.isfinite(value):
            result.reject("non_finite", f"{series.text} has value {value} at {ts}")
        elif ts > newest:
            result.reject(
                "future",
                f"{series.text} at {ts} ms is {(ts - newest) / 1000:.0f} s past the clock-skew "
                f"bound ({self.settings.max_future_skew_seconds:.0f} s)",
            )
        elif ts < oldest:
            result.reject("too_old", f"{series.text} at {ts} ms is older than raw retention")
        else:
            result.reject("negative_counter", f"counter {series.text} has value {value}")

    def _count(self, result: WriteResult) -> None:
        self.metrics.written.inc(result.accepted)
        self.metrics.duplicates.inc(result.duplicates)
        for reason, n in result.rejected.items():
            self.metrics.rejected.labels(reason).inc(n)

    def _prepare_partitions(self, rows: Sequence[tuple[int, int, float]]) -> None:
        if self.backend.name != "postgresql":
            return
        first = floor(min(r[0] for r in rows), DAY_MS)
        last = floor(max(r[0] for r in rows), DAY_MS)
        days = set(range(first, last + DAY_MS, DAY_MS))
        if days <= self._partition_days:
            return
        with self.engine.begin() as conn:
            self.backend.prepare_partitions(conn, first, last + DAY_MS)
        self._partition_days |= days | {last + DAY_MS}

    def prepare_partitions(self) -> None:
        """Create the partitions the retention window and the next two days need."""
        now = self.now_ms()
        first = floor(now - int(self.settings.rollup_1m_retention_days * DAY_MS), DAY_MS)
        with self.engine.begin() as conn:
            self.backend.prepare_partitions(conn, first, now + 2 * DAY_MS)
        self._partition_days |= set(range(first, now + 3 * DAY_MS, DAY_MS))
