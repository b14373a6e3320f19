"""The Grafana dashboards in dashboards/ and their provisioning.

Dashboards are JSON that nothing else in CI reads, so without these checks a renamed metric
or label would leave panels silently empty.  Each dashboard must validate against
Grafana's own schema (generated from @grafana/schema, scripts/gen-dashboard-schema.sh);
every panel, variable and annotation must query the one ``${datasource}`` Prometheus
variable; every expression must parse (``promql_parser``) and name only canonical metrics
or the documented virtual series (``tests.dashboard_queries.VIRTUAL``), with labels they
declare, counters through rate/increase.  Whether the queries return data is
tests/test_dashboards_data.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.api.main import create_app
from hbmwatch.metrics import EXPORTED, METRICS
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.runtime.service import build_collector
from hbmwatch.settings import CollectorSettings, Settings, StoreSettings
from hbmwatch.skus import SKUS
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import open_store
from tests.conftest import NOW, REPO, Clock
from tests.dashboard_queries import (
    DASHBOARD_FILES,
    DASHBOARDS,
    DATASOURCE_REF,
    VIRTUAL,
    Query,
    all_queries,
    annotations,
    load_json,
    panels,
    parse,
    problems,
    queries,
    selectors,
    variables,
)

SCHEMA_FILE = DASHBOARDS / "schema" / "dashboard.schema.json"
DATASOURCES_FILE = DASHBOARDS / "provisioning" / "datasources" / "hbmwatch.yaml"
PROVIDERS_FILE = DASHBOARDS / "provisioning" / "dashboards" / "hbmwatch.yaml"
EXPECTED_DASHBOARDS = {
    "fleet-overview.json",
    "gpu-drilldown.json",
    "fabric-health.json",
    "self-health.json",
}
#: The dashboard that may also read hbmwatch's own /metrics (process health, not stored).
SELF_HEALTH = "self-health.json"
#: Where the deployment mounts dashboards/*.json inside the Grafana container.
GRAFANA_DASHBOARD_PATH = "/var/lib/grafana/dashboards"
#: Grafana's global variables (``$__name``); anything else must be defined.
GRAFANA_BUILTINS = frozenset(
    {"__interval", "__interval_ms", "__rate_interval", "__rate_interval_ms", "__range",
     "__range_s", "__range_ms", "__from", "__to", "__url_time_range", "__data", "__field",
     "__series", "__value", "__dashboard", "__org", "__user", "__all_variables", "__timezone"}
)  # fmt: skip
_VAR_REF = re.compile(
    r"\$\{([A-Za-z_]\w*)(?:[.:][^}]*)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)(?::\w+)?\]\]"
)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def strings(node: Any) -> list[str]:
    """Every string in a JSON document (queries, legends, links, titles)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return []


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
    good = load_json(DASHBOARDS / "json" / "gpu-drilldown.json")
    assert validator.is_valid(good)
    for breakage in (
        lambda d: d.pop("schemaVersion"),
        lambda d: d.update(titel="typo"),
        lambda d: d["panels"][1]["gridPos"].pop("h"),
        lambda d: d["panels"][1].update(type=7),
        lambda d: d["templating"].update(list=[{"name": "x", "type": "nonsense"}]),
        lambda d: d["annotations"]["list"][1].update(titelFormat="typo"),
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
        refs = variable_refs(json.dumps(var.get("query", ""))) - GRAFANA_BUILTINS
        refs |= variable_refs(json.dumps(var.get("datasource", "")))
        assert refs <= set(defined[:i]), f"{path.name}: {var['name']} uses {refs}"


# -- one datasource, chosen by a variable ---------------------------------------------------


def datasource_types() -> dict[str, str]:
    """Provisioned datasource uid -> plugin type."""
    return {d["uid"]: d["type"] for d in load_yaml(DATASOURCES_FILE)["datasources"]}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_everything_queries_the_datasource_variable(path: Path) -> None:
    """Panels, targets, variables and annotations all name ``${datasource}``, a
    datasource variable over Prometheus-type datasources: one JSON for hbmwatch's
    /prometheus (SQLite or PostgreSQL store) and for a Prometheus or VictoriaMetrics."""
    dashboard = load_json(path)
    first, *rest = variables(dashboard)
    assert (first["type"], first["name"], first["query"]) == ("datasource", "datasource",
                                                             "prometheus")  # fmt: skip
    assert datasource_types().get(first["current"]["value"]) == "prometheus", first["current"]
    assert not [v for v in rest if v["type"] == "datasource"]
    refs = [("panel", p.get("datasource")) for p in panels(dashboard) if p["type"] != "row"]
    refs += [("target", t.get("datasource")) for p in panels(dashboard)
             for t in p.get("targets", [])]  # fmt: skip
    refs += [("variable", v.get("datasource")) for v in rest if v["type"] == "query"]
    for a in annotations(dashboard):
        refs += [("annotation", a.get("datasource")), ("annotation", a["target"]["datasource"])]
    wrong = [(kind, ref) for kind, ref in refs if ref != DATASOURCE_REF]
    assert not wrong, f"{path.name}: not on ${{datasource}}: {wrong[:5]}"
    text = path.read_text()
    assert "rawSql" not in text and "hbmwatch-pg" not in text and "hbmwatch-prom" not in text
    found = queries(path)
    assert found and all(q.text.strip() for q in found), path.name


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=_ids(DASHBOARD_FILES))
def test_variables_list_label_values(path: Path) -> None:
    """Query variables are ``label_values(selector, label)`` of a canonical metric, and
    a multi-value one matches everything with ``.*`` (an empty label too).  The query is
    the ``query`` string Grafana's Prometheus variable support runs; no editor ``qryType``,
    which without its ``label``/``metric`` fields Grafana turns into label_values(undefined)."""
    for var in variables(load_json(path)):
        if var["type"] != "query":
            continue
        assert isinstance(var["query"], str) or set(var["query"]) == {"query", "refId"}, var
        (query,) = [q for q in queries(path) if q.kind == "variable" and q.where == var["name"]]
        assert query.label, f"{query}: not label_values(...): {query.text}"
        assert {s.name for s in selectors(parse(query.expr))} <= METRICS.keys(), query
        if var.get("includeAll"):
            assert var.get("allValue") == ".*", var["name"]


