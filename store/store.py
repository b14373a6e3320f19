"""The store: the only code that speaks SQL.  Write batches, query ranges, keep tiers.

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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from sqlalchemy import Engine, delete, select, text
from sqlalchemy.dialects import postgresql, sqlite

from hbmwatch import metrics
from hbmwatch.query import Aggregation, Selector
from hbmwatch.records import Device, Point, Sample, SeriesKey, SeriesPoints
from hbmwatch.settings import StoreSettings
from hbmwatch.store import aggregate as agg_math
from hbmwatch.store import codec
from hbmwatch.store.aggregate import Partials
from hbmwatch.store.alerts import AlertBook
from hbmwatch.store.backend import DAY_MS, Backend, backend_for
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.feed import RecentSamples, SampleBlock
from hbmwatch.store.findings import FindingLog
from hbmwatch.store.guard import StoreUnavailable as StoreUnavailable  # re-exported for callers
from hbmwatch.store.guard import guard, guarded
from hbmwatch.store.guard import unavailable as _unavailable
from hbmwatch.store.models import Device as DeviceRow
from hbmwatch.store.models import StoreState
from hbmwatch.store.registry import Caps, SeriesRegistry
from hbmwatch.validation import (
    CardinalityExceeded,
    HbmwatchError,
    InvalidLabels,
    InvalidName,
    InvalidQuery,
    QueryTooExpensive,
    UnknownMetric,
)

_TIMESTAMP_OF_ROW, _SID_OF_ROW, _VALUE = (operator.itemgetter(i) for i in range(3))
_REASONS = {
    UnknownMetric: "unknown_metric",
    InvalidLabels: "invalid_labels",
    InvalidName: "invalid_labels",
    CardinalityExceeded: "cardinality",
}
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
MAX_POINTS_PER_SERIES = 11_000
_IN_BATCH = 900
_WATERMARK = "compacted_until_ms"
_ROLLUP_AGGS = frozenset(
    {
        Aggregation.AVG,
        Aggregation.MIN,
        Aggregation.MAX,
        Aggregation.SUM,
        Aggregation.COUNT,
        Aggregation.LAST,
    }
)


class SchemaOutdated(HbmwatchError):
    """The database has not been migrated to the schema this code needs."""


@dataclass
class WriteResult:
    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    MAX_ERRORS = 10

    def reject(self, reason: str, message: str) -> None:
        self.rejected[reason] += 1
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append(f"{reason}: {message}")

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


@dataclass(frozen=True)
class QueryResult:
    series: list[SeriesPoints]
    tier: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class LatestValue:
    series: SeriesKey
    timestamp: float
    value: float


@dataclass(frozen=True)
class CompactionReport:
    minutes: int = 0
    samples: int = 0
    chunks: int = 0
    merged: int = 0


class StoreMetrics:
    """The store's own health, registered on an injected prometheus registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = PromCounter(
            "hbmwatch_store_samples_written", "Samples stored.", registry=registry
        )
        self.duplicates = PromCounter(
            "hbmwatch_store_samples_duplicate",
            "Samples ignored as duplicates.",
            registry=registry,
        )
        self.rejected = PromCounter(
            "hbmwatch_store_samples_rejected",
            "Samples rejected, by reason.",
            ["reason"],
            registry=registry,
        )
        self.series = PromGauge("hbmwatch_store_series", "Series registered.", registry=registry)
        self.compacted = PromCounter(
            "hbmwatch_store_samples_compacted", "Samples moved into chunks.", registry=registry
        )


def _floor(ms: int, width: int) -> int:
    return ms - ms % width


def _batches(ids: Sequence[int]) -> Iterable[list[int]]:
    ids = list(ids)
    for i in range(0, len(ids), _IN_BATCH):
        yield ids[i : i + _IN_BATCH]


def _in_list(ids: Sequence[int]) -> str:
    return ",".join(str(int(i)) for i in ids)


