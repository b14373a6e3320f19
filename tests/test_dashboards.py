"""The Grafana dashboards in dashboards/ and their provisioning.

Dashboards are JSON that nothing else in CI reads, so without these checks a renamed metric
or label would leave panels silently empty.  Each dashboard must validate against
Grafana's own schema (generated from @grafana/schema, scripts/gen-dashboard-schema.sh);
every Prometheus query may name only what a live ``GET /metrics`` of the app serves, with
labels it carries; every PostgreSQL query may name only canonical metrics, rate its
counters, and (with ``HBMWATCH_TEST_PG_URL``) must run and return rows on a migrated store
holding a little data.  Uids, titles, datasources and template variables must hang together.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.api.main import create_app
from hbmwatch.metrics import EXPORTED, METRICS, MetricDef
from hbmwatch.records import (
    Alert,
    AlertState,
    Device,
    Incident,
    IncidentState,
    Sample,
    SeriesKey,
    Severity,
)
from hbmwatch.runtime.service import build_collector
from hbmwatch.settings import CollectorSettings, Settings, StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.models import Base
from hbmwatch.store.store import Store, open_store
from tests.conftest import NOW, REPO, Clock, make_store

DASHBOARDS = REPO / "dashboards"
SCHEMA_FILE = DASHBOARDS / "schema" / "dashboard.schema.json"
DATASOURCES_FILE = DASHBOARDS / "provisioning" / "datasources" / "hbmwatch.yaml"
PROVIDERS_FILE = DASHBOARDS / "provisioning" / "dashboards" / "hbmwatch.yaml"
DASHBOARD_FILES = sorted((DASHBOARDS / "json").glob("*.json"))
EXPECTED_DASHBOARDS = {
    "fleet-overview.json",
    "gpu-drilldown.json",
    "fabric-health.json",
    "self-health.json",
}
#: Where the deployment mounts dashboards/*.json inside the Grafana container.
GRAFANA_DASHBOARD_PATH = "/var/lib/grafana/dashboards"
PROMTOOL = Path("/usr/bin/promtool")

#: Datasource plugin type -> the query language the test checks.
LANGUAGES = {
    "prometheus": "promql",
    "grafana-postgresql-datasource": "sql",
    "postgres": "sql",
}
#: Grafana's global variables and SQL macros (``$__name``); anything else must be defined.
GRAFANA_BUILTINS = frozenset(
    {
        "__interval",
        "__interval_ms",
        "__rate_interval",
        "__rate_interval_ms",
        "__range",
        "__range_s",
        "__range_ms",
        "__from",
        "__to",
        "__url_time_range",
        "__data",
        "__field",
        "__series",
        "__value",
        "__dashboard",
        "__org",
        "__user",
        "__all_variables",
        "__timezone",
        "__unixEpochFrom",
        "__unixEpochTo",
        "__unixEpochFilter",
        "__unixEpochGroup",
        "__unixEpochGroupAlias",
        "__timeFilter",
        "__timeFrom",
        "__timeTo",
        "__timeGroup",
        "__timeGroupAlias",
    }
)
#: Labels Prometheus attaches to every series it scrapes.
TARGET_LABELS = frozenset({"job", "instance"})

_VAR_REF = re.compile(
    r"\$\{([A-Za-z_]\w*)(?:[.:][^}]*)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)(?::\w+)?\]\]"
)


# -- loading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: a panel target, a template variable or an annotation."""

    dashboard: str
    where: str
    datasource: str
    language: str
    text: str
    kind: str  # "panel", "variable" or "annotation"
    format: str  # Grafana's result format: "time_series" or "table"

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.kind} {self.where!r}"


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def datasource_types() -> dict[str, str]:
    """Provisioned datasource uid -> plugin type."""
    return {d["uid"]: d["type"] for d in load_yaml(DATASOURCES_FILE)["datasources"]}


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row holds its own)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _uid(ref: Any) -> str:
    return ref.get("uid", "") if isinstance(ref, dict) else str(ref or "")


