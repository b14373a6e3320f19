"""The PromQL evaluator: Prometheus 2.42's semantics over a ``SampleSource``.

``evaluate(text, grid, source)`` parses with the ``promql-parser`` library and walks the
tree once for the whole grid (one step for an instant query).  Each node's value covers
every step, so operators are numpy over steps; the series keep Prometheus' order, so sums
and ties come out as Prometheus computes them.  What the engine does not evaluate raises
``Unsupported`` naming the construct, never a guess.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import promql_parser as pp

from hbmwatch.matchers import Matcher, MatchOp, compile_regex
from hbmwatch.promql import aggregate, binary, instant_functions, range_functions
from hbmwatch.promql.errors import BadQuery, QueryError, Unsupported
from hbmwatch.promql.source import SampleSource
from hbmwatch.promql.values import (
    NAME,
    Grid,
    RawSeries,
    Row,
    Scalar,
    String,
    Value,
    Windows,
    check_unique,
    is_stale,
    without_name,
)
from hbmwatch.query import check_time_budget
from hbmwatch.validation import HbmwatchError

LOOKBACK_MS = 300_000
#: the step of a subquery that names none: Prometheus' default evaluation interval
SUBQUERY_STEP_MS = 60_000
_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
# Prometheus 2.42 still has holt_winters (3.0 renamed it); the parser follows 3.0.
pp.register_extra_functions(
    [
        pp.Function(
            "holt_winters",
            [pp.ValueType.Matrix, pp.ValueType.Scalar, pp.ValueType.Scalar],
            pp.ValueType.Vector,
            False,
        )
    ]
)


def parse(text: str) -> pp.Expr:
    """The syntax tree, or ``BadQuery`` with the parser's message."""
    if not text.strip():
        raise BadQuery("parse error: no expression found in input")
    try:
        return pp.parse(text)
    except (ValueError, TypeError) as exc:
        raise BadQuery(f"parse error: {exc}") from None


def ms(delta: timedelta | None) -> int:
    if delta is None:
        return 0
    return (delta.days * 86_400_000) + (delta.seconds * 1000) + delta.microseconds // 1000


def unwrap(node: pp.Expr) -> pp.Expr:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


