"""Functions over instant vectors and scalars (``abs``, ``clamp``, ``label_replace``,
``histogram_quantile``, ``time``...), as Prometheus 2.42 computes them at each step."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import promql_parser as pp
import re2

from hbmwatch.promql.errors import BadQuery, QueryError
from hbmwatch.promql.values import NAME, Grid, Labels, Row, Scalar, merge_rows, without_name

if TYPE_CHECKING:
    from hbmwatch.promql.engine import Evaluator

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RE2 = re2.Options()
_RE2.log_errors = False


def _sgn(v: np.ndarray) -> np.ndarray:
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


MATH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sgn": _sgn,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "deg": lambda v: v * 180 / math.pi,
    "rad": lambda v: v * math.pi / 180,
}

_CALENDAR: dict[str, Callable[[datetime], float]] = {
    "minute": lambda d: d.minute,
    "hour": lambda d: d.hour,
    "day_of_week": lambda d: (d.weekday() + 1) % 7,
    "day_of_month": lambda d: d.day,
    "day_of_year": lambda d: d.timetuple().tm_yday,
    "month": lambda d: d.month,
    "year": lambda d: d.year,
    "days_in_month": lambda d: (
        (datetime(d.year + d.month // 12, d.month % 12 + 1, 1) - datetime(d.year, d.month, 1)).days
    ),
}

FUNCTIONS = frozenset(
    [
        *MATH,
        *_CALENDAR,
        "round",
        "clamp",
        "clamp_min",
        "clamp_max",
        "timestamp",
        "label_replace",
        "label_join",
        "histogram_quantile",
        "absent",
        "vector",
        "scalar",
        "time",
        "pi",
        "sort",
        "sort_desc",
        "histogram_count",
        "histogram_sum",
        "histogram_fraction",
    ]
)


def absent_labels(node: pp.Expr) -> Labels:
    """The labels ``absent`` gives: the selector's equality matchers, as Prometheus does."""
    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    out: dict[str, str] = {}
    has: set[str] = set()
    for m in node.matchers.matchers:
        if m.name == NAME:
            continue
        if str(m.op).endswith("Equal") and "Not" not in str(m.op) and m.name not in has:
            out[m.name] = m.value
            has.add(m.name)
        else:
            out.pop(m.name, None)
    return tuple(sorted((k, v) for k, v in out.items() if v != ""))


def _map(rows: list[Row], fn: Callable[[np.ndarray], np.ndarray]) -> list[Row]:
    with np.errstate(all="ignore"):
        out = [Row(without_name(r.labels), fn(r.values), r.present) for r in rows]
    return merge_rows(out)


def _calendar(name: str, rows: list[Row] | None, grid: Grid) -> list[Row]:
    fn = _CALENDAR[name]
    if rows is None:
        rows = [Row((), grid.times / 1000, np.ones(len(grid), dtype=bool))]

    def apply(values: np.ndarray) -> np.ndarray:
        return np.array(
            [float(fn(datetime.fromtimestamp(float(v), UTC))) for v in values], dtype=float
        )

    return _map(rows, apply)


def _expand(template: str, match: object, names: dict[str, int], groups: int) -> str:
    """Go's ``Regexp.ExpandString``: ``$1``, ``${1}``, ``$name``; ``$$`` is ``$``."""
    out: list[str] = []
    rest = template
    while True:
        before, sep, after = rest.partition("$")
        if not sep:
            out.append(rest)
            return "".join(out)
        out.append(before)
        rest = after
        if rest.startswith("$"):
            out.append("$")
            rest = rest[1:]
            continue
        found = re.match(r"\{(\w+)\}|(\w+)", rest, re.ASCII)
        if found is None:
            out.append("$")
            continue
        name = found.group(1) or found.group(2)
        rest = rest[found.end() :]
        if name.isdigit() and not (name[0] == "0" and len(name) > 1):
            group = int(name)
        else:
            group = names.get(name, -1)
        if 0 <= group <= groups and match.group(group) is not None:  # type: ignore[attr-defined]
            out.append(match.group(group))  # type: ignore[attr-defined]


def label_replace(rows: list[Row], dst: str, repl: str, src: str, regex: str) -> list[Row]:
    try:
        program = re2.compile(f"^(?:{regex})$", _RE2)
    except re2.error:
        raise QueryError(f"invalid regular expression in label_replace(): {regex}") from None
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_replace(): {dst}")
    names = dict(program.groupindex)
    out = []
    for r in rows:
        labels = dict(r.labels)
        match = program.search(labels.get(src, ""))
        if match is not None:
            labels.pop(dst, None)
            value = _expand(repl, match, names, program.groups)
            if value:
                labels[dst] = value
        out.append(Row(tuple(sorted(labels.items())), r.values, r.present))
    return merge_rows(out)