def queries(path: Path) -> list[Query]:
    """The queries of one dashboard file, with the datasource each one runs on."""
    dashboard = load_json(path)
    types = datasource_types()
    out: list[Query] = []

    def add(where: str, ds: str, target: Mapping[str, Any], kind: str) -> None:
        language = LANGUAGES.get(types.get(ds, ""), "unknown")
        text = target.get("expr") if language == "promql" else target.get("rawSql")
        out.append(
            Query(
                path.name,
                where,
                ds,
                language,
                str(text or ""),
                kind,
                str(target.get("format", "time_series")),
            )
        )

    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            ds = _uid(target.get("datasource")) or _uid(panel.get("datasource"))
            add(f"{panel.get('title')} [{target.get('refId')}]", ds, target, "panel")
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            text = query if isinstance(query, str) else (query or {}).get("query", "")
            ds = _uid(var.get("datasource"))
            language = LANGUAGES.get(types.get(ds, ""), "unknown")
            key = "expr" if language == "promql" else "rawSql"
            add(var["name"], ds, {key: text, "format": "table"}, "variable")
    for annotation in dashboard.get("annotations", {}).get("list", []):
        target = annotation.get("target") or {}
        ds = _uid(target.get("datasource")) or _uid(annotation.get("datasource"))
        add(annotation["name"], ds, target, "annotation")
    return out


