"""The Grafana dashboards' queries, read and taken apart for the dashboard tests.

Every query of every dashboard is PromQL on one ``${datasource}`` variable.  This module
finds them (panel targets, template variables, annotations), fills in Grafana's variables
so that ``promql_parser`` can parse them, and walks the syntax tree for the metric names,
label matchers and grouping labels a check needs.  ``VIRTUAL`` names the series the
dashboards read that are not canonical metrics: hbmwatch's alert, incident and finding
state as series (dashboards/README.md "Series the dashboards read").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser as pp

from hbmwatch.metrics import (
    EXPORTED,
    FINDING_KINDS,
    INCIDENT_STATES,
    METRICS,
    SEVERITIES,
    MetricDef,
    MetricType,
    Scope,
)
from tests.conftest import REPO

DASHBOARDS = REPO / "dashboards"
DASHBOARD_FILES = sorted((DASHBOARDS / "json").glob("*.json"))
#: The one datasource reference every panel, target, variable and annotation carries.
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}

_ALERT_LABELS = ("alertname", "alertstate", "severity", "kind", "scope", "muted", "incident")
_ENTITY = ("cluster", "rack", "host", "gpu", "sku", "partition", "service", "model", "phase",
           "target", "reason", "link", "check")  # fmt: skip


def _virtual(name: str, help: str, labels: tuple[str, ...], **values: tuple[str, ...]) -> MetricDef:
    return MetricDef(name, MetricType.GAUGE, "", help, Scope.EXPORT, labels, dict(values))


#: Series the dashboards read beyond the canonical metrics.  hbmwatch's /prometheus API
#: builds them from its alert, incident and finding tables at each evaluation time; a
#: Prometheus holds them when it scrapes /metrics (hbmwatch_findings_open is EXPORTED as is).
VIRTUAL: dict[str, MetricDef] = {
    m.name: m
    for m in (
        _virtual(
            "ALERTS",
            "1 per hbmwatch alert while pending or firing, with the alert's labels, as "
            "Prometheus names rule alerts; muted = silenced or inhibited.",
            _ALERT_LABELS + _ENTITY,
            alertstate=("pending", "firing"),
            severity=SEVERITIES,
            kind=FINDING_KINDS,
            muted=("true", "false"),
        ),
        _virtual(
            "hbmwatch_incident_open",
            "1 per incident from its opening until it is resolved, with its scope.",
            (
                "incident_id",
                "title",
                "severity",
                "state",
                "kind",
                "cluster",
                "rack",
                "host",
                "service",
            ),
            severity=SEVERITIES,
            state=INCIDENT_STATES,
            kind=FINDING_KINDS,
        ),
        EXPORTED["hbmwatch_findings_open"],
    )
}
#: Grafana's variables that stand for durations, and the values the tests give them.
DURATIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "30m"}
#: Values of the dashboards' own variables in the tests' data.
VARIABLE_VALUES = {"cluster": "c0", "host": "n0", "gpu": "0", "rack": "r0", "namespace": "ml",
                   "pod": "chat-n0"}  # fmt: skip
_VAR_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: a panel target, a template variable or an annotation."""

    dashboard: str
    where: str
    text: str
    kind: str  # "panel", "variable" or "annotation"
    instant: bool  # an instant query (stat, table) rather than a range query
    datasource: Any

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.kind} {self.where!r}"

    @property
    def expr(self) -> str:
        """The PromQL: a ``label_values(selector, label)`` variable's selector."""
        if self.kind == "variable" and (m := _LABEL_VALUES.match(self.text)):
            return m.group(1)
        return self.text

    @property
    def label(self) -> str | None:
        """The label a ``label_values`` variable lists."""
        m = _LABEL_VALUES.match(self.text) if self.kind == "variable" else None
        return m.group(2) if m else None


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row holds its own)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def annotations(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's own annotation queries (Grafana's built-in one left out)."""
    return [a for a in dashboard.get("annotations", {}).get("list", []) if not a.get("builtIn")]


def queries(path: Path) -> list[Query]:
    """The queries of one dashboard file."""
    dashboard = load_json(path)
    out: list[Query] = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            where = f"{panel.get('title')} [{target.get('refId')}]"
            instant = bool(target.get("instant")) and not target.get("range")
            ds = target.get("datasource", panel.get("datasource"))
            out.append(Query(path.name, where, target.get("expr", ""), "panel", instant, ds))
    for var in variables(dashboard):
        if var.get("type") == "query":
            query = var.get("query")
            text = query if isinstance(query, str) else (query or {}).get("query", "")
            out.append(Query(path.name, var["name"], text, "variable", True, var["datasource"]))
    for annotation in annotations(dashboard):
        target = annotation.get("target") or {}
        ds = target.get("datasource", annotation.get("datasource"))
        out.append(Query(path.name, annotation["name"], target.get("expr", ""), "annotation",
                         False, ds))  # fmt: skip
    return out


def all_queries() -> list[Query]:
    return [q for path in DASHBOARD_FILES for q in queries(path)]


def substitute(expr: str, values: Mapping[str, str] = VARIABLE_VALUES) -> str:
    """The expression Grafana sends: durations and the dashboard's variables filled in."""
    for var, value in DURATIONS.items():
        expr = expr.replace(var, value)

    def fill(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no test value for ${name} in {expr}")
        return values[name]

    return _VAR_REF.sub(fill, expr)


def parse(expr: str) -> Any:
    return pp.parse(substitute(expr))


# -- walking the syntax tree --------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A vector selector, with whether it sits in a range that a counter function reads."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)
    rated: bool


def _children(node: Any) -> list[Any]:
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return [node.expr]
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    return []


_MATCH_OPS = {
    "MatchOp.Equal": "=",
    "MatchOp.NotEqual": "!=",
    "MatchOp.Re": "=~",
    "MatchOp.NotRe": "!~",
}
#: Functions that read a counter correctly (across resets).
COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})


