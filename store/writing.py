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
  first value written wins, as in Prometheus.
* A negative value of a counter: rejected (``negative_counter``).
* Unknown metric names, undeclared labels or values: rejected (``unknown_metric``,
  ``invalid_labels``).  A new series past a cardinality cap: rejected (``cardinality``).
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Engine

from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store import codec
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

_TIMESTAMP_OF_ROW, _SID_OF_ROW, _VALUE = (operator.itemgetter(i) for i in range(3))
_REASONS = {
    UnknownMetric: "unknown_metric",
    InvalidLabels: "invalid_labels",
    InvalidName: "invalid_labels",
    CardinalityExceeded: "cardinality",
}


@guarded
class Writing:
    """The write half of ``Store``, a mixin over the attributes ``Store.__init__`` sets.

    Relies on: ``engine``, ``settings``, ``backend``, ``series_registry``, ``metrics``,
    ``feed``, ``now_ms``; the lock ``_write_lock`` (shared with compaction), the cache of
    prepared ``_partition_days``, the cached watermark (``_watermark``,
    ``_watermark_read_at``; compaction clears the latter) and ``_watched_metrics`` (the feed
    is fed only while something is watched).
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
        known = self.series_registry.keys
        if not known.keys() >= set(map(_SID_OF_ROW, rows)):
            rows = [
                r
                for r in rows
                if r[1] in known
                or result.reject("unknown_series", f"series id {r[1]} was never resolved here")
            ]
        return self._store_rows(rows, result)

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

    def _store_rows(self, rows: list[tuple[int, int, float]], result: WriteResult) -> WriteResult:
        rows = self._checked(rows, result)
        if rows:
            with _unavailable():
                self._prepare_partitions(rows)
                with self._write_lock:
                    with self.engine.begin() as conn:
                        fresh = self._drop_compacted_duplicates(conn, rows)
                        inserted = self.backend.insert_head(conn, fresh) if fresh else 0
                    if self._watched_metrics:
                        self.feed.append(fresh)
            result.accepted = inserted
            result.duplicates = len(rows) - inserted
        self._count(result)
        return result

    def _bounds(self) -> tuple[int, int]:
        now = self.now_ms()
        return (
            now - int(self.settings.raw_retention_days * DAY_MS),
            now + int(self.settings.max_future_skew_seconds * 1000),
        )

    def _checked(
        self, rows: list[tuple[int, int, float]], result: WriteResult
    ) -> list[tuple[int, int, float]]:
        """The rows that pass; each one that does not is rejected with its reason.

        A batch with nothing wrong is checked by builtins over whole columns, with no
        Python-level branch per sample; only a batch with a suspect goes row by row.
        """
        if not rows:
            return rows
        oldest, newest = self._bounds()
        stamps = list(map(_TIMESTAMP_OF_ROW, rows))
        values = list(map(_VALUE, rows))
        counters = self.series_registry.counter_ids
        if (
            min(stamps) >= oldest
            and max(stamps) <= newest
            and math.isfinite(sum(values))
            and (min(values) >= 0 or not any(r[2] < 0 and r[1] in counters for r in rows))
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