def test_incidents_link_to_their_page() -> None:
    """The open-incident tables link each row to hbmwatch's /incidents/{id} page, and the
    fleet and GPU dashboards annotate incidents and alerts."""
    for name in ("fleet-overview.json", "gpu-drilldown.json"):
        dashboard = load_json(DASHBOARDS / "json" / name)
        tables = [p for p in panels(dashboard)
                  if any("hbmwatch_incident_open" in t["expr"] for t in p.get("targets", []))
                  and p["type"] == "table"]  # fmt: skip
        assert tables, name
        for table in tables:
            urls = [link["url"] for o in table["fieldConfig"]["overrides"]
                    for prop in o["properties"] if prop["id"] == "links"
                    for link in prop["value"]]  # fmt: skip
            assert "${hbmwatch_url}/incidents/${__data.fields.incident_id}" in urls, name
        exprs = " ".join(a["target"]["expr"] for a in annotations(dashboard))
        assert "hbmwatch_incident_open" in exprs and "ALERTS" in exprs, name
        for a in annotations(dashboard):
            assert a["titleFormat"] and a["textFormat"] and a["tagKeys"], a["name"]


# -- provisioning -------------------------------------------------------------------------------

_ENV_REFERENCE = re.compile(r"(?:Bearer )?\$\{?[A-Z_][A-Z0-9_]*\}?")


def test_datasource_provisioning() -> None:
    """hbmwatch's /prometheus, read over POST with the read token from the environment;
    a Prometheus beside it for hbmwatch's own health; nothing else (no PostgreSQL)."""
    document = load_yaml(DATASOURCES_FILE)
    assert document["apiVersion"] == 1
    by_uid = {d["uid"]: d for d in document["datasources"]}
    assert len(by_uid) == len(document["datasources"])
    assert set(datasource_types().values()) == {"prometheus"}
    hbm = by_uid["hbmwatch"]
    assert (hbm["url"], hbm["access"], hbm["isDefault"]) == (
        "http://hbmwatch:8427/prometheus", "proxy", True)  # fmt: skip
    assert hbm["jsonData"]["httpMethod"] == "POST"
    assert hbm["jsonData"]["httpHeaderName1"] == "Authorization"
    assert hbm["secureJsonData"] == {"httpHeaderValue1": "Bearer $HBMWATCH_READ_TOKEN"}
    assert by_uid["prometheus"]["url"] == "http://prometheus:9090"
    assert {d["name"] for d in document["deleteDatasources"]} == {"hbmwatch PostgreSQL"}
    assert load_json(DASHBOARDS / "json" / SELF_HEALTH)["templating"]["list"][0]["current"][
        "value"] == "prometheus"  # fmt: skip


def test_datasource_file_holds_no_secret() -> None:
    """Every secret is a reference to the Grafana process's environment, never a value."""
    for source in load_yaml(DATASOURCES_FILE)["datasources"]:
        assert "password" not in source and "basicAuthPassword" not in source, source["uid"]
        for key, value in (source.get("secureJsonData") or {}).items():
            assert _ENV_REFERENCE.fullmatch(str(value)), f"{source['uid']}.{key} is a literal"
    for line in DATASOURCES_FILE.read_text().splitlines():
        key, _, value = line.partition(":")
        if re.search(r"(password|secret|token|headervalue)", key, re.I) and not key.strip(
        ).startswith("#"):  # fmt: skip
            assert _ENV_REFERENCE.fullmatch(value.strip()), line


def test_dashboard_provider() -> None:
    document = load_yaml(PROVIDERS_FILE)
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == GRAFANA_DASHBOARD_PATH


# -- PromQL -----------------------------------------------------------------------------------

QUERIES = all_queries()


