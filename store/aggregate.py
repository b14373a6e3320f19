"""Bucket arithmetic for range queries: pure numpy over one series' samples or partials.

A *partial* is (time, count, min, max, sum, last): a raw sample is a partial of count 1, a
1-minute or 1-hour rollup row is a partial of many.  Buckets are ``[t, t + step)`` aligned
to multiples of ``step`` since the epoch, so rollup rows fall wholly inside one bucket
whenever the step is a multiple of their width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmwatch.query import Aggregation


@dataclass(frozen=True, slots=True)
class Partials:
    t_ms: np.ndarray
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    last: np.ndarray

    @classmethod
    def of_samples(cls, t_ms: np.ndarray, values: np.ndarray) -> Partials:
        return cls(t_ms, np.ones(len(values), dtype=np.int64), values, values, values, values)

    @classmethod
    def concat(cls, parts: list[Partials]) -> Partials:
        if not parts:
            empty = np.zeros(0)
            return cls(empty.astype(np.int64), empty.astype(np.int64), empty, empty, empty, empty)
        fields = ("t_ms", "count", "min", "max", "sum", "last")
        joined = {f: np.concatenate([getattr(p, f) for p in parts]) for f in fields}
        order = np.argsort(joined["t_ms"], kind="stable")
        return cls(**{f: a[order] for f, a in joined.items()})


def aggregate(partials: Partials, step_ms: int, agg: Aggregation) -> tuple[np.ndarray, np.ndarray]:
    """Combine time-sorted partials into one value per non-empty bucket.

    >>> p = Partials.of_samples(np.array([0, 1000, 60000]), np.array([1.0, 3.0, 5.0]))
    >>> t, v = aggregate(p, 60000, Aggregation.AVG)
    >>> t.tolist(), v.tolist()
    ([0, 60000], [2.0, 5.0])
    """
    if len(partials.t_ms) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    buckets = partials.t_ms - partials.t_ms % step_ms
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    ends = np.r_[starts[1:], len(buckets)]
    if agg is Aggregation.MIN:
        values = np.minimum.reduceat(partials.min, starts)
    elif agg is Aggregation.MAX:
        values = np.maximum.reduceat(partials.max, starts)
    elif agg is Aggregation.SUM:
        values = np.add.reduceat(partials.sum, starts)
    elif agg is Aggregation.COUNT:
        values = np.add.reduceat(partials.count, starts).astype(np.float64)
    elif agg is Aggregation.LAST:
        values = partials.last[ends - 1]
    elif agg is Aggregation.AVG:
        values = np.add.reduceat(partials.sum, starts) / np.add.reduceat(partials.count, starts)
    else:
        raise ValueError(f"{agg} cannot be computed from partials")
    return buckets[starts], values


def quantile(
    t_ms: np.ndarray, values: np.ndarray, step_ms: int, q: float
) -> tuple[np.ndarray, np.ndarray]:
    """The q-quantile (linear interpolation) of raw samples per bucket."""
    if len(t_ms) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    buckets = t_ms - t_ms % step_ms
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    ends = np.r_[starts[1:], len(buckets)]
    out = np.array([np.quantile(values[a:b], q) for a, b in zip(starts, ends, strict=True)])
    return buckets[starts], out


def counter_increments(values: np.ndarray, wrap_bits: tuple[int, ...]) -> np.ndarray:
    """Increase between consecutive samples of a counter, across resets and wraps.

    A drop is a wrap at 2**W when the previous value sat in the top half of a W-bit range
    and the wrapped increase is in line with the counter's usual pace (at most ten times
    its median increase); otherwise it is a reset, and the new value is the increase.

    >>> v = np.array([4294967000.0, 4294967200.0, 100.0, 350.0])
    >>> counter_increments(v, (32, 64)).tolist()
    [200.0, 196.0, 250.0]
    >>> counter_increments(np.array([500.0, 900.0, 20.0]), (32,)).tolist()  # a reset
    [400.0, 20.0]
    """
    if len(values) < 2:
        return np.zeros(0)
    delta = np.diff(values)
    drops = np.flatnonzero(delta < 0)
    if len(drops) == 0:
        return delta
    rising = delta[delta > 0]
    pace = float(np.median(rising)) if len(rising) else None
    out = delta.copy()
    for i in drops:
        prev, cur = float(values[i]), float(values[i + 1])
        out[i] = cur
        for bits in sorted(wrap_bits):
            span = float(2**bits)
            if span / 2 <= prev < span:
                wrapped = span - prev + cur
                if pace is None or wrapped <= 10 * pace:
                    out[i] = wrapped
                break
    return out


def bucket_increase(
    t_ms: np.ndarray, values: np.ndarray, step_ms: int, wrap_bits: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Counter increase per bucket: each increment counts in the bucket of its later sample.

    >>> t = np.array([0, 30000, 60000, 90000])
    >>> bucket_increase(t, np.array([0.0, 10.0, 25.0, 5.0]), 60000, (32,))[1].tolist()
    [10.0, 20.0]
    """
    if len(t_ms) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    inc = counter_increments(values, wrap_bits)
    t = t_ms[1:]
    buckets = t - t % step_ms
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    return buckets[starts], np.add.reduceat(inc, starts)