def all_queries(language: str) -> list[Query]:
    return [q for path in DASHBOARD_FILES for q in queries(path) if q.language == language]


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def strings(node: Any) -> Iterator[str]:
    """Every string in a JSON document (queries, legends, links, titles)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def variable_refs(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _VAR_REF.finditer(text)}


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# -- files, schema, structure ---------------------------------------------------------------


def test_the_four_dashboards_are_there() -> None:
    assert {p.name for p in DASHBOARD_FILES} >= EXPECTED_DASHBOARDS


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    document = load_json(SCHEMA_FILE)
    jsonschema.Draft7Validator.check_schema(document)
    return document


def test_schema_says_where_it_came_from(schema: Mapping[str, Any]) -> None:
    """The pinned versions are recorded, so a regenerated schema shows up as a diff."""
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert re.search(r"@grafana/schema@\d+\.\d+\.\d+", schema["$comment"])
    assert re.search(r"ts-json-schema-generator@\d+\.\d+\.\d+", schema["$comment"])
    script = (REPO / "scripts" / "gen-dashboard-schema.sh").read_text()
    for package, version in re.findall(r"(@grafana/schema|ts-json-schema-generator)@([\d.]+)",
                                       schema["$comment"]):  # fmt: skip
        variable = "GRAFANA_SCHEMA_VERSION" if package == "@grafana/schema" else "GENERATOR"
        assert re.search(rf"{variable}\w*={re.escape(version)}\b", script), (package, version)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_dashboard_validates_against_grafana_schema(path: Path, schema: Mapping[str, Any]) -> None:
    dashboard = load_json(path)
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(dashboard), key=lambda e: list(e.path)
    )
    best = jsonschema.exceptions.best_match(errors)
    assert best is None, (
        f"{path.name} at /{'/'.join(map(str, best.absolute_path))}: {best.message[:500]}"
    )
    assert dashboard["schemaVersion"] >= 39


def test_schema_rejects_a_broken_dashboard(schema: Mapping[str, Any]) -> None:
    """The generated schema has teeth: it is not an any-object."""
    validator = jsonschema.Draft7Validator(schema)
    good = load_json(DASHBOARDS / "json" / "self-health.json")
    assert validator.is_valid(good)
    for breakage in (
        lambda d: d.pop("schemaVersion"),
        lambda d: d.update(titel="typo"),
        lambda d: d["panels"][1]["gridPos"].pop("h"),
        lambda d: d["panels"][1].update(type=7),
        lambda d: d["templating"].update(list=[{"name": "x", "type": "nonsense"}]),
    ):
        broken = json.loads(json.dumps(good))
        breakage(broken)
        assert not validator.is_valid(broken), breakage


def test_uids_and_titles_are_unique() -> None:
    documents = [load_json(p) for p in DASHBOARD_FILES]
    uids = [d.get("uid") for d in documents]
    titles = [d.get("title") for d in documents]
    assert all(uids) and all(titles)
    assert len(set(uids)) == len(uids), uids
    assert len(set(titles)) == len(titles), titles
    for uid in uids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid), uid  # Grafana's uid limits


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_panel_ids_are_unique(path: Path) -> None:
    ids = [p.get("id") for p in panels(load_json(path))]
    assert None not in ids and len(set(ids)) == len(ids)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_every_query_uses_a_provisioned_datasource(path: Path) -> None:
    types = datasource_types()
    dashboard = load_json(path)
    refs = [
        node["datasource"]
        for node in itertools.chain(
            panels(dashboard),
            (t for p in panels(dashboard) for t in p.get("targets", [])),
            variables(dashboard),
            dashboard.get("annotations", {}).get("list", []),
            (a.get("target") or {} for a in dashboard.get("annotations", {}).get("list", [])),
        )
        if node.get("datasource") is not None
    ]
    for ref in refs:
        assert isinstance(ref, dict), f"{path.name}: datasource by name, not uid: {ref!r}"
        assert ref.get("uid") in types, f"{path.name}: unknown datasource uid {ref}"
        assert ref.get("type") == types[ref["uid"]], f"{path.name}: {ref} is {types[ref['uid']]}"
    found = queries(path)
    assert found
    for query in found:
        assert query.language != "unknown", f"{query}: no provisioned datasource"
        assert query.text.strip(), f"{query}: empty query"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_template_variables_referenced_exist(path: Path) -> None:
    dashboard = load_json(path)
    defined = [v["name"] for v in variables(dashboard)]
    assert len(set(defined)) == len(defined)
    unknown = {
        ref
        for text in strings({k: v for k, v in dashboard.items() if k != "templating"})
        for ref in variable_refs(text)
        if ref not in defined and ref not in GRAFANA_BUILTINS
    }
    assert not unknown, f"{path.name} refers to undefined variables {sorted(unknown)}"
    # A chained variable may only use the variables above it (Grafana resolves in order).
    for i, var in enumerate(variables(dashboard)):
        refs = {r for r in variable_refs(json.dumps(var.get("query", ""))) if r not in
                GRAFANA_BUILTINS}  # fmt: skip
        assert refs <= set(defined[:i]), f"{path.name}: {var['name']} uses {refs}"


# -- provisioning -------------------------------------------------------------------------------

_ENV_REFERENCE = re.compile(r"\$\{?[A-Z_][A-Z0-9_]*\}?")


def test_datasource_provisioning() -> None:
    document = load_yaml(DATASOURCES_FILE)
    assert document["apiVersion"] == 1
    by_uid = {d["uid"]: d for d in document["datasources"]}
    assert len(by_uid) == len(document["datasources"])
    prom = by_uid["hbmwatch-prom"]
    assert (prom["type"], prom["url"]) == ("prometheus", "http://prometheus:9090")
    pg = by_uid["hbmwatch-pg"]
    assert LANGUAGES[pg["type"]] == "sql"
    assert (pg["url"], pg["user"], pg["jsonData"]["database"]) == (
        "postgres:5432",
        "hbmwatch",
        "hbmwatch",
    )
    assert pg["secureJsonData"]["password"] == "$HBMWATCH_PG_PASSWORD"


def test_datasource_file_holds_no_password() -> None:
    """Every secret is a reference to the Grafana process's environment, never a value."""
    for source in load_yaml(DATASOURCES_FILE)["datasources"]:
        assert "password" not in source and "basicAuthPassword" not in source, source["uid"]
        for key, value in (source.get("secureJsonData") or {}).items():
            assert _ENV_REFERENCE.fullmatch(str(value)), f"{source['uid']}.{key} is a literal"
    for line in DATASOURCES_FILE.read_text().splitlines():
        key, _, value = line.partition(":")
        if re.search(r"(password|secret|token)", key, re.I) and not key.strip().startswith("#"):
            assert _ENV_REFERENCE.fullmatch(value.strip()), line


