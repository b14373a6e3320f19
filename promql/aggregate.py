"""Aggregation operators (``sum by (rack) (...)``, ``topk``, ``count_values``...).

Groups are fixed by labels, so most operators accumulate group by group over all steps at
once, member by member in input order, with Prometheus' own update rules (its running
mean for ``avg``, Welford for ``stddev``).  ``topk``/``bottomk`` replay Go's heap step by
step, so ties pick the series Prometheus picks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import promql_parser as pp

from hbmwatch.promql.errors import BadQuery, QueryError
from hbmwatch.promql.range_functions import quantile
from hbmwatch.promql.values import NAME, Grid, Labels, Row, merge_rows

if TYPE_CHECKING:
    from hbmwatch.promql.engine import Evaluator

_LABEL = __import__("re").compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LINEAR = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"}


def _grouping(node: pp.AggregateExpr) -> tuple[list[str], bool]:
    modifier = node.modifier
    if modifier is None:
        return [], False
    without = str(modifier.type).endswith("Without")
    return sorted(modifier.labels), without


def group_labels(labels: Labels, grouping: list[str], without: bool) -> Labels:
    if without:
        drop = {*grouping, NAME}
        return tuple(p for p in labels if p[0] not in drop)
    keep = set(grouping)
    return tuple(p for p in labels if p[0] in keep)


def evaluate(ev: Evaluator, node: pp.AggregateExpr, grid: Grid) -> list[Row]:
    op = str(node.op)
    grouping, without = _grouping(node)
    param = node.param
    while isinstance(param, pp.ParenExpr):
        param = param.expr
    if op == "count_values":
        if not isinstance(param, pp.StringLiteral):
            raise BadQuery("expected type string in aggregation parameter")
        return _count_values(ev.vector_arg(node.expr, grid), param.val, grouping, without, grid)
    scalar = ev.scalar_arg(param, grid) if param is not None else None
    rows = ev.vector_arg(node.expr, grid)
    groups: dict[Labels, list[Row]] = {}
    for r in rows:
        groups.setdefault(group_labels(r.labels, grouping, without), []).append(r)
    if op in _LINEAR:
        return merge_rows(
            _linear(op, labels, members, len(grid)) for labels, members in groups.items()
        )
    if op == "quantile":
        assert scalar is not None
        return merge_rows(_quantile(labels, members, scalar) for labels, members in groups.items())
    if op in ("topk", "bottomk"):
        assert scalar is not None
        return _top(op == "topk", groups, scalar, grid)
    raise BadQuery(f"unknown aggregation {op}")


def _linear(op: str, labels: Labels, members: list[Row], n: int) -> Row:
    seen = np.zeros(n, dtype=bool)
    value, mean, count = np.zeros(n), np.zeros(n), np.zeros(n)
    with np.errstate(all="ignore"):
        for r in members:
            v, new = r.values, r.present & ~seen
            upd = r.present & seen
            value = np.where(new, 0.0 if op in ("stddev", "stdvar") else v, value)
            mean, count = np.where(new, v, mean), np.where(new, 1.0, count)
            value, mean, count = _update(op, upd, v, value, mean, count)
            seen |= r.present
        if op == "avg":
            value = mean
        elif op == "count":
            value = count
        elif op == "group":
            value = np.ones(n)
        elif op == "stdvar":
            value = value / count
        elif op == "stddev":
            value = np.sqrt(value / count)
    return Row(labels, value, seen)


def _update(op: str, upd: np.ndarray, v: np.ndarray, value, mean, count):
    if op == "sum":
        return np.where(upd, value + v, value), mean, count
    if op in ("count", "group"):
        return value, mean, np.where(upd, count + 1, count)
    if op == "max":
        return np.where(upd & ((value < v) | np.isnan(value)), v, value), mean, count
    if op == "min":
        return np.where(upd & ((value > v) | np.isnan(value)), v, value), mean, count
    count = np.where(upd, count + 1, count)
    if op == "avg":
        skip = np.isinf(mean) & (
            (np.isinf(v) & ((mean > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v))
        )
        moved = mean + (v / count - mean / count)
        return value, np.where(upd & ~skip, moved, mean), count
    delta = v - mean  # stddev, stdvar: Welford
    new_mean = mean + delta / count
    new_value = value + delta * (v - new_mean)
    return np.where(upd, new_value, value), np.where(upd, new_mean, mean), count


def _quantile(labels: Labels, members: list[Row], q: np.ndarray) -> Row:
    n = len(q)
    value, present = np.full(n, np.nan), np.zeros(n, dtype=bool)
    for step in range(n):
        values = np.array([r.values[step] for r in members if r.present[step]])
        if len(values):
            value[step], present[step] = quantile(float(q[step]), values), True
    return Row(labels, value, present)


def _top(largest: bool, groups: dict[Labels, list[Row]], k_values: np.ndarray, grid: Grid):
    ks = []
    for k_float in k_values.tolist():
        if not np.isfinite(k_float) or abs(k_float) >= 2**63:
            raise QueryError(f"Scalar value {k_float:g} overflows int64")
        ks.append(int(k_float))
    k = np.array(ks)
    out = []
    for members in groups.values():
        chosen = _top_group(largest, members, k)
        rows = [Row(r.labels, r.values, mask) for r, mask in zip(members, chosen, strict=True)]
        out.extend(_ordered([r for r in rows if r.any()], largest))
    return out


def _ordered(rows: list[Row], largest: bool) -> list[Row]:
    """An instant answer lists a group's picks best first, NaN last, as Prometheus does."""
    if not rows or len(rows[0].values) != 1:
        return rows
    numbers = [r for r in rows if not np.isnan(r.values[0])]
    nans = [r for r in rows if np.isnan(r.values[0])]
    return sorted(numbers, key=lambda r: float(r.values[0]), reverse=largest) + nans


