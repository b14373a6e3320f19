"""Which tier a query reads: raw samples, or one sample per minute or hour.

Raw samples give Prometheus' answers exactly.  A long span at a coarse step reads the
rollup tiers instead, as the REST API does, where the query can still be answered from
them: every range in it must hold several tier samples (Thanos' rule of thumb, five), and
the hour tier serves no bare instant selector (its samples are further apart than the
5-minute lookback).  Subqueries always read raw samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import promql_parser as pp

from hbmwatch.promql.engine import LOOKBACK_MS, ms
from hbmwatch.promql.values import Grid

MINUTE_MS, HOUR_MS = 60_000, 3_600_000
TIERS = ("raw", "1m", "1h")
#: tier samples a range must hold at least
SAMPLES_PER_RANGE = 5


@dataclass
class Shape:
    ranges: list[int]  # ms, of every matrix selector
    reach: int  # ms: the furthest any selector looks back (range or lookback, plus offset)
    bare: bool  # an instant selector outside any range
    subquery: bool


def shape(node: pp.Expr) -> Shape:
    out = Shape([], LOOKBACK_MS, False, False)
    for item, inside_range in _walk(node, False):
        if isinstance(item, pp.SubqueryExpr):
            out.subquery = True
        elif isinstance(item, pp.MatrixSelector):
            r = ms(item.range)
            out.ranges.append(r)
            out.reach = max(out.reach, r + max(ms(item.vector_selector.offset), 0))
        elif isinstance(item, pp.VectorSelector):
            out.bare |= not inside_range
            out.reach = max(out.reach, LOOKBACK_MS + max(ms(item.offset), 0))
    return out


def _walk(node: pp.Expr, inside: bool) -> Iterator[tuple[pp.Expr, bool]]:
    yield node, inside
    if isinstance(node, pp.MatrixSelector):
        yield from _walk(node.vector_selector, True)
        return
    for name in ("expr", "lhs", "rhs", "param"):
        child = getattr(node, name, None)
        if isinstance(child, pp.Expr):
            yield from _walk(child, inside)
    for arg in getattr(node, "args", None) or ():
        yield from _walk(arg, inside)


def choose(node: pp.Expr, grid: Grid, raw_max_span_ms: int) -> str:
    """ "raw", "1m" or "1h" for this query over this grid."""
    s = shape(node)
    span = grid.end - grid.start + s.reach
    if s.subquery or span <= raw_max_span_ms:
        return "raw"
    shortest = min(s.ranges, default=None)
    step = grid.step if grid.end > grid.start else span

    def fits(tier_ms: int) -> bool:
        return step >= tier_ms and (shortest is None or shortest >= SAMPLES_PER_RANGE * tier_ms)

    if fits(HOUR_MS) and not s.bare and span > 24 * raw_max_span_ms:
        return "1h"
    return "1m" if fits(MINUTE_MS) else "raw"