def exposition_labels(text: str) -> dict[str, frozenset[str] | None]:
    """Series names an exposition serves -> labels (a family with no samples yet: its
    model's labels, or None; a counter is queried as ``x_total``, a histogram as
    ``x_bucket``/``x_sum``/``x_count``)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    out: dict[str, frozenset[str] | None] = {}
    for family in text_string_to_metric_families(text):
        names = {s.name for s in family.samples}
        names |= {family.name + x for x in suffixes.get(family.type, ("",))}
        model = next((m for n in names if (m := EXPORTED.get(n) or METRICS.get(n))), None)
        common = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
        for name in names:
            known = common | (set(model.allowed_labels) if model else set())
            known |= {"le"} if name.endswith("_bucket") else set()
            out[name] = frozenset(known) if family.samples or model else None
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[str] | None]:
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
        assert response.status_code == 200, response.text
        return exposition_labels(response.text)
    finally:
        store.close()


@pytest.mark.parametrize("query", QUERIES, ids=[str(q) for q in QUERIES])
def test_query_parses_and_names_what_exists(
    query: Query, served: dict[str, frozenset[str] | None]
) -> None:
    """Parses (Grafana's variables filled in); canonical metrics or virtual series only,
    with labels they declare and values in their enumerations; counters rated.  Only the
    self-health dashboard may also read hbmwatch's own /metrics (process health)."""
    extra = (query.label,) if query.label else ()
    own = served if query.dashboard == SELF_HEALTH else {}
    assert not problems(query.expr, extra, own), f"{query}: {problems(query.expr, extra, own)}"


def test_only_self_health_reads_process_metrics() -> None:
    """The other dashboards work on every store and on a Prometheus with the canonical
    series; self-health's process panels need a Prometheus that scrapes /metrics."""
    for query in QUERIES:
        names = {s.name for s in selectors(parse(query.expr))}
        if query.dashboard != SELF_HEALTH:
            assert names <= METRICS.keys() | VIRTUAL.keys(), f"{query}: {names}"


def test_checker_catches_mistakes() -> None:
    """The checks above can fail: misspelled metrics, labels and values, unrated counters,
    grouping by a label a metric lacks."""
    good = 'max by (service, phase) (workload_latency_seconds{quantile="0.99", host="$host"})'
    assert problems(good) == []
    for bad in (
        good.replace("workload_latency_seconds", "workload_latency"),
        good.replace('host="$host"', 'hots="$host"'),
        good.replace('"0.99"', '"0.999"'),
        good.replace("by (service, phase)", "by (service, stack)"),
        "sum(gpu_throttle_seconds_total)",
        "sum(hbmwatch_store_series)",  # process health: self-health only
        'count(ALERTS{alertstate="active"})',
        "count by (title) (hbmwatch_findings_open)",
    ):
        assert problems(bad), bad
    assert problems("sum(hbmwatch_store_series)", served={"hbmwatch_store_series": None}) == []
    with pytest.raises(Exception, match="parenthesis"):
        parse("sum by (a (x)")


def _margin_terms(node: Any) -> list[tuple[float, str, tuple[str, ...]]]:
    """(limit, metric, SKUs) of every ``limit - temperature{sku=~"..."}`` in a tree."""
    import promql_parser as pp

    out = []
    if isinstance(node, pp.ParenExpr):
        return _margin_terms(node.expr)
    if isinstance(node, pp.BinaryExpr):
        lhs, rhs = node.lhs, node.rhs
        if str(node.op) == "-" and isinstance(lhs, pp.NumberLiteral) and isinstance(
                rhs, pp.VectorSelector):  # fmt: skip
            skus = [m.value for m in rhs.matchers.matchers if m.name == "sku"]
            out.append((lhs.val, rhs.name, tuple(skus[0].split("|")) if skus else ()))
            return out
        return _margin_terms(lhs) + _margin_terms(rhs)
    if isinstance(node, pp.AggregateExpr | pp.Call):
        children = [node.expr] if isinstance(node, pp.AggregateExpr) else list(node.args)
        return [t for c in children for t in _margin_terms(c)]
    return out


def test_thermal_margins_use_the_sku_limits() -> None:
    """A margin is limit - temperature per SKU, with hbmwatch.skus' slowdown limits, and
    covers every SKU: a new SKU or a changed limit fails here until the panels follow."""
    limit_of = {"gpu_memory_temperature_celsius": "memory_slowdown_c",
                "gpu_hotspot_temperature_celsius": "hotspot_slowdown_c"}  # fmt: skip
    seen = 0
    for query in QUERIES:
        terms = _margin_terms(parse(query.expr))
        by_metric: dict[str, set[str]] = {}
        for limit, metric, skus in terms:
            assert metric in limit_of, f"{query}: {limit} - {metric}"
            for sku in skus:
                assert getattr(SKUS[sku], limit_of[metric]) == limit, f"{query}: {sku} {limit}"
            by_metric.setdefault(metric, set()).update(skus)
        for metric, skus in by_metric.items():
            assert skus == SKUS.keys(), f"{query}: {metric} misses {SKUS.keys() - skus}"
            seen += 1
    assert seen >= 6
