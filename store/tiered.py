"""Samples read from the rollup tiers: one per closed minute or hour, with its statistics.

Long ranges at coarse steps need not decode every raw sample.  A minute chunk or an hourly
rollup stands for one sample: its last value at its last sample's time (a chunk written
before that time was kept stands at its minute's last millisecond).  Each carries count,
min, max and sum, so ``max_over_time`` still sees the peak between the samples.  The head
(not compacted yet) is read raw, each sample its own statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import text

from hbmwatch.store import head
from hbmwatch.store.chunks import by_series, minute_stats
from hbmwatch.store.tiers import (
    HOUR_MS,
    MINUTE_MS,
    batches,
    floor,
    in_list,
    read_watermark,
)


@dataclass
class TierSamples:
    """Per series: sample times (ms) and last values, with count, min, max, sum each."""

    times: np.ndarray
    values: np.ndarray
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray

    @classmethod
    def concat(cls, parts: list[TierSamples]) -> TierSamples:
        fields = [np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS]
        order = np.argsort(fields[0], kind="stable")
        return cls(*(f[order] for f in fields))


_FIELDS = ("times", "values", "count", "min", "max", "sum")


def _hours(conn: Any, ids: list[int], lo: int, hi: int) -> dict[int, TierSamples]:
    """Hourly rollups starting in ``[lo, hi)``, each at its last sample's time."""
    out: dict[int, list[TierSamples]] = {}
    for batch in batches(ids):
        rows = conn.execute(
            text(
                "SELECT series_id, last_ms, last, count, min, max, sum FROM rollup_1h "
                f"WHERE series_id IN ({in_list(batch)}) AND start_ms >= :lo AND start_ms < :hi "
                "ORDER BY series_id, start_ms"
            ),
            {"lo": lo, "hi": hi},
        ).all()
        if not rows:
            continue
        arr = np.array([tuple(r) for r in rows], dtype=np.float64)
        cuts = np.flatnonzero(np.r_[True, arr[1:, 0] != arr[:-1, 0]])
        for a, b in zip(cuts.tolist(), [*cuts[1:].tolist(), len(arr)], strict=True):
            block = arr[a:b]
            out.setdefault(int(block[0, 0]), []).append(
                TierSamples(block[:, 1].astype(np.int64), *(block[:, i] for i in range(2, 7)))
            )
    return {sid: TierSamples.concat(p) for sid, p in out.items()}


def _head(conn: Any, ids: list[int], lo: int, hi: int) -> dict[int, TierSamples]:
    """Head samples in ``[lo, hi]``, each its own statistics."""
    return {
        sid: TierSamples(t, v, np.ones(len(v)), v, v, v)
        for sid, (t, v) in head.head_samples(conn, ids, lo, hi + 1).items()
    }


def read_tiers(conn: Any, ids: list[int], lo: int, hi: int, *, hourly: bool) -> dict:
    """Tier samples with times in ``[lo, hi]``: hours, then minutes, then the head."""
    watermark = read_watermark(conn)
    parts: dict[int, list[TierSamples]] = {}
    minute_lo = floor(lo, MINUTE_MS)
    if hourly:
        hour_end = min(floor(watermark, HOUR_MS), hi + 1)
        for sid, got in _hours(conn, ids, floor(lo, HOUR_MS), hour_end).items():
            parts.setdefault(sid, []).append(got)
        minute_lo = max(minute_lo, hour_end)
    minute_end = min(watermark, hi + 1)
    for sid, block in by_series(minute_stats(conn, ids, minute_lo, minute_end)):
        parts.setdefault(sid, []).append(
            TierSamples(block[:, 7].astype(np.int64), *block[:, [6, 2, 3, 4, 5]].T)
        )
    for sid, got in _head(conn, ids, max(lo, minute_end), hi).items():
        parts.setdefault(sid, []).append(got)
    out = {}
    for sid, pieces in parts.items():
        merged = TierSamples.concat(pieces)
        keep = (merged.times >= lo) & (merged.times <= hi)
        if keep.any():
            out[sid] = TierSamples(*(getattr(merged, f)[keep] for f in _FIELDS))
    return out


def series_with_samples(conn: Any, ids: list[int], lo: int, hi: int) -> set[int]:
    """Which of ``ids`` hold a sample in ``[lo, hi]``: by hourly rollup, then hour chunk,
    minute chunk and head, each asked only about the series not found yet.

    Whole hours and minutes count, as Prometheus' answers count whole chunks and blocks.
    """
    found: set[int] = set()
    tiers = (("rollup_1h", "start_ms", HOUR_MS), ("samples_hour", "start_ms", HOUR_MS),
             ("samples_chunk", "start_ms", MINUTE_MS))  # fmt: skip
    for table, column, width in tiers:
        rest = [i for i in ids if i not in found]
        for batch in batches(rest):
            found.update(
                int(sid)
                for (sid,) in conn.execute(
                    text(
                        f"SELECT DISTINCT series_id FROM {table} WHERE series_id IN "
                        f"({in_list(batch)}) AND {column} >= :lo AND {column} <= :hi"
                    ),
                    {"lo": floor(lo, width), "hi": hi},
                )
            )
    found |= head.series_in(conn, [i for i in ids if i not in found], lo, hi)
    return found