def _top_group(largest: bool, members: list[Row], k: np.ndarray) -> np.ndarray:
    """Which members each step keeps: by value where that is unambiguous, else Go's heap."""
    values = np.array([r.values for r in members])
    present = np.array([r.present for r in members])
    chosen = present & (k >= 1)[None, :]
    count = present.sum(axis=0)
    crowded = np.flatnonzero((count > k) & (k >= 1))
    if not len(crowded):
        return chosen
    sub = values[:, crowded]
    key = np.where(present[:, crowded], sub if largest else -sub, -np.inf)
    kth = -np.sort(-key, axis=0)[k[crowded] - 1, np.arange(len(crowded))]
    chosen[:, crowded] = key > kth
    ties = (key == kth).sum(axis=0)
    needed = k[crowded] - chosen[:, crowded].sum(axis=0)
    fill = ties == needed
    chosen[:, crowded[fill]] |= (key == kth)[:, fill]
    messy = ~fill | np.isnan(sub).any(axis=0) | np.isinf(kth)
    for step in crowded[messy].tolist():
        picked = {id(r) for r in _heap_select([r for r in members if r.present[step]], step,
                                              int(k[step]), largest)}  # fmt: skip
        chosen[:, step] = [id(r) in picked for r in members]
    return chosen


def _heap_select(rows: list[Row], step: int, k: int, largest: bool) -> list[Row]:
    """Go's container/heap as Prometheus drives it for topk (min-heap) or bottomk."""
    if not rows:
        return []

    def less(a: Row, b: Row) -> bool:
        x, y = a.values[step], b.values[step]
        return bool(np.isnan(x) or (x < y if largest else x > y))

    heap = [rows[0]]
    for r in rows[1:]:
        top = heap[0].values[step]
        v = r.values[step]
        if len(heap) < k or (top < v if largest else top > v) or np.isnan(top):
            if len(heap) == k:
                if k == 1:
                    heap[0] = r
                    continue
                _pop(heap, less)
            heap.append(r)
            _up(heap, len(heap) - 1, less)
    return heap


def _up(h: list[Row], j: int, less: Callable[[Row, Row], bool]) -> None:
    while True:
        i = (j - 1) // 2
        if i == j or j <= 0 or not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        j = i


def _pop(h: list[Row], less: Callable[[Row, Row], bool]) -> None:
    n = len(h) - 1
    h[0], h[n] = h[n], h[0]
    i = 0
    while True:
        j1 = 2 * i + 1
        if j1 >= n:
            break
        j = j1
        if j1 + 1 < n and less(h[j1 + 1], h[j1]):
            j = j1 + 1
        if not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        i = j
    h.pop()


def format_value(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest digits, never an exponent."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, unique=True, trim="-")


def _count_values(rows: list[Row], label: str, grouping: list[str], without: bool, grid: Grid):
    if not _LABEL.match(label):
        raise QueryError(f'invalid label name "{label}"')
    keys = grouping if without else sorted({*grouping, label})
    out: dict[Labels, Row] = {}
    n = len(grid)
    for step in range(n):
        for r in rows:
            if not r.present[step]:
                continue
            labels = dict(r.labels)
            labels[label] = format_value(float(r.values[step]))
            key = group_labels(tuple(sorted(labels.items())), keys, without)
            row = out.setdefault(key, Row(key, np.zeros(n), np.zeros(n, dtype=bool)))
            row.values[step] += 1
            row.present[step] = True
    return list(out.values())
