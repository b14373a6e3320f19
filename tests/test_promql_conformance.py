"""Prometheus 2.42's own PromQL tests (``promql/testdata/*.test``) run through hbmwatch's engine.

Each ``eval`` runs as Prometheus' ``promql/test.go`` runs it: an instant query at its time,
then a range query from a minute before to a minute after, step one minute, whose middle
step must give the same answer; and, unless the expression calls a function whose value
depends on the evaluation time, the same again with ``@ <time>`` on every selector at the
times -10t, 0, t/5, t and 10t (-1s, 0, 1s when t is 0).  Values compare within a relative
1e-6 (NaN equals NaN), order counts only for ``eval_ordered``, and ``eval_fail`` must fail.

What hbmwatch deliberately lacks is skipped with its reason, all in ``SKIPS``; everything
else must pass, and a failure is an engine defect.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import promql_parser as pp
import pytest

from hbmwatch.promql.engine import Evaluator, parse
from hbmwatch.promql.errors import QueryError, Unsupported
from hbmwatch.promql.values import Grid, Labels, Row, Scalar, String, Windows
from tests.promql_testfile import (
    Clear,
    Eval,
    Load,
    Store,
    is_stale,
    parse_file,
    parse_series,
    read_file,
)

FIXTURES = Path(__file__).parent / "fixtures" / "promql"

#: Every reason a case or a part of one does not run: what hbmwatch leaves out on purpose.
SKIPS = {
    "at_subquery": "the @ modifier on subqueries: hbmwatch's engine refuses it",
}
# Not skipped: staleness markers (the engine honours them since main 5a4a6b2); native
# histograms would be skipped, but Prometheus 2.42's histograms.test has classic ones only.
#: Prometheus' functions whose value depends on the evaluation time (``AtModifierUnsafeFunctions``).
AT_UNSAFE = {
    "days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month",
    "year", "predict_linear", "time", "timestamp",
}  # fmt: skip
#: Cases that fail today, ``file:line`` -> the engine defect they show (none at main 5a4a6b2).
#: Strict: a fix turns its cases red here until they leave this table.
XFAIL: dict[str, str] = {}

EPSILON = 1e-6
MIN_NORMAL = sys.float_info.min


@dataclass(frozen=True)
class Case:
    file: str
    cmd: Eval
    loads: tuple[Load, ...]

    @property
    def id(self) -> str:
        return f"{self.file}:{self.cmd.line}"


def all_cases() -> list[Case]:
    cases = []
    for path in sorted(FIXTURES.glob("*.test")):
        loads: list[Load] = []
        for cmd in read_file(path):
            if isinstance(cmd, Clear):
                loads = []
            elif isinstance(cmd, Load):
                loads.append(cmd)
            else:
                cases.append(Case(path.stem, cmd, tuple(loads)))
    return cases


class Mismatch(AssertionError):
    pass


class SkipVariant(Exception):
    """This ``@`` variant needs what hbmwatch lacks; ``reason`` is a key of ``SKIPS``."""


def almost_equal(a: float, b: float) -> bool:
    """Prometheus' ``almostEqual``: relative error under 1e-6, NaN equal to NaN."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or diff < MIN_NORMAL:
        return diff < EPSILON * MIN_NORMAL
    return diff / (abs(a) + abs(b)) < EPSILON