def test_dashboard_provider() -> None:
    document = load_yaml(PROVIDERS_FILE)
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == GRAFANA_DASHBOARD_PATH


# -- PromQL -----------------------------------------------------------------------------------

PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan"}
)
_PROM_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_PROM_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_PROM_BRACES = re.compile(r"\{[^}]*\}")
_PROM_RANGE = re.compile(r"\[[^\]]*\]")
_PROM_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_PROM_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
_PROM_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[^\]]*\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def promql_of(query: Query) -> tuple[str, set[str]]:
    """The PromQL in a query, and labels a variable query reads (``label_values``)."""
    if query.kind == "variable":
        if m := _LABEL_VALUES.match(query.text):
            return m.group(1), {m.group(2)}
        if m := _QUERY_RESULT.match(query.text):
            return m.group(1), set()
    return query.text, set()


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once Grafana variables, strings,
    label matchers, ranges and grouping clauses are gone, less function calls and keywords."""
    stripped = _PROM_STRING.sub('""', expr)
    stripped = _GRAFANA_VAR.sub("0", stripped)
    stripped = _PROM_RANGE.sub(" ", stripped)
    stripped = _PROM_BRACES.sub(" ", _PROM_GROUPING.sub(" ", stripped))
    return {n for n in _PROM_IDENT.findall(stripped) if n.lower() not in PROMQL_KEYWORDS}


def grouping_labels(expr: str) -> set[str]:
    """Labels named in ``by``, ``without``, ``on``, ``ignoring`` and ``group_*`` clauses."""
    return {
        label.strip()
        for clause in _PROM_GROUPING.findall(_PROM_STRING.sub('""', expr))
        for label in clause.split(",")
        if label.strip()
    }


def _alternatives(value: str) -> list[str] | None:
    """The values of a plain alternation (``a|b``); None for a real regular expression."""
    parts = value.split("|")
    return parts if all(re.fullmatch(r"[\w.]+", p) for p in parts) else None


@dataclass(frozen=True)
class Served:
    """What a live /metrics serves: sample names -> label names (None = not knowable)."""

    labels: dict[str, frozenset[str] | None]
    values: dict[str, dict[str, tuple[str, ...]]]


def promql_problems(expr: str, served: Served, extra_labels: Iterable[str] = ()) -> list[str]:
    """Unknown metrics, labels a metric does not carry, values outside its enumerations."""
    problems = []
    names = metric_names(expr)
    for name in sorted(names - served.labels.keys()):
        problems.append(f"metric {name} is not served by /metrics")
    known = [served.labels[n] for n in names if served.labels.get(n) is not None]
    for label in sorted(grouping_labels(expr) | set(extra_labels)):
        if label in TARGET_LABELS:
            continue
        if any(label not in labels for labels in known if labels is not None):
            problems.append(f"label {label} is not on every metric of the expression")
    plain_vars = re.sub(r"\$\{(\w+)[^}]*\}", r"$\1", expr)  # ${x:fmt} -> $x: no braces
    for name, body in _PROM_SELECTOR.findall(plain_vars):
        labels = served.labels.get(name) if name else None
        for label, op, value in _PROM_MATCHER.findall(body):
            if labels is not None and label not in labels | TARGET_LABELS | {"__name__"}:
                problems.append(f"{name} has no label {label}")
            allowed = served.values.get(name, {}).get(label)
            candidates = [value] if op in ("=", "!=") else _alternatives(value)
            if allowed and candidates and "$" not in value:
                problems += [
                    f'{name}{{{label}="{v}"}}: not one of {allowed}'
                    for v in candidates
                    if v not in allowed
                ]
    return problems


def _model(name: str) -> MetricDef | None:
    """The metric model's definition of an exported or canonical name."""
    return EXPORTED.get(name) or METRICS.get(name)