def selectors(node: Any, rated: bool = False) -> Iterator[Selector]:
    """Every vector selector under ``node``."""
    if isinstance(node, pp.VectorSelector):
        matchers = tuple(
            (m.name, _MATCH_OPS[str(m.op)], m.value)
            for m in node.matchers.matchers
            if m.name != "__name__"
        )
        yield Selector(node.name or "", matchers, rated)
        return
    if isinstance(node, pp.Call):
        rated = node.func.name in COUNTER_FUNCTIONS
    for child in _children(node):
        yield from selectors(child, rated)


def groupings(node: Any) -> Iterator[tuple[Any, tuple[str, ...]]]:
    """(node, labels) for every by/without, on/ignoring and group_left/right clause."""
    if isinstance(node, pp.AggregateExpr) and node.modifier is not None:
        yield node, tuple(node.modifier.labels)
    if isinstance(node, pp.BinaryExpr) and node.modifier is not None:
        mod = node.modifier
        labels = tuple(mod.matching.labels) if mod.matching is not None else ()
        yield node, labels + tuple(mod.group_labels or ())
    for child in _children(node):
        yield from groupings(child)


def metric_def(name: str) -> MetricDef | None:
    return METRICS.get(name) or VIRTUAL.get(name)


#: Series names and their labels (None: not knowable) beyond the canonical and virtual ones.
Served = Mapping[str, "frozenset[str] | None"]


def declared_labels(name: str, served: Served) -> frozenset[str] | None:
    if m := metric_def(name):
        return m.allowed_labels
    return served.get(name)


def problems(
    expr: str, extra_labels: tuple[str, ...] = (), served: Served | None = None
) -> list[str]:
    """Unknown metrics, labels a metric does not declare, values outside its enumerations,
    counters read without rate/increase.  ``served``: hbmwatch's own /metrics series, which
    only the self-health dashboard may read."""
    served = served or {}
    tree = parse(expr)
    found = []
    sels = list(selectors(tree))
    if not sels:
        return ["names no metric"]
    for s in sels:
        m = metric_def(s.name)
        if m is None and s.name in served:
            m = EXPORTED.get(s.name) or MetricDef(s.name, MetricType.GAUGE, "", "", Scope.EXPORT)
        if m is None:
            found.append(
                f"{s.name or '{...}'} is neither canonical nor a documented virtual series"
            )
            continue
        labels = declared_labels(s.name, served)
        if labels is None:
            continue
        for label, op, value in s.matchers:
            if label not in labels:
                found.append(f"{s.name} has no label {label}")
            allowed = m.label_values.get(label)
            options = [value] if op in ("=", "!=") else _alternatives(value)
            if allowed and options:
                found += [f'{s.name}{{{label}="{v}"}}: not one of {allowed}'
                          for v in options if v and v not in allowed]  # fmt: skip
        if m.is_counter and not s.rated:
            found.append(f"counter {s.name} read without rate/increase")
    for node, labels in groupings(tree):
        under = {s.name for s in selectors(node)}
        for label in labels:
            missing = sorted(
                n for n in under if label not in (declared_labels(n, served) or {label})
            )
            if missing:
                found.append(f"grouping label {label} is not declared by {missing}")
    for label in extra_labels:
        found += [f"{s.name} has no label {label}" for s in sels
                  if label not in (declared_labels(s.name, served) or {label})]  # fmt: skip
    return found


def _alternatives(value: str) -> list[str] | None:
    """The values of a plain alternation (``a|b``); None for a real regular expression."""
    parts = value.split("|")
    return parts if all(re.fullmatch(r"[\w.]*", p) for p in parts) else None
