"""Every PromQL expression of the bundled dashboards, with variables filled as Grafana would.

Grafana's own variables become what its Prometheus datasource computes for a 15-minute
range (``pkg/promlib/models/query.go``: step 15 s, ``$__rate_interval`` = max(step +
scrape, 4 x scrape) = 1m); a template variable becomes ``.*`` inside a regex matcher (the
"All" value) and a real label value elsewhere.  Template variables that are queries
(``label_values(...)``, ``query_result(...)``, ``metrics(...)``) are asked too, as the
label and query requests Grafana turns them into.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.promdiff.compare import Ask

RANGE_S = 900
STEP_S = 15
BUILTINS = {
    "__rate_interval_ms": "60000",
    "__rate_interval": "1m",
    "__interval_ms": "15000",
    "__interval": "15s",
    "__range_ms": "900000",
    "__range_s": "900",
    "__range": "900s",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


def metric_names(expr: str) -> set[str]:
    """Metric names the expression selects (``__name__="x"`` included); empty if unparsable."""
    import promql_parser as pp

    try:
        root = pp.parse(expr)
    except Exception:  # an invalid expression: compared as an error, named by nothing
        return set()
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, pp.VectorSelector):
            names.update([node.name] if node.name else [])
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")
            return
        for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
            if (child := getattr(node, attr, None)) is not None:
                visit(child)
        for child in getattr(node, "args", None) or []:
            visit(child)

    visit(root)
    return names


@dataclass(frozen=True)
class DashboardQuery:
    where: str  # file and panel title
    text: str  # the expression (or variable query) with variables filled
    instant: bool
    range: bool
    variable: bool = False


def variable_values(ask: Ask, start: float, end: float) -> dict[str, str]:
    """A real value per label (the first of its values), for ``$label`` outside regexes."""
    code, body = ask("GET", "/api/v1/labels", {"start": start, "end": end})
    assert code == 200, body
    values = {}
    for label in body["data"]:
        code, found = ask("GET", f"/api/v1/label/{label}/values", {"start": start, "end": end})
        if code == 200 and found["data"]:
            values[label] = sorted(found["data"])[0]
    return values


def fill(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in BUILTINS:
            return BUILTINS[name]
        before = expr[: match.start()]
        quote = before.rfind('"')
        in_regex = quote >= 2 and before[quote - 2 : quote] in ("=~", "!~")
        return ".*" if in_regex else values.get(name, ".*")

    return _VARIABLE.sub(one, expr)


def _walk(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        where = str(node.get("title") or where)
        if isinstance(node.get("expr"), str):
            yield where, node
        for value in node.values():
            yield from _walk(value, where)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, where)


def _variable_query(var: dict[str, Any]) -> str | None:
    query = var.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    if var.get("type") != "query" or not isinstance(query, str):
        return None
    if re.match(r"\s*(label_values|query_result|metrics)\(", query):
        return query
    return None


def queries(folder: Path, values: dict[str, str]) -> list[DashboardQuery]:
    out = []
    for path in sorted(folder.glob("*.json")):
        board = json.loads(path.read_text())
        for title, target in _walk(board.get("panels", []), "panel"):
            instant = bool(target.get("instant"))
            out.append(
                DashboardQuery(
                    f"{path.name}: {title}",
                    fill(target["expr"], values),
                    instant,
                    bool(target.get("range")) or not instant,
                )
            )
        for _, annotation in _walk(board.get("annotations", {}), "annotation"):
            out.append(
                DashboardQuery(
                    f"{path.name}: annotation", fill(annotation["expr"], values), False, True
                )
            )
        for var in board.get("templating", {}).get("list", []):
            if (query := _variable_query(var)) is not None:
                where = f"{path.name}: ${var.get('name')}"
                out.append(DashboardQuery(where, fill(query, values), False, False, True))
    return out


def requests(q: DashboardQuery, start: float, end: float) -> list[tuple[str, str, dict[str, Any]]]:
    """The requests Grafana sends for one query over the last 15 minutes of the data."""
    if q.variable:
        return [_variable_request(q.text, start, end)]
    out = []
    if q.instant:
        out.append(("POST", "/api/v1/query", {"query": q.text, "time": end}))
    if q.range:
        lo = math.floor((end - RANGE_S) / STEP_S) * STEP_S
        hi = math.floor(end / STEP_S) * STEP_S
        params = {"query": q.text, "start": lo, "end": hi, "step": STEP_S}
        out.append(("POST", "/api/v1/query_range", params))
    return out


def _variable_request(text: str, start: float, end: float) -> tuple[str, str, dict[str, Any]]:
    span = {"start": math.floor(start), "end": math.ceil(end)}
    if m := re.fullmatch(r"\s*label_values\((?:(.*),\s*)?(\w+)\s*\)\s*", text, re.S):
        params = dict(span) | ({"match[]": m.group(1).strip()} if m.group(1) else {})
        return "GET", f"/api/v1/label/{m.group(2)}/values", params
    if m := re.fullmatch(r"\s*query_result\((.*)\)\s*", text, re.S):
        return "POST", "/api/v1/query", {"query": m.group(1), "time": end}
    return "GET", "/api/v1/label/__name__/values", span