def text(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


def compare(cmd: Eval, got: float | list[tuple[Labels, float]]) -> None:
    """Prometheus' ``compareResult``: a ``Mismatch`` saying what differs."""
    if isinstance(got, float):
        if cmd.scalar is None:
            raise Mismatch(f"got scalar {got}, expected a vector")
        if not almost_equal(cmd.scalar, got):
            raise Mismatch(f"expected scalar {cmd.scalar} but got {got}")
        return
    expected = {e.labels: e for e in cmd.series}
    seen = set()
    for pos, (labels, value) in enumerate(got, start=1):
        exp = expected.get(labels)
        if exp is None:
            raise Mismatch(f"unexpected metric {text(labels)} {value} in result")
        if cmd.ordered and exp.pos != pos:
            raise Mismatch(f"expected {text(labels)} at position {exp.pos} but was at {pos}")
        if not almost_equal(exp.value, value):
            raise Mismatch(f"expected {exp.value} for {text(labels)} but got {value}")
        seen.add(labels)
    for exp in cmd.series:
        if exp.labels not in seen:
            raise Mismatch(f"expected metric {text(exp.labels)} {exp.value} not found")
    if cmd.scalar is not None:
        raise Mismatch(f"expected scalar {cmd.scalar}, got a vector of {len(got)}")


def at_step(value: object, k: int) -> float | list[tuple[Labels, float]]:
    """The answer at step ``k``, as Prometheus' test reads it from a query's result."""
    if isinstance(value, Scalar):
        return float(value.values[k])
    if isinstance(value, Windows):
        raise Mismatch("received range result on instant evaluation")
    if isinstance(value, String):
        raise Mismatch(f"received a string result {value.value!r}")
    assert isinstance(value, list), type(value)
    return [(r.labels, float(r.values[k])) for r in value if isinstance(r, Row) and r.present[k]]


class PinnedEvaluator(Evaluator):
    """Prometheus' test's rewrite: ``@ at`` on each selector and outermost subquery lacking one."""

    def __init__(self, source: Store, at_ms: int) -> None:
        super().__init__(source)
        self.at = pp.parse(f"x @ {at_ms / 1000:.3f}").at
        self.reached = 0  # selectors seen: the rewrite relies on the engine calling eval()

    def eval(self, node: pp.Expr, grid: Grid) -> object:
        self.reached += isinstance(node, pp.VectorSelector | pp.MatrixSelector)
        if isinstance(node, pp.VectorSelector) and node.at is None:
            node.at = self.at
        elif isinstance(node, pp.MatrixSelector) and node.vector_selector.at is None:
            vs = node.vector_selector
            vs.at = self.at
            node.vector_selector = vs
        elif isinstance(node, pp.SubqueryExpr):
            raise SkipVariant("at_subquery")
        return super().eval(node, grid)


def children(node: pp.Expr) -> list[pp.Expr]:
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return [node.expr]
    return []


def walk(node: pp.Expr, *, into_subqueries: bool = True):
    yield node
    if isinstance(node, pp.SubqueryExpr):
        if into_subqueries:
            yield from walk(node.expr)
        return
    for child in children(node):
        yield from walk(child, into_subqueries=into_subqueries)


def at_times(t: int) -> list[int]:
    """The evaluation times of Prometheus' ``@`` variants (Go's integer division)."""
    if t == 0:
        return [-1000, 0, 1000]
    return [-10 * t, 0, int(t / 5), t, 10 * t]


def evaluate(case: Case, store: Store, at_ms: int | None, grid: Grid) -> object:
    tree = parse(case.cmd.expr)  # a fresh tree: the @ rewrite changes nodes in place
    ev = Evaluator(store) if at_ms is None else PinnedEvaluator(store, at_ms)
    try:
        value = ev.eval(tree, grid)
    except BaseException as exc:  # a Rust panic is a BaseException
        if isinstance(exc, SkipVariant | Mismatch | QueryError):
            raise
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise Mismatch(f"engine crashed: {type(exc).__name__}: {exc}") from exc
    if isinstance(ev, PinnedEvaluator) and not ev.reached and any(selectors(tree)):
        raise Mismatch(
            "the @ rewrite reached no selector: the engine no longer evaluates "
            "selectors through Evaluator.eval, so this harness must change"
        )
    return value


def selectors(tree: pp.Expr) -> list[pp.Expr]:
    return [n for n in walk(tree) if isinstance(n, pp.VectorSelector | pp.MatrixSelector)]


def check_fails(case: Case, store: Store, at_ms: int | None, t: int) -> None:
    try:
        value = evaluate(case, store, at_ms, Grid(t, t, 1))
    except Unsupported as exc:
        raise Mismatch(f"eval_fail case refused as unsupported: {exc}") from exc
    except QueryError as exc:
        if str(exc).startswith("parse error"):
            raise Mismatch(f"eval_fail case failed to parse (Prometheus parses it): {exc}") from exc
        return
    raise Mismatch(f"expected an error, got {at_step(value, 0)}")


def check_one(case: Case, store: Store, at_ms: int | None, t: int) -> None:
    """One query as test.go runs it: instant at ``t``, then range ``t``±1m, step 1m."""
    if case.cmd.fail:
        check_fails(case, store, at_ms, t)
        return
    try:
        compare(case.cmd, at_step(evaluate(case, store, at_ms, Grid(t, t, 1)), 0))
    except QueryError as exc:
        raise Mismatch(f"instant query failed: {type(exc).__name__}: {exc}") from exc
    try:
        value = evaluate(case, store, at_ms, Grid(t - 60_000, t + 60_000, 60_000))
    except QueryError as exc:
        raise Mismatch(f"range query failed: {type(exc).__name__}: {exc}") from exc
    if not case.cmd.ordered:
        try:
            compare(case.cmd, at_step(value, 1))
        except Mismatch as exc:
            raise Mismatch(f"range mode: {exc}") from exc


@dataclass
class Outcome:
    """``skip``: the key in ``SKIPS`` of why the case as a whole did not run; ``partial``: the
    keys of why some ``@`` variants did not."""

    skip: str | None = None
    partial: set[str] = field(default_factory=set)


def runs_of(case: Case, tree: pp.Expr) -> list[tuple[int | None, int]]:
    """``(@ time or None, evaluation time)`` of every query test.go makes of the case."""
    t = case.cmd.at_ms
    unsafe = any(
        isinstance(n, pp.Call) and n.func.name in AT_UNSAFE
        for n in walk(tree, into_subqueries=False)
    )
    return [(None, t)] + ([] if unsafe else [(t, et) for et in at_times(t)])


def run_case(case: Case) -> Outcome:
    """Runs every query of the case; a ``Mismatch`` names the first that differs."""
    store = Store()
    for load in case.loads:
        store.load(load)
    try:
        tree = parse(case.cmd.expr)
    except QueryError as exc:
        raise Mismatch(f"{case.cmd.expr}: {exc} (Prometheus parses it)") from exc
    if any(isinstance(n, pp.SubqueryExpr) and n.at is not None for n in walk(tree)):
        return Outcome("at_subquery")
    outcome = Outcome()
    for at_ms, et in runs_of(case, tree):
        try:
            check_one(case, store, at_ms, et)
        except SkipVariant as exc:
            outcome.partial.add(str(exc))
        except Mismatch as exc:
            where = "" if at_ms is None else f" [with @ {at_ms / 1000:g} at {et / 1000:g}s]"
            raise Mismatch(f"{case.cmd.expr}{where}: {exc}") from exc
    return outcome


CASES = all_cases()


def _param(case: Case):
    marks = []
    if case.id in XFAIL:
        marks.append(pytest.mark.xfail(strict=True, raises=Mismatch, reason=XFAIL[case.id]))
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_prometheus_case(case: Case) -> None:
    outcome = run_case(case)
    if outcome.skip is not None:
        pytest.skip(SKIPS[outcome.skip])


def test_every_fixture_file_has_cases() -> None:
    files = {c.file for c in CASES}
    assert files == {p.stem for p in FIXTURES.glob("*.test")}
    assert len(CASES) > 500
    assert set(XFAIL) <= {c.id for c in CASES}, "an XFAIL id names no case"


def test_series_notation_expands_as_prometheus_does() -> None:
    _, values = parse_series('m{a="1"} 0+10x3 1 _ _x2 2x2 -1-0.5x1 Inf stale')
    assert values[:11] == [0, 10, 20, 30, 1, None, None, None, 2, 2, 2]
    assert values[11:13] == [-1, -1.5] and values[13] == math.inf and is_stale(values[14])
    labels, _ = parse_series("{__name__='m', b=`x`}")
    assert labels == (("__name__", "m"), ("b", "x"))


def test_a_wrong_expectation_fails() -> None:
    """The harness itself: a value off by more than 1e-6, a missing series, a wrong order."""
    text = 'load 1m\n  m{a="1"} 1 2\n  m{a="2"} 5 6\n\n'
    for expect in ('m{a="1"} 2.001\n  m{a="2"} 6', 'm{a="1"} 2', "7"):
        cmds = parse_file(text + f"eval instant at 1m m\n  {expect}\n")
        with pytest.raises(Mismatch):
            run_case(Case("inline", cmds[1], (cmds[0],)))
    ordered = 'eval_ordered instant at 1m sort_desc(m)\n  m{a="1"} 2\n  m{a="2"} 6\n'
    cmds = parse_file(text + ordered)
    with pytest.raises(Mismatch, match="position"):
        run_case(Case("inline", cmds[1], (cmds[0],)))
    cmds = parse_file(text + 'eval instant at 1m m\n  m{a="1"} 2.000000001\n  m{a="2"} 6\n')
    assert run_case(Case("inline", cmds[1], (cmds[0],))).skip is None