@guarded
class Store:
    """Samples, series, rollups and inventory behind one object (see module doc).

    Every public method raises ``StoreUnavailable`` when the database cannot answer."""

    def __init__(
        self,
        engine: Engine,
        settings: StoreSettings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self._clock = clock
        self.backend: Backend = backend_for(engine.dialect.name)
        self.series_registry = SeriesRegistry(
            engine,
            Caps(
                settings.max_series_total,
                settings.max_series_per_metric,
                settings.max_values_per_workload_label,
            ),
            self.now_ms,
        )
        self.metrics = StoreMetrics(registry or CollectorRegistry())
        self._write_lock = threading.Lock()
        self._partition_days: set[int] = set()
        self._watermark = 0
        self._watermark_read_at = -math.inf
        self._watched_metrics: frozenset[str] = frozenset()
        self._wants: Callable[[SeriesKey], bool] | None = None
        self.feed = RecentSamples(settings.recent_samples, self._is_watched)
        self.findings = FindingLog(engine)
        self.alerts = AlertBook(engine, self.get_state, self.put_state)

    # -- lifecycle ---------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        """Raise if the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # -- writing -----------------------------------------------------------------------------
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
        wanted: dict[tuple[int, int], set[int]] = {}
        for ts, sid, _ in late:
            wanted.setdefault((sid, _floor(ts, MINUTE_MS)), set()).add(ts)
        stored: set[tuple[int, int]] = set()
        sids = sorted({sid for sid, _ in wanted})
        lo = min(m for _, m in wanted)
        hi = max(m for _, m in wanted)
        for batch in _batches(sids):
            for sid, start_ms, blob in conn.execute(
                text(
                    "SELECT series_id, start_ms, data FROM samples_chunk WHERE series_id IN "
                    f"({_in_list(batch)}) AND start_ms >= :lo AND start_ms <= :hi"
                ),
                {"lo": lo, "hi": hi},
            ):
                ts_wanted = wanted.get((int(sid), int(start_ms)))
                if ts_wanted and blob is not None:
                    present = codec.decode(bytes(blob), int(start_ms))[0]
                    stored.update((int(sid), int(t)) for t in present if int(t) in ts_wanted)
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
            self._watermark = self._read_watermark(conn)
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
        first = _floor(min(r[0] for r in rows), DAY_MS)
        last = _floor(max(r[0] for r in rows), DAY_MS)
        days = set(range(first, last + DAY_MS, DAY_MS))
        if days <= self._partition_days:
            return
        with self.engine.begin() as conn:
            self.backend.prepare_partitions(conn, first, last + DAY_MS)
        self._partition_days |= days | {last + DAY_MS}

    def prepare_partitions(self) -> None:
        """Create the partitions the retention window and the next two days need."""
        now = self.now_ms()
        first = _floor(now - int(self.settings.rollup_1m_retention_days * DAY_MS), DAY_MS)
        with self.engine.begin() as conn:
            self.backend.prepare_partitions(conn, first, now + 2 * DAY_MS)
        self._partition_days |= set(range(first, now + 3 * DAY_MS, DAY_MS))

    # -- compaction and retention ------------------------------------------------------------
    def watermark_ms(self) -> int:
        """Minutes before this instant are compacted into chunks."""
        value = self.get_state(_WATERMARK)
        return int(value) if value is not None else 0

    def compact(self, now_ms: int | None = None) -> CompactionReport:
        """Move closed minutes from the head into chunks and fold them into the tiers."""
        now = self.now_ms() if now_ms is None else now_ms
        target = _floor(now - int(self.settings.compaction_grace_seconds * 1000), MINUTE_MS)
        minutes = samples = chunks = merged = 0
        while True:
            with self._write_lock, self.engine.begin() as conn:
                oldest = conn.execute(text("SELECT min(ts) FROM samples_head")).scalar()
                if oldest is None or oldest >= target:
                    # Every minute before the target is now complete in the tiers.
                    if self._read_watermark(conn) < target:
                        self._write_state(conn, _WATERMARK, target)
                        self._watermark_read_at = -math.inf
                    break
                lo = _floor(int(oldest), MINUTE_MS)
                watermark = self._read_watermark(conn)
                n, c, m = self._compact_minute(conn, lo, watermark)
                if lo + MINUTE_MS > watermark:
                    self._write_state(conn, _WATERMARK, lo + MINUTE_MS)
                    self._watermark_read_at = -math.inf
            minutes, samples, chunks, merged = minutes + 1, samples + n, chunks + c, merged + m
        self.metrics.compacted.inc(samples)
        return CompactionReport(minutes, samples, chunks, merged)

    def _read_watermark(self, conn: Any) -> int:
        value = conn.execute(select(StoreState.value).where(StoreState.name == _WATERMARK)).scalar()
        return int(value) if value is not None else 0

    def _compact_minute(self, conn: Any, lo: int, watermark: int) -> tuple[int, int, int]:
        raw = conn.connection.driver_connection
        cur = raw.cursor()
        placeholder = "?" if self.backend.name == "sqlite" else "%s"
        cur.execute(
            f"SELECT ts, series_id, value FROM samples_head WHERE ts >= {placeholder} "
            f"AND ts < {placeholder}",
            (lo, lo + MINUTE_MS),
        )
        fetched = cur.fetchall()
        cur.close()
        data = np.array(fetched, dtype=np.float64).reshape(-1, 3)
        ts = data[:, 0].astype(np.int64)
        sid = data[:, 1].astype(np.int64)
        values = data[:, 2]
        order = np.lexsort((ts, sid))
        ts, sid, values = ts[order], sid[order], values[order]
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        seg_sid = sid[starts]

        existing: dict[int, tuple[Any, ...]] = {}
        if lo < watermark:  # late samples: their minute may already have a chunk
            for batch in _batches(seg_sid.tolist()):
                for row in conn.execute(
                    text(
                        "SELECT series_id, count, min, max, sum, last, data FROM samples_chunk "
                        f"WHERE start_ms = :lo AND series_id IN ({_in_list(batch)})"
                    ),
                    {"lo": lo},
                ):
                    existing[int(row[0])] = tuple(row)

        fresh_segments = [i for i, s in enumerate(seg_sid.tolist()) if s not in existing]
        ends = np.r_[starts[1:], len(ts)]
        chunk_rows: list[tuple[Any, ...]] = []
        hour_rows: list[tuple[Any, ...]] = []
        hour = _floor(lo, HOUR_MS)
        if fresh_segments:
            pick = np.concatenate([np.arange(starts[i], ends[i]) for i in fresh_segments])
            sub_starts = np.r_[0, np.cumsum(ends[fresh_segments] - starts[fresh_segments])[:-1]]
            enc = codec.encode_segments(
                np.full(len(fresh_segments), lo), ts[pick], values[pick], sub_starts
            )
            last_ts = ts[ends[fresh_segments] - 1]
            for j, i in enumerate(fresh_segments):
                stats = (
                    int(enc.count[j]),
                    float(enc.min[j]),
                    float(enc.max[j]),
                    float(enc.sum[j]),
                    float(enc.last[j]),
                )
                chunk_rows.append((int(seg_sid[i]), lo, *stats, enc.blobs[j]))
                hour_rows.append((int(seg_sid[i]), hour, *stats, int(last_ts[j])))
        self.backend.write_chunks(conn, chunk_rows, replace=False)

        merged_rows: list[tuple[Any, ...]] = []
        for i, s in enumerate(seg_sid.tolist()):
            if s in existing:
                merged = self._merge_late(
                    existing[s], lo, ts[starts[i] : ends[i]], values[starts[i] : ends[i]]
                )
                if merged is not None:
                    merged_rows.append((s, lo, *merged[0]))
                    hour_rows.append((s, hour, *merged[1]))
        self.backend.write_chunks(conn, merged_rows, replace=True)
        self.backend.merge_rollup_1h(conn, hour_rows)
        conn.execute(
            text("DELETE FROM samples_head WHERE ts >= :lo AND ts < :hi"),
            {"lo": lo, "hi": lo + MINUTE_MS},
        )
        return len(ts), len(chunk_rows) + len(merged_rows), len(merged_rows)

    @staticmethod
    def _merge_late(
        row: tuple[Any, ...], lo: int, ts: np.ndarray, values: np.ndarray
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """Merge late samples into a stored chunk; stored values win on equal timestamps.

        Returns the new chunk columns and the statistics of what was added (for the hourly
        tier), or None when nothing was new.  A chunk whose raw samples have expired takes
        nothing: writes that old are refused, so only a retention pass racing a write gets
        here.
        """
        blob = row[6]
        if blob is None:
            return None
        old_ts, old_values = codec.decode(bytes(blob), lo)
        new_mask = ~np.isin(ts, old_ts)
        add_ts, add_values = ts[new_mask], values[new_mask]
        if len(add_ts) == 0:
            return None
        all_ts = np.r_[old_ts, add_ts]
        all_values = np.r_[old_values, add_values]
        order = np.argsort(all_ts, kind="stable")
        all_ts, all_values = all_ts[order], all_values[order]
        chunk = (
            len(all_ts),
            float(all_values.min()),
            float(all_values.max()),
            float(all_values.sum()),
            float(all_values[-1]),
            codec.encode(lo, all_ts, all_values),
        )
        added = (
            len(add_ts),
            float(add_values.min()),
            float(add_values.max()),
            float(add_values.sum()),
            float(add_values[-1]),
            int(add_ts[-1]),
        )
        return chunk, added

    def apply_retention(self, now_ms: int | None = None) -> dict[str, int]:
        """Expire raw samples, then 1-minute and 1-hour rows, each after its own retention."""
        now = self.now_ms() if now_ms is None else now_ms
        s = self.settings
        raw_cutoff = now - int(s.raw_retention_days * DAY_MS)
        minute_cutoff = now - int(s.rollup_1m_retention_days * DAY_MS)
        hour_cutoff = now - int(s.rollup_1h_retention_days * DAY_MS)
        with self._write_lock, self.engine.begin() as conn:
            raw = conn.execute(
                text(
                    "UPDATE samples_chunk SET data = NULL WHERE series_id IN (SELECT id FROM "
                    "series) AND start_ms < :cutoff AND data IS NOT NULL"
                ),
                {"cutoff": raw_cutoff},
            ).rowcount
            head = conn.execute(
                text("DELETE FROM samples_head WHERE ts < :cutoff"), {"cutoff": raw_cutoff}
            ).rowcount
            minute = self.backend.drop_minute_tier_before(conn, minute_cutoff)
            hour = conn.execute(
                text(
                    "DELETE FROM rollup_1h WHERE series_id IN (SELECT id FROM series) "
                    "AND start_ms < :cutoff"
                ),
                {"cutoff": hour_cutoff},
            ).rowcount
        return {
            "raw_chunks_expired": raw or 0,
            "head_rows_deleted": head or 0,
            "minute_rows_deleted": minute,
            "hour_rows_deleted": hour or 0,
        }

    # -- the detectors' feed ------------------------------------------------------------------
    def watch(
        self, metric_names: Iterable[str], wants: Callable[[SeriesKey], bool] | None = None
    ) -> None:
        """Keep the newest samples of these metrics (the series ``wants``) for ``read_new``."""
        self._watched_metrics = frozenset(metric_names)
        self._wants = wants
        self.feed.reset_watch()

    def _is_watched(self, series_id: int) -> bool:
        key = self.series_registry.keys.get(series_id)
        return (
            key is not None
            and key.metric in self._watched_metrics
            and (self._wants is None or self._wants(key))
        )

    def read_new(self, cursor: int | None, since_ms: int) -> tuple[int, SampleBlock]:
        """Watched samples stored after ``cursor``; from SQL (since ``since_ms``) if it is gone.

        The first call after a start passes ``cursor=None`` and gets the span back from the
        database; later calls are served from memory.  A sample may come back twice around
        that switch; readers drop what is not newer than what they have.
        """
        if cursor is not None:
            block = self.feed.read(cursor)
            if block is not None:
                return self.feed.next_seq, block
        next_cursor = self.feed.next_seq
        self.series_registry.refresh()
        ids = [sid for sid in self.series_registry.keys if self._is_watched(sid)]
        hi = self.now_ms() + int(self.settings.max_future_skew_seconds * 1000) + 1
        samples, _ = self._raw_samples(ids, since_ms, hi) if ids else ({}, False)
        parts = [
            SampleBlock(np.full(len(t), sid, dtype=np.int64), t, v)
            for sid, (t, v) in samples.items()
        ]
        block = SampleBlock.concat(parts)
        order = np.argsort(block.timestamps_ms, kind="stable")
        return next_cursor, SampleBlock(
            block.series_ids[order], block.timestamps_ms[order], block.values[order]
        )

    def key_of(self, series_id: int) -> SeriesKey | None:
        key = self.series_registry.keys.get(series_id)
        if key is None:
            self.series_registry.refresh()
            key = self.series_registry.keys.get(series_id)
        return key

    # -- reading -----------------------------------------------------------------------------
    def select_series(
        self, selector: Selector, limit: int | None = None
    ) -> list[tuple[int, SeriesKey]]:
        self.series_registry.refresh()
        found = self.series_registry.select(selector)
        return found if limit is None else found[:limit]

    def series(self, selector: Selector, limit: int = 1000) -> list[SeriesKey]:
        """Series matching a selector, at most ``limit`` of them."""
        if limit <= 0:
            raise InvalidQuery("limit must be positive", limit=limit)
        return [key for _, key in self.select_series(selector, limit)]

    def _resolve(self, selector: Selector) -> list[tuple[int, SeriesKey]]:
        found = self.select_series(selector)
        if len(found) > self.settings.max_series_per_query:
            raise QueryTooExpensive(
                f"{selector} matches {len(found)} series, over the limit of "
                f"{self.settings.max_series_per_query} (store.max_series_per_query); add matchers",
                selector=str(selector),
                limit="store.max_series_per_query",
            )
        return found

    @staticmethod
    def _check_range(start: float, end: float, step: float) -> tuple[int, int, int]:
        if not all(math.isfinite(x) for x in (start, end, step)):
            raise InvalidQuery("start, end and step must be finite numbers")
        if step <= 0:
            raise InvalidQuery(f"step must be positive, got {step}", step=step)
        if end <= start:
            raise InvalidQuery(f"end ({end}) must be after start ({start})")
        if (end - start) / step > MAX_POINTS_PER_SERIES:
            raise QueryTooExpensive(
                f"{(end - start) / step:.0f} points per series is over the limit of "
                f"{MAX_POINTS_PER_SERIES}; use a larger step",
                limit="points per series",
            )
        step_ms = round(step * 1000)
        if step_ms < 1:
            raise InvalidQuery("step must be at least 1 ms")
        return int(start * 1000), math.ceil(end * 1000), step_ms

    def range_query(
        self,
        selector: Selector,
        start: float,
        end: float,
        step: float,
        agg: Aggregation = Aggregation.AVG,
        q: float | None = None,
    ) -> QueryResult:
        """One value per step-aligned bucket in ``[start, end)`` for each matching series.

        Reads 1-hour or 1-minute rollups when the step is a multiple of their width and the
        aggregation can be computed from them; raw samples otherwise.
        """
        start_ms, end_ms, step_ms = self._check_range(start, end, step)
        if agg is Aggregation.QUANTILE and (q is None or not 0 <= q <= 1):
            raise InvalidQuery("quantile aggregation needs q between 0 and 1")
        found = self._resolve(selector)
        if (points := len(found) * (end_ms - start_ms) / step_ms) > (
            cap := self.settings.max_points_per_query
        ):
            raise QueryTooExpensive(
                f"the query would return {points:.0f} points, over the limit of {cap} "
                "(store.max_points_per_query); narrow it or widen step",
                limit="store.max_points_per_query",
            )
        ids = [sid for sid, _ in found]
        start_ms = _floor(start_ms, step_ms)
        warnings: list[str] = []
        if agg in _ROLLUP_AGGS and step_ms % MINUTE_MS == 0:
            tier = "1h" if step_ms % HOUR_MS == 0 else "1m"
            partials = self._rollup_partials(ids, start_ms, end_ms, hourly=tier == "1h")
            computed = {sid: agg_math.aggregate(p, step_ms, agg) for sid, p in partials.items()}
        else:
            tier = "raw"
            raw, expired = self._raw_samples(ids, start_ms, end_ms)
            if expired:
                warnings.append(
                    f"raw samples before retention ({self.settings.raw_retention_days} days) "
                    "are gone; use a step that is a multiple of 60 s for older ranges"
                )
            if agg is Aggregation.QUANTILE:
                computed = {
                    sid: agg_math.quantile(t, v, step_ms, float(q or 0))
                    for sid, (t, v) in raw.items()
                }
            else:
                computed = {
                    sid: agg_math.aggregate(Partials.of_samples(t, v), step_ms, agg)
                    for sid, (t, v) in raw.items()
                }
        return QueryResult(self._points(found, computed), tier, tuple(warnings))

    def counter_query(
        self, selector: Selector, start: float, end: float, step: float, fn: str = "rate"
    ) -> QueryResult:
        """Per-bucket ``increase`` or per-second ``rate`` of counters, across resets and wraps.

        Each increment between consecutive samples counts in the bucket of the later sample,
        so buckets add up to the total increase; rate is increase / step (no extrapolation).
        """
        if fn not in ("rate", "increase"):
            raise InvalidQuery(f"unknown counter function {fn!r}; use rate or increase")
        start_ms, end_ms, step_ms = self._check_range(start, end, step)
        found = self._resolve(selector)
        definition = metrics.get(selector.metric)
        if definition is None or not definition.is_counter:
            raise InvalidQuery(f"{selector.metric} is not a counter; rate applies to counters")
        start_ms = _floor(start_ms, step_ms)
        lookback = start_ms - max(step_ms, 2 * MINUTE_MS)
        raw, expired = self._raw_samples([sid for sid, _ in found], lookback, end_ms)
        computed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for sid, (t, v) in raw.items():
            before = np.flatnonzero(t < start_ms)
            first = before[-1] if len(before) else 0
            buckets, inc = agg_math.bucket_increase(
                t[first:], v[first:], step_ms, definition.wrap_bits
            )
            keep = buckets >= start_ms
            buckets, inc = buckets[keep], inc[keep]
            computed[sid] = (buckets, inc / (step_ms / 1000) if fn == "rate" else inc)
        warnings = ("raw samples for part of the range have expired",) if expired else ()
        return QueryResult(self._points(found, computed), "raw", warnings)

    @staticmethod
    def _points(
        found: list[tuple[int, SeriesKey]], computed: dict[int, tuple[np.ndarray, np.ndarray]]
    ) -> list[SeriesPoints]:
        out = []
        for sid, key in found:
            if sid not in computed:
                continue
            t, v = computed[sid]
            if len(t) == 0:
                continue
            out.append(
                SeriesPoints(
                    key,
                    tuple(
                        Point(ts / 1000, float(val))
                        for ts, val in zip(t.tolist(), v.tolist(), strict=True)
                    ),
                )
            )
        return out

    def _head_rows(self, conn: Any, ids: list[int], lo: int, hi: int) -> dict[int, tuple]:
        rows: dict[int, list[tuple[int, float]]] = {}
        for batch in _batches(ids):
            for ts, sid, value in conn.execute(
                text(
                    "SELECT ts, series_id, value FROM samples_head WHERE ts >= :lo AND ts < :hi "
                    f"AND series_id IN ({_in_list(batch)})"
                ),
                {"lo": lo, "hi": hi},
            ):
                rows.setdefault(int(sid), []).append((int(ts), float(value)))
        out = {}
        for sid, pairs in rows.items():
            arr = np.array(pairs, dtype=np.float64)
            order = np.argsort(arr[:, 0], kind="stable")
            out[sid] = (arr[order, 0].astype(np.int64), arr[order, 1])
        return out

    def _raw_samples(
        self, ids: list[int], lo: int, hi: int
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], bool]:
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        expired = False
        with self.engine.connect() as conn:
            for batch in _batches(ids):
                for sid, start_ms, blob in conn.execute(
                    text(
                        "SELECT series_id, start_ms, data FROM samples_chunk WHERE series_id IN "
                        f"({_in_list(batch)}) AND start_ms >= :lo AND start_ms < :hi "
                        "ORDER BY series_id, start_ms"
                    ),
                    {"lo": _floor(lo, MINUTE_MS), "hi": hi},
                ):
                    if blob is None:
                        expired = True
                        continue
                    t, v = codec.decode(bytes(blob), int(start_ms))
                    parts.setdefault(int(sid), []).append((t, v))
            for sid, pair in self._head_rows(conn, ids, lo, hi).items():
                parts.setdefault(sid, []).append(pair)
        out = {}
        for sid, pieces in parts.items():
            t = np.concatenate([p[0] for p in pieces])
            v = np.concatenate([p[1] for p in pieces])
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
            keep = (t >= lo) & (t < hi) & np.r_[True, t[1:] != t[:-1]]
            if keep.any():
                out[sid] = (t[keep], v[keep])
        return out, expired

    def _rollup_partials(
        self, ids: list[int], lo: int, hi: int, *, hourly: bool
    ) -> dict[int, Partials]:
        parts: dict[int, list[Partials]] = {}
        with self.engine.connect() as conn:
            watermark = self._read_watermark(conn)
            minute_lo = lo
            if hourly:
                hour_end = min(_floor(watermark, HOUR_MS), hi)
                self._collect_partials(conn, "rollup_1h", ids, lo, hour_end, parts)
                minute_lo = max(lo, hour_end)
            minute_end = min(watermark, hi)
            self._collect_partials(conn, "samples_chunk", ids, minute_lo, minute_end, parts)
            head_lo = max(minute_lo, minute_end)
            for sid, (t, v) in self._head_rows(conn, ids, head_lo, hi).items():
                parts.setdefault(sid, []).append(Partials.of_samples(t, v))
        return {sid: Partials.concat(p) for sid, p in parts.items()}

    @staticmethod
    def _collect_partials(
        conn: Any, table: str, ids: list[int], lo: int, hi: int, parts: dict[int, list[Partials]]
    ) -> None:
        if hi <= lo:
            return
        for batch in _batches(ids):
            rows = conn.execute(
                text(
                    f"SELECT series_id, start_ms, count, min, max, sum, last FROM {table} "
                    f"WHERE series_id IN ({_in_list(batch)}) AND start_ms >= :lo "
                    "AND start_ms < :hi ORDER BY series_id, start_ms"
                ),
                {"lo": lo, "hi": hi},
            ).all()
            if not rows:
                continue
            arr = np.array([tuple(r) for r in rows], dtype=np.float64)
            starts = np.flatnonzero(np.r_[True, arr[1:, 0] != arr[:-1, 0]])
            ends = np.r_[starts[1:], len(arr)]
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                block = arr[a:b]
                parts.setdefault(int(block[0, 0]), []).append(
                    Partials(
                        block[:, 1].astype(np.int64),
                        block[:, 2].astype(np.int64),
                        block[:, 3],
                        block[:, 4],
                        block[:, 5],
                        block[:, 6],
                    )
                )

    def latest(self, selector: Selector, lookback: float = 300.0) -> list[LatestValue]:
        """The newest sample of each matching series within ``lookback`` seconds.

        A series with nothing newer is left out: a silent target goes stale, never flat.
        """
        if not math.isfinite(lookback) or lookback <= 0:
            raise InvalidQuery("lookback must be a positive number of seconds")
        found = self._resolve(selector)
        ids = [sid for sid, _ in found]
        since = self.now_ms() - int(lookback * 1000)
        newest: dict[int, tuple[int, float]] = {}
        with self.engine.connect() as conn:
            for sid, (t, v) in self._head_rows(conn, ids, since, 2**62).items():
                newest[sid] = (int(t[-1]), float(v[-1]))
            missing = [sid for sid in ids if sid not in newest]
            for batch in _batches(missing):
                for sid, start_ms, last, blob in conn.execute(
                    text(
                        "SELECT series_id, start_ms, last, data FROM samples_chunk WHERE "
                        f"series_id IN ({_in_list(batch)}) AND start_ms >= :lo "
                        "ORDER BY series_id, start_ms"
                    ),
                    {"lo": _floor(since, MINUTE_MS)},
                ):
                    ts = (
                        int(codec.decode(bytes(blob), int(start_ms))[0][-1])
                        if blob
                        else int(start_ms)
                    )
                    if ts >= since:
                        newest[int(sid)] = (ts, float(last))
        return [
            LatestValue(key, newest[sid][0] / 1000, newest[sid][1])
            for sid, key in found
            if sid in newest
        ]

    # -- inventory and state -----------------------------------------------------------------
    def upsert_devices(self, devices: Iterable[Device]) -> int:
        """Record devices as seen now; identity is (cluster, host, gpu, partition)."""
        now = self.now_ms()
        rows = [
            {
                **{f: getattr(d, f) for f in Device.__slots__},
                "first_seen_ms": now,
                "last_seen_ms": now,
            }
            for d in {d.identity: d for d in devices}.values()
        ]
        if not rows:
            return 0
        insert = (sqlite.insert if self.backend.name == "sqlite" else postgresql.insert)(DeviceRow)
        updated = {c: getattr(insert.excluded, c) for c in rows[0] if c != "first_seen_ms"}
        stmt = insert.on_conflict_do_update(
            index_elements=["cluster", "host", "gpu", "partition"], set_=updated
        )
        with self.engine.begin() as conn:
            conn.execute(stmt, rows)
        return len(rows)

    def devices(self, **filters: str) -> list[Device]:
        """Devices, optionally filtered by identity fields (cluster, rack, host, sku...)."""
        table = DeviceRow.__table__
        stmt = select(*(table.c[f] for f in Device.__slots__)).order_by(
            table.c.cluster, table.c.rack, table.c.host, table.c.gpu, table.c.partition
        )
        for name, value in filters.items():
            if name not in Device.__slots__:
                raise InvalidQuery(f"devices cannot be filtered by {name!r}", field=name)
            stmt = stmt.where(table.c[name] == value)
        with self.engine.connect() as conn:
            return [Device(**row._mapping) for row in conn.execute(stmt)]

    def get_state(self, name: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(StoreState.value).where(StoreState.name == name)).scalar()

    def put_state(self, name: str, value: Any) -> None:
        with self.engine.begin() as conn:
            self._write_state(conn, name, value)

    @staticmethod
    def _write_state(conn: Any, name: str, value: Any) -> None:
        conn.execute(delete(StoreState).where(StoreState.name == name))
        conn.execute(StoreState.__table__.insert().values(name=name, value=value))


@guard
def open_store(
    settings: StoreSettings,
    *,
    clock: Callable[[], float] = time.time,
    registry: CollectorRegistry | None = None,
) -> Store:
    """Connect to the configured database (already migrated) and load the series registry."""
    from hbmwatch.store.migrate import current_revision, head_revision

    engine = create_store_engine(
        settings.url,
        synchronous=settings.sqlite_synchronous,
        busy_timeout_seconds=settings.sqlite_busy_timeout_seconds,
    )
    revision, head = current_revision(engine), head_revision()
    if revision != head:
        engine.dispose()
        raise SchemaOutdated(
            f"the database schema is at {revision or 'nothing'}, not {head}: run hbmwatch migrate",
            revision=revision,
        )
    store = Store(engine, settings, clock=clock, registry=registry)
    store.series_registry.refresh()
    if store.backend.name == "postgresql":
        store.prepare_partitions()
    return store
