"""Binary operators: arithmetic, comparisons (with ``bool``), ``and``/``or``/``unless``,
between scalars and vectors and between vectors with ``on``/``ignoring`` and
``group_left``/``group_right``, with Prometheus 2.42's matching rules and errors."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
import promql_parser as pp

from hbmwatch.promql.errors import BadQuery, QueryError
from hbmwatch.promql.values import NAME, Grid, Labels, Row, Scalar, label_text, merge_rows

if TYPE_CHECKING:
    from hbmwatch.promql.engine import Evaluator

ARITHMETIC = {"+", "-", "*", "/", "%", "^", "atan2"}
#: the operators whose result loses the metric name (Prometheus 2.42 keeps it for atan2)
DROPS_NAME = {"+", "-", "*", "/", "%", "^"}
COMPARISON = {"==", "!=", ">", "<", ">=", "<="}
SET = {"and", "or", "unless"}


def arithmetic(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return np.fmod(a, b)
        if op == "^":
            return np.power(a, b)
        if op == "atan2":
            return np.arctan2(a, b)
    raise BadQuery(f"operator {op!r} not allowed here")


def compare(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return {
        "==": np.equal,
        "!=": np.not_equal,
        ">": np.greater,
        "<": np.less,
        ">=": np.greater_equal,
        "<=": np.less_equal,
    }[op](a, b)


def evaluate(ev: Evaluator, node: pp.BinaryExpr, grid: Grid) -> list[Row] | Scalar:
    op = str(node.op)
    modifier = node.modifier
    return_bool = bool(modifier is not None and modifier.return_bool)
    left, right = ev.eval(node.lhs, grid), ev.eval(node.rhs, grid)
    if isinstance(left, Scalar) and isinstance(right, Scalar):
        if op in COMPARISON:
            return Scalar(compare(op, left.values, right.values).astype(float))
        return Scalar(arithmetic(op, left.values, right.values))
    if isinstance(left, list) and isinstance(right, Scalar):
        return _with_scalar(op, left, right.values, swap=False, return_bool=return_bool)
    if isinstance(left, Scalar) and isinstance(right, list):
        return _with_scalar(op, right, left.values, swap=True, return_bool=return_bool)
    if isinstance(left, list) and isinstance(right, list):
        on, names, card, include = _matching(modifier, op)
        if op in SET:
            return _set(op, left, right, on, names)
        return _vectors(op, left, right, on, names, card, include, return_bool, len(grid))
    raise BadQuery(f"binary expression must contain only scalar and instant vector types ({op})")


def _with_scalar(op: str, rows: list[Row], s: np.ndarray, *, swap: bool, return_bool: bool):
    out = []
    for r in rows:
        lv, rv = (s, r.values) if swap else (r.values, s)
        if op in COMPARISON:
            keep = compare(op, lv, rv)
            value = r.values
        else:
            keep, value = np.ones(len(s), dtype=bool), arithmetic(op, lv, rv)
        present = r.present.copy()
        if return_bool:
            value = keep.astype(float)
        else:
            present &= keep
        drop = op in DROPS_NAME or return_bool
        labels = tuple(p for p in r.labels if p[0] != NAME) if drop else r.labels
        out.append(Row(labels, value, present))
    return merge_rows(out)


def _matching(modifier: pp.BinModifier | None, op: str) -> tuple[bool, list[str], str, list[str]]:
    if modifier is None:
        return False, [], "OneToOne", []
    matching = modifier.matching
    on = matching is not None and str(matching.type).endswith("Include")
    names = sorted(matching.labels) if matching is not None else []
    card = "ManyToMany" if op in SET else str(modifier.card).rsplit(".", 1)[-1]
    return on, names, card, list(modifier.group_labels or [])


def signature(labels: Labels, on: bool, names: list[str]) -> Labels:
    if on:
        keep = set(names)
        return tuple(p for p in labels if p[0] in keep)
    drop = {NAME, *names}
    return tuple(p for p in labels if p[0] not in drop)


def _set(op: str, left: list[Row], right: list[Row], on: bool, names: list[str]) -> list[Row]:
    n = len(left[0].present) if left else (len(right[0].present) if right else 0)
    right_any: dict[Labels, np.ndarray] = defaultdict(lambda: np.zeros(n, dtype=bool))
    for r in right:
        right_any[signature(r.labels, on, names)] |= r.present
    if op == "and":
        out = [Row(r.labels, r.values, r.present & right_any[signature(r.labels, on, names)])
               for r in left]  # fmt: skip
        return merge_rows(out)
    if op == "unless":
        out = [Row(r.labels, r.values, r.present & ~right_any[signature(r.labels, on, names)])
               for r in left]  # fmt: skip
        return merge_rows(out)
    left_any: dict[Labels, np.ndarray] = defaultdict(lambda: np.zeros(n, dtype=bool))
    for r in left:
        left_any[signature(r.labels, on, names)] |= r.present
    kept = [Row(r.labels, r.values, r.present & ~left_any[signature(r.labels, on, names)])
            for r in right]  # fmt: skip
    return merge_rows([*left, *kept])


def result_labels(lhs: Labels, rhs: Labels, op: str, on: bool, names: list[str], card: str,
                  include: list[str]) -> Labels:  # fmt: skip
    out = dict(lhs)
    if op in DROPS_NAME:
        out.pop(NAME, None)
    if card == "OneToOne":
        if on:
            out = {k: v for k, v in out.items() if k in names}
        else:
            for name in names:
                out.pop(name, None)
    other = dict(rhs)
    for name in include:
        if other.get(name):
            out[name] = other[name]
        else:
            out.pop(name, None)
    return tuple(sorted(out.items()))


def _vectors(op, left, right, on, names, card, include, return_bool, n) -> list[Row]:
    left_any = np.zeros(n, dtype=bool)
    right_any = np.zeros(n, dtype=bool)
    for r in left:
        left_any |= r.present
    for r in right:
        right_any |= r.present
    active = left_any & right_any
    swapped = card == "OneToMany"
    if swapped:
        left, right = right, left
    by_sig: dict[Labels, list[Row]] = defaultdict(list)
    for r in right:
        by_sig[signature(r.labels, on, names)].append(r)
    for sig, members in by_sig.items():
        if len(members) > 1:
            count = np.sum([m.present for m in members], axis=0)
            if ((count > 1) & active).any():
                side = "left" if swapped else "right"
                raise QueryError(
                    f"found duplicate series for the match group {label_text(sig)} on the "
                    f"{side} hand-side of the operation; many-to-many matching not allowed: "
                    "matching labels must be unique on one side"
                )
    out: list[Row] = []
    per_sig: dict[Labels, list[Row]] = defaultdict(list)
    for ls in left:
        sig = signature(ls.labels, on, names)
        for rs in by_sig.get(sig, ()):
            both = ls.present & rs.present & active
            if not both.any():
                continue
            vl, vr = (rs.values, ls.values) if swapped else (ls.values, rs.values)
            if op in COMPARISON:
                keep, value = compare(op, vl, vr), vl
            else:
                keep, value = np.ones(n, dtype=bool), arithmetic(op, vl, vr)
            if return_bool:
                value, present = keep.astype(float), both
            else:
                present = both & keep
            labels = result_labels(ls.labels, rs.labels, op, on, names, card, include)
            if return_bool:
                labels = tuple(p for p in labels if p[0] != NAME)
            row = Row(labels, value, present)
            out.append(row)
            per_sig[sig].append(row)
    _check_matches(per_sig, card)
    return merge_rows(out)


def _check_matches(per_sig: dict[Labels, list[Row]], card: str) -> None:
    for rows in per_sig.values():
        if len(rows) < 2:
            continue
        if card == "OneToOne":
            if (np.sum([r.present for r in rows], axis=0) > 1).any():
                raise QueryError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    "(group_left/group_right)"
                )
            continue
        by_labels: dict[Labels, list[Row]] = defaultdict(list)
        for r in rows:
            by_labels[r.labels].append(r)
        for same in by_labels.values():
            if len(same) > 1 and (np.sum([r.present for r in same], axis=0) > 1).any():
                raise QueryError(
                    "multiple matches for labels: grouping labels must ensure unique matches"
                )