class Evaluator:
    """Evaluates one query over one grid; ``source`` supplies the samples."""

    def __init__(self, source: SampleSource, lookback_ms: int = LOOKBACK_MS) -> None:
        self.source = source
        self.lookback = lookback_ms

    def eval(self, node: pp.Expr, grid: Grid) -> Value:
        check_time_budget()
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, grid)
        if isinstance(node, pp.NumberLiteral):
            return Scalar(np.full(len(grid), float(node.val)))
        if isinstance(node, pp.StringLiteral):
            return String(node.val)
        if isinstance(node, pp.UnaryExpr):
            return _negate(self.eval(node.expr, grid))
        if isinstance(node, pp.VectorSelector):
            return self.vector(node, grid)
        if isinstance(node, pp.MatrixSelector):
            return self.windows(node, grid)
        if isinstance(node, pp.SubqueryExpr):
            return self.subquery(node, grid)
        if isinstance(node, pp.Call):
            return self.call(node, grid)
        if isinstance(node, pp.AggregateExpr):
            return aggregate.evaluate(self, node, grid)
        if isinstance(node, pp.BinaryExpr):
            return binary.evaluate(self, node, grid)
        raise Unsupported(f"expression {type(node).__name__}")

    # selectors -------------------------------------------------------------------------

    def _at(self, at: pp.AtModifier | None, grid: Grid) -> int | None:
        if at is None:
            return None
        kind = str(at.type).rsplit(".", 1)[-1]
        if kind == "Start":
            return grid.start
        if kind == "End":
            return grid.end
        try:
            return round(at.at.timestamp() * 1000)
        except BaseException:
            raise Unsupported("the @ modifier with a time before 1970") from None

    def _refs(self, node: pp.VectorSelector, grid: Grid) -> np.ndarray:
        at = self._at(node.at, grid)
        times = np.full(len(grid), at, dtype=np.int64) if at is not None else grid.times
        return times - ms(node.offset)

    def select(self, node: pp.VectorSelector, lo: int, hi: int) -> list[RawSeries]:
        return self.source.select(matchers_of(node), lo, hi)

    def vector(self, node: pp.VectorSelector, grid: Grid) -> list[Row]:
        refs = self._refs(node, grid)
        rows = []
        for s in self.select(node, int(refs.min()) - self.lookback, int(refs.max())):
            idx = np.searchsorted(s.times, refs, side="right") - 1
            at = np.clip(idx, 0, None)
            present = (idx >= 0) & (s.times[at] >= refs - self.lookback)
            present &= ~is_stale(s.values[at])
            if present.any():
                rows.append(Row(s.labels, s.values[at], present, s.times[at]))
        return rows

    def windows(self, node: pp.MatrixSelector, grid: Grid) -> Windows:
        vs = node.vector_selector
        refs = self._refs(vs, grid)
        range_ms = ms(node.range)
        series = self.select(vs, int(refs.min()) - range_ms, int(refs.max()))
        live = [_without_markers(s) for s in series]
        return Windows.over(live, refs, range_ms)

    def subquery(self, node: pp.SubqueryExpr, grid: Grid) -> Windows:
        if node.at is not None:
            raise Unsupported("the @ modifier on a subquery")
        offset, range_ms = ms(node.offset), ms(node.range)
        step = ms(node.step) or SUBQUERY_STEP_MS
        first = grid.start - offset - range_ms
        start = step * (first // step) if first >= 0 else -((-first) // step) * step
        if start < first:
            start += step
        inner = Grid(start, grid.end - offset, step)
        value = self.eval(node.expr, inner)
        if isinstance(value, Scalar):
            value = [Row((), value.values, np.ones(len(inner), dtype=bool))]
        if not isinstance(value, list):
            raise BadQuery("subquery is only allowed on instant vector or scalar expressions")
        times = inner.times
        series = [RawSeries(r.labels, times[r.present], r.values[r.present]) for r in value]
        return Windows.over(series, grid.times - offset, range_ms)

    # functions -------------------------------------------------------------------------

    def call(self, node: pp.Call, grid: Grid) -> Value:
        name = node.func.name
        args = [unwrap(a) for a in node.args]
        if name in range_functions.FUNCTIONS:
            return range_functions.evaluate(self, name, args, grid)
        if name in instant_functions.FUNCTIONS:
            return instant_functions.evaluate(self, name, args, grid)
        raise Unsupported(f"function {name}()")

    def scalar_arg(self, node: pp.Expr, grid: Grid) -> np.ndarray:
        value = self.eval(node, grid)
        if not isinstance(value, Scalar):
            raise BadQuery("expected a scalar argument")
        return value.values

    def vector_arg(self, node: pp.Expr, grid: Grid) -> list[Row]:
        value = self.eval(node, grid)
        if not isinstance(value, list):
            raise BadQuery("expected an instant vector argument")
        return value


def matchers_of(node: pp.VectorSelector) -> list[Matcher]:
    if node.matchers.or_matchers:
        raise Unsupported("'or' between label matchers")
    out = [_matcher(NAME, "=", node.name)] if node.name else []
    for m in node.matchers.matchers:
        out.append(_matcher(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value))
    return out


def _matcher(label: str, op: str, value: str) -> Matcher:
    """The kernel's matcher (RE2, anchored); ``__name__`` is a label here."""
    try:
        if label == NAME:
            kind = MatchOp(op)
            regex = compile_regex(value) if kind in (MatchOp.RE, MatchOp.NRE) else None
            return Matcher(NAME, kind, value, regex)
        return Matcher.of(label, op, value)
    except HbmwatchError as exc:
        raise BadQuery(str(exc)) from None


def _without_markers(s: RawSeries) -> RawSeries:
    """Range selections skip staleness markers, as Prometheus' do."""
    stale = is_stale(s.values)
    if not stale.any():
        return s
    return RawSeries(s.labels, s.times[~stale], s.values[~stale], s.stats)


def _negate(value: Value) -> Value:
    if isinstance(value, Scalar):
        return Scalar(-value.values)
    if isinstance(value, list):
        rows = [Row(without_name(r.labels), -r.values, r.present) for r in value]
        check_unique(rows)
        return rows
    raise BadQuery("unary minus applies to scalars and instant vectors")


def evaluate(text: str, grid: Grid, source: SampleSource) -> Value:
    """The value of ``text`` at every step of ``grid``."""
    tree = parse(text)
    return Evaluator(source).eval(tree, grid)


__all__ = ["Evaluator", "QueryError", "evaluate", "parse"]
