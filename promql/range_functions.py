"""Functions over range vectors (``rate(x[5m])``, ``avg_over_time``...), as Prometheus 2.42.

Every window of every series is computed at once: the samples of all series sit in one
flat array and each (series, step) window is a slice ``[lo, hi)`` of it.  Sequential sums
(Prometheus' Kahan summation, its running means) run in lockstep over the windows, one
sample position at a time, so the float operations are Prometheus' own in its order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import promql_parser as pp

from hbmwatch.promql.errors import BadQuery, QueryError
from hbmwatch.promql.instant_functions import absent_labels
from hbmwatch.promql.values import Grid, Row, Windows, check_unique, without_name

if TYPE_CHECKING:
    from hbmwatch.promql.engine import Evaluator


@dataclass
class Flat:
    """The windows of all series, flattened: ``lo``/``n`` per window into ``v``/``t``."""

    v: np.ndarray
    t: np.ndarray
    lo: np.ndarray  # [S, N]
    n: np.ndarray  # [S, N]
    ends: np.ndarray  # [N]
    range_ms: int
    #: (count, min, max, sum) per sample where samples stand for tier periods
    stats: tuple[np.ndarray, ...] | None = None

    @classmethod
    def of(cls, w: Windows) -> Flat:
        sizes = [len(s.times) for s in w.series]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        v = np.concatenate([s.values for s in w.series]) if w.series else np.empty(0)
        t = np.concatenate([s.times for s in w.series]) if w.series else np.empty(0, np.int64)
        stats = None
        if any(s.stats is not None for s in w.series):
            each = [s.stats or (np.ones(len(s.values)), s.values, s.values, s.values)
                    for s in w.series]  # fmt: skip
            stats = tuple(np.concatenate([e[i] for e in each]) for i in range(4))
        return cls(v, t, w.lo + offsets[:, None], w.counts, w.ends, w.range_ms, stats)


Result = tuple[np.ndarray, np.ndarray]  # values [S, N], present [S, N]


def _kahan_inc(inc: np.ndarray, s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = s + inc
    c = np.where(np.abs(s) >= np.abs(inc), c + ((s - t) + inc), c + ((inc - t) + s))
    return t, c


def _lockstep(f: Flat, sel: np.ndarray, body: Callable[[np.ndarray, np.ndarray, int], None]):
    """Call ``body(active, idx, k)`` for k = 0.. over the windows ``sel`` (flat indexes)."""
    lo, n = f.lo.ravel()[sel], f.n.ravel()[sel]
    for k in range(int(n.max()) if len(n) else 0):
        active = k < n
        body(active, lo[active] + k, k)


def _over(f: Flat, init: Callable[[int], dict], body, finish) -> Result:
    """Sequential reduction over every non-empty window."""
    sel = np.flatnonzero(f.n.ravel() > 0)
    state = init(len(sel))
    _lockstep(f, sel, lambda active, idx, k: body(state, active, f.v[idx], k))
    out = np.full(f.n.size, np.nan)
    out[sel] = finish(state)
    return out.reshape(f.n.shape), f.n > 0


def _sum(f: Flat) -> Result:
    def body(st, a, v, k):
        st["s"][a], st["c"][a] = _kahan_inc(v, st["s"][a], st["c"][a])

    def finish(st):
        return np.where(np.isinf(st["s"]), st["s"], st["s"] + st["c"])

    return _over(f, lambda m: {"s": np.zeros(m), "c": np.zeros(m)}, body, finish)


def _avg(f: Flat) -> Result:
    def body(st, a, v, k):
        count = float(k + 1)
        mean, c = st["m"][a], st["c"][a]
        skip = np.isinf(mean) & (
            (np.isinf(v) & ((mean > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v))
        )
        new_mean, new_c = _kahan_inc(v / count - mean / count, mean, c)
        st["m"][a] = np.where(skip, mean, new_mean)
        st["c"][a] = np.where(skip, c, new_c)

    def finish(st):
        return np.where(np.isinf(st["m"]), st["m"], st["m"] + st["c"])

    return _over(f, lambda m: {"m": np.zeros(m), "c": np.zeros(m)}, body, finish)


def _variance(f: Flat) -> Result:
    def body(st, a, v, k):
        count = float(k + 1)
        mean, cm, aux, ca = st["m"][a], st["cm"][a], st["x"][a], st["cx"][a]
        delta = v - (mean + cm)
        mean, cm = _kahan_inc(delta / count, mean, cm)
        aux, ca = _kahan_inc(delta * (v - (mean + cm)), aux, ca)
        st["m"][a], st["cm"][a], st["x"][a], st["cx"][a] = mean, cm, aux, ca

    def init(m):
        return {key: np.zeros(m) for key in ("m", "cm", "x", "cx")}

    sel_n = f.n.ravel()[f.n.ravel() > 0].astype(float)
    return _over(f, init, body, lambda st: (st["x"] + st["cx"]) / sel_n)


def _extreme(f: Flat, better: Callable) -> Result:
    def body(st, a, v, k):
        cur = st["x"][a]
        st["x"][a] = np.where((k == 0) | better(v, cur) | np.isnan(cur), v, cur)

    return _over(f, lambda m: {"x": np.zeros(m)}, body, lambda st: st["x"])


def _first_last(f: Flat) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    last = np.clip(f.lo + f.n - 1, 0, None)
    first = np.clip(f.lo, 0, max(len(f.v) - 1, 0))
    if len(f.v) == 0:
        zeros = np.zeros(f.n.shape)
        return zeros, zeros, zeros, zeros
    return f.v[first], f.v[last], f.t[first].astype(float), f.t[last].astype(float)


def _counted(f: Flat, flags: np.ndarray) -> np.ndarray:
    """How many positions j with lo < j < lo + n have ``flags[j]`` set, per window."""
    prefix = np.concatenate([[0], np.cumsum(flags)])
    hi = f.lo + f.n
    return prefix[np.clip(hi, 0, None)] - prefix[np.clip(f.lo + 1, 0, len(flags))]


def _drops(v: np.ndarray) -> np.ndarray:
    return np.r_[False, v[1:] < v[:-1]]


def _extrapolated(f: Flat, counter: bool, rate: bool) -> Result:
    first, last, t_first, t_last = _first_last(f)
    ok = f.n >= 2
    result = last - first
    if counter and len(f.v):
        drops = _drops(f.v)
        for s, step in zip(*np.nonzero((_counted(f, drops) > 0) & ok), strict=True):
            lo, hi = f.lo[s, step], f.lo[s, step] + f.n[s, step]
            value = result[s, step]
            for j in np.flatnonzero(drops[lo + 1 : hi]) + lo + 1:
                value += f.v[j - 1]
            result[s, step] = value
    ends = f.ends.astype(float)[None, :]
    to_start = (t_first - (ends - f.range_ms)) / 1000
    to_end = (ends - t_last) / 1000
    sampled = (t_last - t_first) / 1000
    with np.errstate(divide="ignore", invalid="ignore"):
        average = sampled / (f.n - 1)
        if counter:
            to_zero = sampled * (first / result)
            use = (result > 0) & (first >= 0) & (to_zero < to_start)
            to_start = np.where(use, to_zero, to_start)
        threshold = average * 1.1
        span = sampled + np.where(to_start < threshold, to_start, average / 2)
        span = span + np.where(to_end < threshold, to_end, average / 2)
        factor = span / sampled
        if rate:
            factor = factor / (f.range_ms / 1000)
        return result * factor, ok


def _instant(f: Flat, rate: bool) -> Result:
    ok = f.n >= 2
    last_i = np.clip(f.lo + f.n - 1, 1, None)
    if len(f.v) < 2:
        return np.zeros(f.n.shape), np.zeros(f.n.shape, dtype=bool)
    last, prev = f.v[last_i], f.v[last_i - 1]
    interval = f.t[last_i] - f.t[last_i - 1]
    result = np.where(last < prev, last, last - prev) if rate else last - prev
    ok &= interval != 0
    if rate:
        with np.errstate(divide="ignore", invalid="ignore"):
            result = result / (interval.astype(float) / 1000)
    return result, ok


def _regression(f: Flat, intercept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slope and intercept per window (Prometheus' Kahan-summed least squares)."""
    sel = np.flatnonzero(f.n.ravel() >= 2)
    base = np.broadcast_to(intercept, f.n.shape).ravel()[sel]
    first_v = f.v[f.lo.ravel()[sel]] if len(sel) else np.empty(0)
    keys = ("x", "cx", "y", "cy", "xy", "cxy", "x2", "cx2")
    st = {key: np.zeros(len(sel)) for key in keys}
    const = np.ones(len(sel), dtype=bool)

    def body(a, idx, k):
        x = (f.t[idx] - base[a]).astype(float) / 1e3
        v = f.v[idx]
        const[a] &= (k == 0) | (v == first_v[a])
        for name, inc in (("x", x), ("y", v), ("xy", x * v), ("x2", x * x)):
            st[name][a], st["c" + name][a] = _kahan_inc(inc, st[name][a], st["c" + name][a])

    _lockstep(f, sel, body)
    n = f.n.ravel()[sel].astype(float)
    sx, sy = st["x"] + st["cx"], st["y"] + st["cy"]
    sxy, sx2 = st["xy"] + st["cxy"], st["x2"] + st["cx2"]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (sxy - sx * sy / n) / (sx2 - sx * sx / n)
        inter = sy / n - slope * sx / n
    inf_const = const & np.isinf(first_v)
    slope = np.where(const, np.where(inf_const, np.nan, 0.0), slope)
    inter = np.where(const, np.where(inf_const, np.nan, first_v), inter)
    out_s, out_i = np.full(f.n.size, np.nan), np.full(f.n.size, np.nan)
    out_s[sel], out_i[sel] = slope, inter
    return out_s.reshape(f.n.shape), out_i.reshape(f.n.shape), f.n >= 2