def parse_exposition(text: str) -> Served:
    """The series names an exposition serves, with the labels each one carries.

    Those are its sample names plus, for a family with no samples yet (a labelled metric no
    one has set), the names its type gives it: a counter ``x`` is queried as ``x_total``, a
    histogram as ``x_bucket``/``x_sum``/``x_count``; the bare family name of either is no
    series, so a query on it is reported.  Labels are those seen on samples and those the
    metric model declares; None where neither tells.
    """
    series_names = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count", "_created"),
    }
    labels: dict[str, frozenset[str] | None] = {}
    values: dict[str, dict[str, tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = series_names.get(family.type, ("",))
        names = {s.name for s in family.samples} | {family.name + x for x in suffixes}
        model = next((m for n in (family.name, *names) if (m := _model(n))), None)
        declared = set(model.allowed_labels) if model else set()
        # Labels every sample of the family has (le and quantile sit on some names only).
        common = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
        for name in names:
            own = {k for s in family.samples if s.name == name for k in s.labels}
            known = own | common | declared
            if name.endswith("_bucket"):
                known.add("le")
            labels[name] = frozenset(known) if family.samples or model else None
            if model:
                values[name] = dict(model.label_values)
    return Served(labels, values)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """What the app's GET /metrics serves, wired as ``hbmwatch up`` wires it (one registry
    for the store, the collector and the app), after a request and a rejected sample."""
    folder = tmp_path_factory.mktemp("metrics")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{folder / 'hbmwatch.db'}"),
        collector=CollectorSettings(spool_dir=str(folder / "spool")),
    )
    engine = create_store_engine(settings.store.url)
    upgrade(engine)
    engine.dispose()
    registry = CollectorRegistry()
    store = open_store(settings.store, clock=Clock(), registry=registry)
    try:
        build_collector(settings, store, [], registry)
        key = SeriesKey("gpu_power_watts", {"host": "n0", "gpu": "0"})
        store.write([Sample(key, int(NOW * 1000), 300.0), Sample(key, int(NOW * 1000), math.nan)])
        with TestClient(create_app(settings, store, registry=registry)) as client:
            assert client.get("/healthz").status_code == 200
            response = client.get("/metrics")
        assert response.status_code == 200, (
            f"GET /metrics answered {response.status_code}: the dashboards' Prometheus "
            "queries cannot be checked against what hbmwatch serves"
        )
        return parse_exposition(response.text)
    finally:
        store.close()


PROM_QUERIES = all_queries("promql")


@pytest.mark.parametrize("query", PROM_QUERIES, ids=[str(q) for q in PROM_QUERIES])
def test_prometheus_query_names_only_served_metrics(query: Query, served: Served) -> None:
    expr, extra = promql_of(query)
    assert metric_names(expr), f"{query}: names no metric: {expr}"
    assert not promql_problems(expr, served, extra), (
        f"{query}: {promql_problems(expr, served, extra)} in {expr}"
    )


def test_promql_checker_catches_mistakes(served: Served) -> None:
    """The checks above can fail: misspelled metrics, labels and values are reported."""
    assert served.labels  # something was parsed
    good = 'min by (rack) (hbmwatch_gpu_thermal_margin_celsius{sensor="memory"})'
    assert promql_problems(good, served) == []
    for bad in (
        'min by (rack) (hbmwatch_gpu_thermal_margin_celsius_typo{sensor="memory"})',
        'min by (rak) (hbmwatch_gpu_thermal_margin_celsius{sensor="memory"})',
        'min by (rack) (hbmwatch_gpu_thermal_margin_celsius{sensr="memory"})',
        'min by (rack) (hbmwatch_gpu_thermal_margin_celsius{sensor="mem"})',
        "sum(rate(hbmwatch_store_samples_written[5m]))",  # a counter without _total
    ):
        assert promql_problems(bad, served), bad
    assert metric_names("sum by (le) (rate(x_bucket[$__rate_interval])) / on() group_left "
                        'y{a="b"} > bool 0') == {"x_bucket", "y"}  # fmt: skip


def _promtool_expr(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced by values promtool accepts."""
    durations = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
    for var, value in durations.items():
        expr = expr.replace(var, value)
    return _GRAFANA_VAR.sub("x", expr)


def test_prometheus_queries_parse(tmp_path: Path) -> None:
    """promtool parses every expression, Grafana's variables filled in."""
    if not PROMTOOL.exists():
        message = f"promtool not available at {PROMTOOL}"
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _promtool_expr(promql_of(q)[0])}
        for i, q in enumerate(PROM_QUERIES)
    ]
    (tmp_path / "rules.yml").write_text(
        json.dumps({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", "rules.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- SQL ----------------------------------------------------------------------------------------

_SQL_METRIC_CMP = re.compile(r"\bmetric\s*(?:=|<>|!=)\s*'([^']*)'", re.I)
_SQL_METRIC_IN = re.compile(r"\bmetric\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", re.I)
_SQL_METRIC_CASE = re.compile(r"\bCASE\s+(?:\w+\.)?metric\b(.*?)\bEND\b", re.I | re.S)
_SQL_LITERAL = re.compile(r"'([^']*)'")
_SQL_LABEL = re.compile(r"\blabels\s*->>\s*'([^']*)'")
_SQL_LABEL_EQ = re.compile(r"\blabels\s*->>\s*'([^']*)'\)?\s*=\s*'([^'$]*)'")
_SQL_TABLE = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.I)
_SQL_CTE = re.compile(r"\b([A-Za-z_]\w*)\s+AS\s*\(", re.I)
_SQL_COMMENT = re.compile(r"--[^\n]*")
SAMPLE_TABLES = frozenset({"series", "samples_chunk", "samples_head", "rollup_1h"})


def sql_metrics(sql: str) -> set[str]:
    """Metric names a query compares ``metric`` with (=, <>, IN, CASE ... WHEN)."""
    found = set(_SQL_METRIC_CMP.findall(sql))
    for group in _SQL_METRIC_IN.findall(sql):
        found |= set(_SQL_LITERAL.findall(group))
    for body in _SQL_METRIC_CASE.findall(sql):
        found |= set(re.findall(r"\bWHEN\s+'([^']*)'", body, re.I))
    return found


def sql_problems(sql: str) -> list[str]:
    """Tables that do not exist, metrics outside the model, labels they do not carry,
    label values outside their enumerations, counters read without a rate."""
    sql = _SQL_COMMENT.sub("", sql)
    problems = []
    tables = set(_SQL_TABLE.findall(sql)) - set(_SQL_CTE.findall(sql))
    problems += [f"no table {t}" for t in sorted(tables - set(Base.metadata.tables))]
    if not tables & SAMPLE_TABLES:
        return problems
    names = sql_metrics(sql)
    if not names:
        problems.append("reads samples but names no metric")
    problems += [f"{n} is not a canonical metric" for n in sorted(names - METRICS.keys())]
    defs = [METRICS[n] for n in names if n in METRICS]
    for label in sorted(set(_SQL_LABEL.findall(sql))):
        if defs and not any(label in m.allowed_labels for m in defs):
            problems.append(f"no metric of {sorted(names)} has label {label}")
    for label, value in _SQL_LABEL_EQ.findall(sql):
        allowed = {v for m in defs for v in m.label_values.get(label, ())}
        if allowed and value not in allowed:
            problems.append(f"{label}='{value}' is not one of {sorted(allowed)}")
    if any(m.is_counter for m in defs) and not re.search(r"\blag\s*\(", sql, re.I):
        problems.append("reads a counter without a rate (lag over consecutive minutes)")
    return problems


SQL_QUERIES = all_queries("sql")


@pytest.mark.parametrize("query", SQL_QUERIES, ids=[str(q) for q in SQL_QUERIES])
def test_sql_query_names_only_canonical_metrics(query: Query) -> None:
    assert not sql_problems(query.text), f"{query}: {sql_problems(query.text)}"


def test_sql_checker_catches_mistakes() -> None:
    """The checks above can fail."""
    good = (
        "SELECT 1 FROM samples_chunk c JOIN series s ON s.id = c.series_id "
        "WHERE s.metric = 'gpu_memory_temperature_celsius' AND s.labels->>'host' = 'n0'"
    )
    assert sql_problems(good) == []
    for bad in (
        good.replace("gpu_memory_temperature_celsius", "gpu_memory_temperature"),
        good.replace("'host'", "'hots'"),
        good.replace("samples_chunk", "samples_chunks"),
        good.replace("s.metric = 'gpu_memory_temperature_celsius'", "true"),
        good.replace("gpu_memory_temperature_celsius", "gpu_throttle_seconds_total"),
        good.replace("AND s.labels->>'host' = 'n0'", "AND s.labels->>'phase' = 'ttft'")
        .replace("gpu_memory_temperature_celsius", "workload_latency_seconds")
        .replace("'ttft'", "'ttf'"),
    ):
        assert sql_problems(bad), bad


# -- SQL on a real PostgreSQL -------------------------------------------------------------------

TO_MS = int(NOW * 1000)
FROM_MS = TO_MS - 3_600_000
#: Sample values of the dashboards' template variables.
VARIABLE_VALUES = {"cluster": "c0", "host": "n0", "gpu": "0"}
LABEL_DEFAULTS = {
    "cluster": ("c0",),
    "rack": ("r0",),
    "host": ("n0",),
    "gpu": ("0", "1"),
    "sku": ("MI300X",),
    "vendor": ("amd",),
    "stack": ("0", "1"),
    "link": ("0", "1", "all"),
    "service": ("chat",),
    "model": ("llama",),
    "target": ("dme-n0",),
}


def sample_series() -> list[SeriesKey]:
    """A few series of every canonical metric: each enumerated label value, two GPUs."""
    keys = []
    for m in METRICS.values():
        names = [n for n in m.allowed_labels if n in LABEL_DEFAULTS or n in m.label_values]
        choices = [m.label_values.get(n) or LABEL_DEFAULTS[n] for n in names]
        keys += [SeriesKey(m.name, dict(zip(names, c, strict=True)))
                 for c in itertools.product(*choices)]  # fmt: skip
    return keys


def sample_data(store: Store) -> None:
    """35 minutes of samples, compacted into chunks; devices, an incident and alerts."""
    keys = sample_series()
    start = TO_MS - 40 * 60_000
    samples = []
    for i, t in enumerate(range(start, TO_MS - 5 * 60_000, 15_000)):
        for key in keys:
            m = METRICS[key.metric]
            if m.is_counter:
                value = float(10 * (i if i < 80 else i - 80))  # restarts once
            elif m.unit == "boolean":
                value = float(i // 20 % 2)
            else:
                value = 40.0 + i % 7
            samples.append(Sample(key, t, value))
    result = store.write(samples)
    assert result.accepted == len(samples), result
    assert store.compact().chunks
    store.upsert_devices(
        Device(host="n0", gpu=g, cluster="c0", rack="r0", sku="MI300X", vendor="amd")
        for g in ("0", "1")
    )
    opened = TO_MS - 20 * 60_000
    alert = Alert(
        id="a1",
        fingerprint="f1",
        labels={"alertname": "HBMThermalExcursion", **VARIABLE_VALUES, "rack": "r0"},
        annotations={"summary": "HBM on n0 GPU 0 past its limit"},
        state=AlertState.FIRING,
        severity=Severity.CRITICAL,
        finding_id="finding-1",
        started_ms=opened - 60_000,
        updated_ms=opened,
        firing_ms=opened,
        incident_id="i1",
    )
    incidents = [
        Incident(
            id="i1",
            title="rack r0 (c0): HBM on n0 GPU 0 past its limit",
            scope={"cluster": "c0", "rack": "r0"},
            state=IncidentState.OPEN,
            severity=Severity.CRITICAL,
            opened_ms=opened,
            updated_ms=opened,
            alerts=("a1",),
        ),
        Incident(
            id="i2",
            title="host n0 (c0): PCIe replays",
            scope={"cluster": "c0", "host": "n0"},
            state=IncidentState.ACKNOWLEDGED,
            severity=Severity.WARNING,
            opened_ms=opened + 60_000,
            updated_ms=opened + 60_000,
        ),
    ]
    store.alerts.save(alerts=[alert], incidents=incidents)


def substitute(query: Query, multi: Mapping[str, bool]) -> str:
    """The SQL Grafana would send: macros and template variables replaced."""
    text = query.text
    text = text.replace("$__unixEpochFrom()", str(FROM_MS // 1000))
    text = text.replace("$__unixEpochTo()", str(TO_MS // 1000))
    text = text.replace("$__interval_ms", "120000")

    def var(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in VARIABLE_VALUES:
            raise AssertionError(f"{query}: the test has no value for ${name}")
        value = VARIABLE_VALUES[name]
        return f"'{value}'" if multi.get(name) else value

    text = _VAR_REF.sub(var, text)
    assert "$" not in text, f"{query}: unsubstituted {text[text.index('$') :][:40]}"
    return text


@pytest.mark.postgres
def test_sql_queries_run_on_postgresql(pg_schema_url: str, clock: Clock) -> None:
    """Every SQL query runs on a migrated store with data and returns rows, time-ordered
    where Grafana wants a time series; annotations return time and text."""
    clock.now = NOW
    store = make_store(pg_schema_url, clock)
    failures = []
    try:
        sample_data(store)
        with store.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            for path in DASHBOARD_FILES:
                multi = {
                    v["name"]: bool(v.get("multi") or v.get("includeAll"))
                    for v in variables(load_json(path))
                }
                for query in (q for q in queries(path) if q.language == "sql"):
                    sql = substitute(query, multi)
                    cursor = dbapi.cursor()
                    try:
                        cursor.execute(sql)
                        columns = [d.name for d in cursor.description or ()]
                        rows = cursor.fetchall()
                    except Exception as exc:  # the database's error is the finding
                        dbapi.rollback()
                        failures.append(f"{query}: {type(exc).__name__}: {exc}")
                        continue
                    failures += [f"{query}: {p}" for p in result_problems(query, columns, rows)]
            dbapi.rollback()
    finally:
        store.close()
    assert not failures, "\n".join(failures)


def result_problems(query: Query, columns: list[str], rows: list[tuple[Any, ...]]) -> list[str]:
    """What Grafana would make of a result: empty, unordered, or missing its columns."""
    if not rows:
        return ["returned no rows from data that covers every metric"]
    if query.kind == "annotation":
        return [f"annotation lacks column {c}" for c in ("time", "text") if c not in columns]
    if query.format == "time_series":
        if "time" not in columns:
            return [f"time series without a time column: {columns}"]
        times = [r[columns.index("time")] for r in rows]
        if times != sorted(times):
            return ["time series not ordered by time"]
    return []