def label_join(rows: list[Row], dst: str, sep: str, srcs: list[str]) -> list[Row]:
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_join(): {dst}")
    out = []
    for r in rows:
        labels = dict(r.labels)
        value = sep.join(labels.get(s, "") for s in srcs)
        labels.pop(dst, None)
        if value:
            labels[dst] = value
        out.append(Row(tuple(sorted(labels.items())), r.values, r.present))
    return merge_rows(out)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' quantile over classic buckets ``(upper bound, cumulative count)``."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for bound, count in buckets:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    peak = merged[0][1]
    for b in merged[1:]:
        peak = max(peak, b[1])
        b[1] = peak
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def histogram_quantile(q: np.ndarray, rows: list[Row], grid: Grid) -> list[Row]:
    groups: dict[Labels, list[tuple[float, Row]]] = defaultdict(list)
    for r in rows:
        labels = dict(r.labels)
        try:
            bound = float(labels.get("le", ""))
        except ValueError:
            continue
        groups[tuple(p for p in r.labels if p[0] != "le")].append((bound, r))
    out = []
    for key, members in groups.items():
        values, present = np.full(len(grid), np.nan), np.zeros(len(grid), dtype=bool)
        for step in range(len(grid)):
            buckets = [(b, float(r.values[step])) for b, r in members if r.present[step]]
            if buckets:
                values[step] = bucket_quantile(float(q[step]), buckets)
                present[step] = True
        out.append(Row(tuple(p for p in key if p[0] != NAME), values, present))
    return merge_rows(out)


def evaluate(ev: Evaluator, name: str, args: list[pp.Expr], grid: Grid) -> list[Row] | Scalar:
    n = len(grid)
    if name == "time":
        return Scalar(grid.times / 1000)
    if name == "pi":
        return Scalar(np.full(n, math.pi))
    if name == "vector":
        return [Row((), ev.scalar_arg(args[0], grid), np.ones(n, dtype=bool))]
    if name in _CALENDAR:
        return _calendar(name, ev.vector_arg(args[0], grid) if args else None, grid)
    if name == "histogram_quantile":
        return histogram_quantile(ev.scalar_arg(args[0], grid), ev.vector_arg(args[1], grid), grid)
    if name in ("histogram_count", "histogram_sum", "histogram_fraction"):
        ev.vector_arg(args[-1], grid)
        return []  # native histograms only; the store holds floats
    rows = ev.vector_arg(args[0], grid)
    if name in MATH:
        return _map(rows, MATH[name])
    if name == "scalar":
        return _scalar(rows, n)
    if name == "absent":
        present = np.zeros(n, dtype=bool)
        for r in rows:
            present |= r.present
        return [] if present.all() else [Row(absent_labels(args[0]), np.ones(n), ~present)]
    if name in ("sort", "sort_desc"):
        return _sorted(rows, descending=name == "sort_desc")
    if name == "timestamp":
        return _timestamp(rows, args[0], grid)
    if name == "label_replace":
        strings = [_string(a) for a in args[1:5]]
        return label_replace(rows, *strings)
    if name == "label_join":
        strings = [_string(a) for a in args[1:]]
        return label_join(rows, strings[0], strings[1], strings[2:])
    scalars = [ev.scalar_arg(a, grid) for a in args[1:]]
    return _clamping(name, rows, scalars)


def _clamping(name: str, rows: list[Row], scalars: list[np.ndarray]) -> list[Row]:
    if name == "round":
        to_nearest = scalars[0] if scalars else np.ones(1)
        inverse = 1.0 / to_nearest
        return _map(rows, lambda v: np.floor(v * inverse + 0.5) / inverse)
    if name == "clamp_min":
        return _map(rows, lambda v: _go_max(scalars[0], v))
    if name == "clamp_max":
        return _map(rows, lambda v: _go_min(scalars[0], v))
    if name == "clamp":
        low, high = scalars
        valid = ~(high < low)
        out = _map(rows, lambda v: _go_max(low, _go_min(high, v)))
        for r in out:
            r.present = r.present & valid
        return [r for r in out if r.any()]
    raise BadQuery(f"unknown function {name}")


def _go_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Go's ``math.Max``: NaN wins, and +0 beats -0."""
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b))


def _go_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.minimum(a, b))


def _scalar(rows: list[Row], n: int) -> Scalar:
    count = np.zeros(n, dtype=int)
    value = np.full(n, np.nan)
    for r in rows:
        count += r.present
        value = np.where(r.present, r.values, value)
    return Scalar(np.where(count == 1, value, np.nan))


def _sorted(rows: list[Row], *, descending: bool) -> list[Row]:
    """Instant results by value, NaN last either way (Prometheus' reversed heap sorts)."""
    if not rows or len(rows[0].values) != 1:
        return rows
    numbers = [r for r in rows if not np.isnan(r.values[0])]
    nans = [r for r in rows if np.isnan(r.values[0])]
    return sorted(numbers, key=lambda r: float(r.values[0]), reverse=descending) + nans


def _timestamp(rows: list[Row], arg: pp.Expr, grid: Grid) -> list[Row]:
    direct = isinstance(arg, pp.VectorSelector)
    out = []
    for r in rows:
        stamps = r.stamps if direct and r.stamps is not None else grid.times
        out.append(Row(without_name(r.labels), stamps / 1000, r.present))
    return merge_rows(out)


def _string(node: pp.Expr) -> str:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    if not isinstance(node, pp.StringLiteral):
        raise BadQuery("expected a string literal argument")
    return node.val
