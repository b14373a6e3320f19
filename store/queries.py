"""The queries: series by selector, range and counter queries over the tiers, latest values.

A range query reads the cheapest tier that can answer it: hourly rollups, then minute chunks
up to the compaction watermark, then the head; raw samples when the step or the aggregation
needs them.  Every query is bounded (series, points) before it touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Engine, text

from hbmwatch import metrics
from hbmwatch.matchers import Matcher
from hbmwatch.query import Aggregation, Selector
from hbmwatch.records import Point, SeriesKey, SeriesPoints
from hbmwatch.settings import StoreSettings
from hbmwatch.store import aggregate as agg_math
from hbmwatch.store import codec, head
from hbmwatch.store.aggregate import Partials
from hbmwatch.store.chunks import by_series, chunk_blobs, minute_stats
from hbmwatch.store.engine import read_snapshot
from hbmwatch.store.guard import guarded
from hbmwatch.store.registry import SeriesRegistry
from hbmwatch.store.results import LatestValue, QueryResult
from hbmwatch.store.tiered import TierSamples, read_tiers, series_with_samples
from hbmwatch.store.tiers import (
    HOUR_MS,
    MINUTE_MS,
    batches,
    floor,
    in_list,
    read_watermark,
)
from hbmwatch.validation import InvalidQuery, QueryTooExpensive

MAX_POINTS_PER_SERIES = 11_000
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


@guarded
class Queries:
    """The read half of ``Store``, a mixin over the attributes ``Store.__init__`` sets.

    Relies on: ``engine``, ``settings`` (the query limits, raw retention for warnings),
    ``series_registry`` (refreshed before selecting, as another process may have added
    series) and ``now_ms``.
    """

    engine: Engine
    settings: StoreSettings
    series_registry: SeriesRegistry
    now_ms: Callable[[], int]

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
        start_ms = floor(start_ms, step_ms)
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
        start_ms = floor(start_ms, step_ms)
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
            # map() over lists: a day at a 1-minute step is 1,440 points, and a generator
            # of per-point divisions cost a third of the query.
            points = tuple(map(Point, (t / 1000).tolist(), v.astype(np.float64).tolist()))
            out.append(SeriesPoints(key, points))
        return out

    def _head_rows(self, conn: Any, ids: list[int], lo: int, hi: int) -> dict[int, tuple]:
        return head.head_samples(conn, ids, lo, hi)

    def _raw_samples(
        self, ids: list[int], lo: int, hi: int
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], bool]:
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        expired = False
        with read_snapshot(self.engine) as conn:
            for sid, start_ms, blob in chunk_blobs(conn, ids, lo, hi):
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
        with read_snapshot(self.engine) as conn:
            watermark = read_watermark(conn)
            minute_lo = lo
            if hourly:
                hour_end = min(floor(watermark, HOUR_MS), hi)
                self._collect_partials(conn, "rollup_1h", ids, lo, hour_end, parts)
                minute_lo = max(lo, hour_end)
            minute_end = min(watermark, hi)
            table = minute_stats(conn, ids, minute_lo, minute_end)
            for sid, block in by_series(table):
                ints = block[:, [1, 2]].astype(np.int64)
                parts.setdefault(sid, []).append(Partials(ints[:, 0], ints[:, 1], *block[:, 3:7].T))
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
        for batch in batches(ids):
            rows = conn.execute(
                text(
                    f"SELECT series_id, start_ms, count, min, max, sum, last FROM {table} "
                    f"WHERE series_id IN ({in_list(batch)}) AND start_ms >= :lo "
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
        return self.latest_of(self._resolve(selector), lookback)

    def latest_of(
        self, found: list[tuple[int, SeriesKey]], lookback: float = 300.0
    ) -> list[LatestValue]:
        """``latest`` over series already selected (``select_series``), for callers that
        apply a cap of their own (``/federate``)."""
        ids = [sid for sid, _ in found]
        since = self.now_ms() - int(lookback * 1000)
        with read_snapshot(self.engine) as conn:
            newest = self._newest_head(conn, ids, since)
            missing = [sid for sid in ids if sid not in newest]
            table = minute_stats(conn, missing, floor(since, MINUTE_MS), 2**62)
            for sid, block in by_series(table):
                ts, last = int(block[-1, 7]), float(block[-1, 6])
                if ts >= since:
                    newest[sid] = (ts, last)
        return [
            LatestValue(key, newest[sid][0] / 1000, newest[sid][1])
            for sid, key in found
            if sid in newest
        ]

    @staticmethod
    def _newest_head(conn: Any, ids: list[int], since: int) -> dict[int, tuple[int, float]]:
        """The newest head sample of each series since ``since``."""
        return head.newest(conn, ids, since)

    def select_samples(
        self, matchers: Sequence[Matcher], lo: int, hi: int, tier: str = "raw"
    ) -> tuple[list[tuple[SeriesKey, np.ndarray, np.ndarray, TierSamples | None]], bool]:
        """Samples in ``[lo, hi]`` ms of every series the PromQL matchers select.

        ``tier`` "raw" reads every sample; "1m" and "1h" read one sample per closed minute
        or hour with its statistics (store/tiered.py).  Returns the series and whether raw
        samples of part of the range have passed retention.  Bounded by
        ``store.max_series_per_query`` and, in samples read, ``store.max_points_per_query``.
        """
        self.series_registry.refresh()
        found = self.series_registry.select_matching(matchers)
        if len(found) > self.settings.max_series_per_query:
            shown = ",".join(str(m) for m in matchers)
            raise QueryTooExpensive(
                f"{{{shown}}} matches {len(found)} series, over the limit of "
                f"{self.settings.max_series_per_query} (store.max_series_per_query); add matchers",
                limit="store.max_series_per_query",
            )
        ids = [sid for sid, _ in found]
        expired = False
        if tier == "raw":
            raw, expired = self._raw_samples(ids, lo, hi + 1)
            read = {sid: (t, v, None) for sid, (t, v) in raw.items()}
        else:
            with read_snapshot(self.engine) as conn:
                tiers = read_tiers(conn, ids, lo, hi, hourly=tier == "1h")
            read = {sid: (ts.times, ts.values, ts) for sid, ts in tiers.items()}
        total = sum(len(t) for t, _, _ in read.values())
        if total > (cap := self.settings.max_points_per_query):
            raise QueryTooExpensive(
                f"the query reads {total} samples, over the limit of {cap} "
                "(store.max_points_per_query); narrow it, shorten its ranges or widen step",
                limit="store.max_points_per_query",
            )
        return [(key, *read[sid]) for sid, key in found if sid in read], expired

    def select_matching(self, matchers: Sequence[Matcher]) -> list[tuple[int, SeriesKey]]:
        """Series (with their ids) that PromQL matchers select, ``__name__`` as a label."""
        self.series_registry.refresh()
        return self.series_registry.select_matching(matchers)

    def label_sets(
        self, matchers: Sequence[Matcher], lo: int | None = None, hi: int | None = None
    ) -> list[SeriesKey]:
        """Every known series the matchers select (all with no matchers); with ``lo`` and
        ``hi`` (ms) only those holding a sample in that range."""
        self.series_registry.refresh()
        found = self.series_registry.select_matching(matchers)
        if lo is None or hi is None:
            return [key for _, key in found]
        with read_snapshot(self.engine) as conn:
            live = series_with_samples(conn, [sid for sid, _ in found], lo, hi)
        return [key for sid, key in found if sid in live]