def _per_window(f: Flat, fn: Callable[[np.ndarray, int], float]) -> Result:
    out = np.full(f.n.shape, np.nan)
    for s, step in zip(*np.nonzero(f.n > 0), strict=True):
        lo = f.lo[s, step]
        out[s, step] = fn(f.v[lo : lo + f.n[s, step]], step)
    return out, f.n > 0


def quantile(q: float, values: np.ndarray) -> float:
    """Prometheus' ``quantile``: linear between the closest ranks, NaN sorted first."""
    if len(values) == 0 or np.isnan(q):
        return float("nan")
    if q < 0:
        return float("-inf")
    if q > 1:
        return float("inf")
    ordered = np.concatenate([values[np.isnan(values)], np.sort(values[~np.isnan(values)])])
    n = float(len(ordered))
    rank = q * (n - 1)
    lower = max(0.0, np.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - np.floor(rank)
    return float(ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight)


def _holt_winters(sf: float, tf: float) -> Callable[[np.ndarray, int], float]:
    def fn(values: np.ndarray, step: int) -> float:
        if len(values) < 2:
            return float("nan")
        s0, s1, b = 0.0, float(values[0]), float(values[1] - values[0])
        for i in range(1, len(values)):
            x = sf * float(values[i])
            b = b if i == 1 else tf * (s1 - s0) + (1 - tf) * b
            y = (1 - sf) * (s1 + b)
            s0, s1 = s1, x + y
        return s1

    return fn


FUNCTIONS = frozenset(
    [
        "rate",
        "increase",
        "delta",
        "irate",
        "idelta",
        "deriv",
        "predict_linear",
        "resets",
        "changes",
        "avg_over_time",
        "sum_over_time",
        "count_over_time",
        "min_over_time",
        "max_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "last_over_time",
        "present_over_time",
        "quantile_over_time",
        "absent_over_time",
        "holt_winters",
    ]
)


def _from_stats(name: str, f: Flat) -> Result:
    """``*_over_time`` over tier samples: from each period's count, min, max and sum."""
    count, low, high, total = f.stats  # type: ignore[misc]
    ok = f.n > 0
    if name in ("min_over_time", "max_over_time"):
        source = low if name == "min_over_time" else high
        better = np.less if name == "min_over_time" else np.greater
        return _extreme(replace(f, v=source), better)
    sums = {}
    for key, arr in (("count", count), ("sum", total)):
        prefix = np.concatenate([[0.0], np.cumsum(arr)])
        sums[key] = prefix[f.lo + f.n] - prefix[f.lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = {
            "count_over_time": sums["count"],
            "sum_over_time": sums["sum"],
            "avg_over_time": sums["sum"] / sums["count"],
        }[name]
    return value, ok


_FROM_STATS = {"count_over_time", "sum_over_time", "avg_over_time", "min_over_time",
               "max_over_time"}  # fmt: skip


def _compute(name: str, f: Flat, scalars: list[np.ndarray], grid: Grid) -> Result:
    if f.stats is not None and name in _FROM_STATS:
        return _from_stats(name, f)
    if name in ("rate", "increase", "delta"):
        return _extrapolated(f, counter=name != "delta", rate=name == "rate")
    if name in ("irate", "idelta"):
        return _instant(f, rate=name == "irate")
    if name == "deriv":
        starts = f.t[np.clip(f.lo, 0, len(f.t) - 1)] if len(f.t) else np.zeros(f.n.shape)
        slope, _, ok = _regression(f, starts)
        return slope, ok
    if name == "predict_linear":
        slope, inter, ok = _regression(f, grid.times)
        return slope * scalars[0][None, :] + inter, ok
    if name in ("resets", "changes"):
        if len(f.v) == 0:
            return np.zeros(f.n.shape), f.n > 0
        a, b = f.v[1:], f.v[:-1]
        changed = (a != b) & ~(np.isnan(a) & np.isnan(b))
        flags = _drops(f.v) if name == "resets" else np.r_[False, changed]
        return _counted(f, flags).astype(float), f.n > 0
    simple = {
        "sum_over_time": _sum,
        "avg_over_time": _avg,
        "max_over_time": lambda f: _extreme(f, np.greater),
        "min_over_time": lambda f: _extreme(f, np.less),
    }
    if name in simple:
        return simple[name](f)
    if name in ("stddev_over_time", "stdvar_over_time"):
        var, ok = _variance(f)
        return (np.sqrt(var) if name == "stddev_over_time" else var), ok
    if name == "count_over_time":
        return f.n.astype(float), f.n > 0
    if name == "last_over_time":
        return _first_last(f)[1], f.n > 0
    if name in ("present_over_time",):
        return np.ones(f.n.shape), f.n > 0
    if name == "quantile_over_time":
        return _per_window(f, lambda v, step: quantile(float(scalars[0][step]), v))
    if name == "holt_winters":
        sf, tf = float(scalars[0][0]), float(scalars[1][0])
        if not 0 < sf < 1:
            raise QueryError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {sf:f}")
        if not 0 < tf < 1:
            raise QueryError(f"invalid trend factor. Expected: 0 < tf < 1, got: {tf:f}")
        values, ok = _per_window(f, _holt_winters(sf, tf))
        return values, ok & (f.n >= 2)
    raise BadQuery(f"unknown function {name}")


def evaluate(ev: Evaluator, name: str, args: list[pp.Expr], grid: Grid) -> list[Row]:
    position = 1 if name == "quantile_over_time" else 0
    target = args[position]
    if not isinstance(target, (pp.MatrixSelector, pp.SubqueryExpr)):
        raise BadQuery(f"expected type range vector in call to function {name!r}")
    windows = ev.eval(target, grid)
    assert isinstance(windows, Windows)
    scalars = [ev.scalar_arg(a, grid) for i, a in enumerate(args) if i != position]
    f = Flat.of(windows)
    if name == "absent_over_time":
        return _absent_over_time(f, target, grid)
    with np.errstate(all="ignore"):  # Inf and NaN arithmetic is PromQL's, not an accident
        values, present = _compute(name, f, scalars, grid)
    rows = []
    for i, s in enumerate(windows.series):
        if present[i].any():
            labels = s.labels if name == "last_over_time" else without_name(s.labels)
            rows.append(Row(labels, values[i], present[i].copy()))
    check_unique(rows)
    return rows


def _absent_over_time(f: Flat, target: pp.Expr, grid: Grid) -> list[Row]:
    covered = (f.n > 0).any(axis=0) if f.n.size else np.zeros(len(grid), dtype=bool)
    if covered.all():
        return []
    labels = absent_labels(target) if isinstance(target, pp.MatrixSelector) else ()
    return [Row(labels, np.ones(len(grid)), ~covered)]
