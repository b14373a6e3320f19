"""hbmwatch's PromQL API against a real Prometheus 2.42 over the same samples (issue 15).

Dataset 1 (``tests/promdiff/dataset.py``: counters with resets, gaps either side of the
5-minute lookback, stale and late series, label sets that differ) goes into hbmwatch's
store on SQLite and PostgreSQL, part compacted into minute chunks and hour rollups, part
left in the head, and into Prometheus through ``promtool``.  A hypothesis corpus of PromQL
(``tests/promdiff/corpus.py``) is asked of both as instant queries at several times and as
range queries, aligned and not.  Dataset 2 is the default scenario's own store: every
expression of every dashboard runs over it.  ``tests/fixtures/grafana/prometheus_exchange.json``
replays the requests Grafana's Prometheus datasource sends.  ``tests/promdiff/compare.py``
says what counts as the same answer.

Needs ``promtool`` and ``prometheus`` (skips without them, fails under
``HBMWATCH_REQUIRE_SERVICES=1``).  ``HBMWATCH_PROMDIFF_REPORT=FILE`` writes every outcome
as JSON lines, ``HBMWATCH_PROMDIFF_SELF=1`` asks Prometheus on both sides (a harness check).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hbmwatch.api.main import create_app
from hbmwatch.bench.realprom import (
    PrometheusUnavailable,
    RealPrometheus,
    dump_store,
    samples_by_series,
)
from hbmwatch.metrics import METRICS
from hbmwatch.settings import StoreSettings
from hbmwatch.store.store import Store, open_store
from tests.conftest import NOW, REPO, Clock
from tests.promdiff import dashboards, dataset, edges
from tests.promdiff.compare import Outcome, compare
from tests.promdiff.corpus import Grammar
from tests.promdiff.engines import (
    Engines,
    backend_store,
    prometheus_over,
    self_check,
    settings_for,
)

pytestmark = pytest.mark.timeout(900)
EXAMPLES = 300
SCENARIO_MINUTES = 2.0
M = 60.0
#: Instants of dataset 1 to evaluate at: edges, unaligned, head, past the end (stale).
INSTANTS = (NOW - 2 * 3600 + 30, NOW - 95 * M + 7.25, NOW - 60 * M, NOW - 20 * M + 0.125,
            NOW - 0.001, NOW, NOW + 200, NOW + 400)  # fmt: skip
#: (start, end, step) of range queries: aligned to step, then not.
RANGES = (
    (NOW - 2 * 3600, NOW, 60.0),
    (NOW - 40 * M, NOW - 10 * M, 15.0),
    (NOW - 3 * 3600, NOW + 3600, 3600.0),
    (NOW - 2 * 3600, NOW + 10 * M, 300.0),
    (NOW - 97 * M + 13.7, NOW - 31 * M + 2.2, 37.0),
    (NOW - 50 * M + 0.5, NOW + 7 * M, 45.5),
    (NOW - 8 * 3600, NOW + 3600, 600.0),
)
#: Spans this long read the minute tier unless told (docs/promql.md: a deliberate
#: difference); the corpus asks for raw samples there, so they must agree exactly.
RAW_BEYOND_S = 6 * 3600


def test_prometheus_holds_exactly_the_samples(
    prom_synthetic: Any, synthetic: dataset.Dataset
) -> None:
    """The harness itself: promtool kept every timestamp to the millisecond, every value."""
    for s in samples_by_series(synthetic.samples)[::7]:
        selector = s.key.metric + "{" + ",".join(f'{k}="{v}"' for k, v in s.key.labels) + "}"
        params = {"query": f"{selector}[3h]", "time": NOW}
        body = httpx.get(f"{prom_synthetic.url}/api/v1/query", params=params).json()
        points = body["data"]["result"][0]["values"]
        assert [round(float(t) * 1000) for t, _ in points] == s.timestamps_ms.tolist()
        assert [float(v) for _, v in points] == s.values.tolist()


def test_a_missing_prometheus_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrometheusUnavailable) as caught:
        RealPrometheus.over([], tmp_path)
    assert str(caught.value).startswith("promtool and prometheus not found on PATH")
    assert "\n" not in str(caught.value)


def test_the_comparison_tells_answers_apart() -> None:
    """The judge itself, without servers: what passes and what does not."""

    def vector(*points: tuple[dict[str, str], float, str]) -> tuple[int, Any]:
        result = [{"metric": m, "value": [t, v]} for m, t, v in points]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    a = {"__name__": "x", "host": "h0"}
    assert compare(vector((a, 1.5, "1")), vector((a, 1.5, "1.0000000000001"))).ok
    assert compare(vector((a, 1.5, "NaN")), vector((a, 1.5, "NaN"))).ok
    assert not compare(vector((a, 1.5, "1")), vector((a, 1.5, "1.00001"))).ok
    assert not compare(vector((a, 1.5, "+Inf")), vector((a, 1.5, "-Inf"))).ok
    assert not compare(vector((a, 1.5, "1")), vector((a, 1.501, "1"))).ok
    assert not compare(vector((a, 1.5, "1")), vector(({"host": "h0"}, 1.5, "1"))).ok
    assert not compare(vector(), vector((a, 1.5, "1"))).ok
    error = (400, {"status": "error", "errorType": "bad_data", "error": "x"})
    assert compare(error, error).kind == "both_error"
    assert compare((422, error[1]), vector()).kind == "unsupported"
    assert not compare((422, error[1]), error).ok
    assert not compare(vector(), error).ok


def _app_client(store: Store) -> TestClient:
    client = TestClient(create_app(settings_for(store), store))
    if not self_check() and client.get("/prometheus/api/v1/status/buildinfo").status_code == 404:
        pytest.skip("this hbmwatch has no /prometheus API yet")
    return client


@pytest.fixture(scope="session")
def synthetic() -> dataset.Dataset:
    return dataset.synthetic(NOW)


@pytest.fixture(scope="session")
def prom_synthetic(
    synthetic: dataset.Dataset, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    series = samples_by_series(synthetic.samples)
    with prometheus_over(series, tmp_path_factory.mktemp("prom1")) as prom:
        yield prom


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def engines(
    request: pytest.FixtureRequest,
    synthetic: dataset.Dataset,
    prom_synthetic: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Engines]:
    """Dataset 1 in a store of each backend, beside Prometheus over the same samples."""
    with backend_store(request.param, tmp_path_factory.mktemp("store1"), Clock(NOW)) as store:
        dataset.load(store, synthetic, NOW)
        dumped = {s.key: s for s in dump_store(store)}
        expected = {s.key: s for s in samples_by_series(synthetic.samples)}
        assert dumped.keys() == expected.keys()
        assert all((dumped[k].timestamps_ms == expected[k].timestamps_ms).all() for k in expected)
        with _app_client(store) as client:
            both = Engines(client, prom_synthetic)
            yield both
            both.close()


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engines, float, float]]:
    """Dataset 2: the default scenario's store (SQLite), and Prometheus over its dump."""
    folder = tmp_path_factory.mktemp("scenario")
    copy, start, end = dataset.default_scenario(SCENARIO_MINUTES, folder)
    store = open_store(StoreSettings(url=f"sqlite:///{copy}"), clock=Clock(end))
    try:
        # The run's last minutes are still in the head (compaction waits 90 s): move all but
        # the newest minute into chunks, so the dashboards read both.
        assert store.compact(int((end + 60) * 1000)).samples > 0
        with (
            prometheus_over(list(dump_store(store)), folder / "prom") as prom,
            _app_client(store) as client,
        ):
            both = Engines(client, prom)
            yield both, start, end
            both.close()
    finally:
        store.close()


def _record(
    outcomes: list[dict[str, Any]], query: str, mode: str, outcome: Outcome, theirs: Any = None
) -> None:
    """One outcome; with Prometheus' answer, also how many series (or items) it held."""
    row = {"query": query, "mode": mode, "kind": outcome.kind, "why": outcome.why}
    if theirs is not None:
        data = theirs[1].get("data") if theirs[0] == 200 and isinstance(theirs[1], dict) else None
        items = data.get("result", data) if isinstance(data, dict) else data
        row["prom_items"] = len(items) if isinstance(items, list | dict) else 1
    outcomes.append(row)


def _report(name: str, outcomes: list[dict[str, Any]], allowed: tuple[str, ...] = ()) -> None:
    """Write the outcomes (HBMWATCH_PROMDIFF_REPORT), then fail listing every difference
    whose kind is not ``same``, ``both_error`` or one of ``allowed``."""
    if path := os.environ.get("HBMWATCH_PROMDIFF_REPORT"):
        with Path(path).open("a") as out:
            for o in outcomes:
                out.write(json.dumps({"test": name, **o}) + "\n")
    bad = [o for o in outcomes if o["kind"] not in ("same", "both_error", *allowed)]
    if bad:
        kinds = {k: sum(o["kind"] == k for o in bad) for k in sorted({o["kind"] for o in bad})}
        lines = [f"{o['kind']}: {o['query']} [{o['mode']}]: {o['why']}" for o in bad[:40]]
        pytest.fail(
            f"{len(bad)} of {len(outcomes)} answers differ from Prometheus {kinds}:\n"
            + "\n".join(lines),
            pytrace=False,
        )


def _ordered(query: str) -> bool:
    return query.lstrip().startswith(("sort(", "sort_desc("))


def test_generated_queries_answer_as_prometheus_does(
    engines: Engines, synthetic: dataset.Dataset, request: pytest.FixtureRequest
) -> None:
    outcomes: list[dict[str, Any]] = []
    grammar = Grammar(synthetic)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        query=grammar.query(),
        instants=st.lists(st.sampled_from(INSTANTS), min_size=2, max_size=2, unique=True),
        span=st.sampled_from(RANGES),
        method=st.sampled_from(("GET", "POST")),
    )
    def check(query: str, instants: list[float], span: tuple[float, ...], method: str) -> None:
        for t in instants:
            mine, theirs = engines.ask(method, "/api/v1/query", {"query": query, "time": t})
            outcome = compare(mine, theirs, ordered=_ordered(query))
            _record(outcomes, query, f"instant@{t}", outcome, theirs)
        start, end, step = span
        params = {"query": query, "start": start, "end": end, "step": step}
        if end - start > RAW_BEYOND_S:
            params["resolution"] = "raw"
        mine, theirs = engines.ask(method, "/api/v1/query_range", params)
        _record(outcomes, query, f"range {start}..{end}/{step}", compare(mine, theirs), theirs)
        outcomes[-1]["prom_ok"] = theirs[0] == 200

    check()
    ranged = [o for o in outcomes if "prom_ok" in o]
    assert len(ranged) >= EXAMPLES
    # The corpus must mostly be valid queries that find data, or it tests little.
    assert sum(o["prom_ok"] for o in ranged) >= 0.6 * len(ranged)
    assert sum(o["prom_items"] > 0 for o in ranged) >= 0.4 * len(ranged)
    _report(request.node.name, outcomes)


def test_api_edges_answer_as_prometheus_does(
    engines: Engines, request: pytest.FixtureRequest
) -> None:
    outcomes: list[dict[str, Any]] = []
    for method, path, params in edges.requests():
        mine, theirs = engines.ask(method, path, params)
        outcome = compare(mine, theirs)
        if outcome.kind == "mismatch" and "start" in params and not path.startswith("/api/v1/q"):
            outcome = _whole_hours(engines, method, path, params, mine, theirs) or outcome
        _record(outcomes, f"{path} {params}", method, outcome, theirs)
    _report(request.node.name, outcomes, allowed=("whole_hours",))


def _whole_hours(
    engines: Engines, method: str, path: str, params: dict[str, Any], mine: Any, theirs: Any
) -> Outcome | None:
    """docs/promql.md's deliberate difference: series, labels and label values over a range
    count whole hours (an hourly rollup in the range lists its series).  Allowed when
    hbmwatch lists all Prometheus lists and nothing Prometheus would not list over the
    range widened to whole hours."""
    wide = dict(params)
    wide["start"] = math.floor(float(params["start"]) / 3600) * 3600
    wide["end"] = math.ceil(float(params["end"]) / 3600) * 3600
    _, widest = engines.ask(method, path, wide)

    def items(answer: Any) -> set[Any]:
        return {x if isinstance(x, str) else frozenset(x.items()) for x in answer[1]["data"]}

    if mine[0] == 200 and items(theirs) <= items(mine) <= items(widest):
        return Outcome("whole_hours", f"{len(items(mine))} vs {len(items(theirs))} listed")
    return None


def test_every_dashboard_query_answers_as_prometheus_does(
    scenario: tuple[Engines, float, float], request: pytest.FixtureRequest
) -> None:
    both, start, end = scenario
    outcomes: list[dict[str, Any]] = []
    values = dashboards.variable_values(both.prometheus, start, end)
    queries = dashboards.queries(REPO / "dashboards" / "json", values)
    assert queries, "no PromQL in dashboards/json"
    for q in queries:
        # Virtual series (ALERTS, incidents, findings) and /metrics' own are not in the
        # store, so the Prometheus beside it cannot have them: reported, not judged.
        unstored = sorted(dashboards.metric_names(q.text) - set(METRICS)) if not q.variable else []
        for method, path, params in dashboards.requests(q, start, end):
            mine, theirs = both.ask(method, path, params)
            outcome = compare(mine, theirs)
            if unstored and not outcome.ok:
                outcome = Outcome("not_stored", f"{', '.join(unstored)}: {outcome.why}")
            _record(outcomes, q.text, f"{q.where} {path}", outcome, theirs)
            outcomes[-1]["stored"] = not unstored
    # The variables must have found real values, or every panel compares empty with empty.
    stored = [o for o in outcomes if o["stored"]]
    assert sum(o["prom_items"] > 0 for o in stored) >= 0.5 * len(stored)
    _report(request.node.name, outcomes, allowed=("not_stored",))


def test_grafana_requests_get_the_answers_prometheus_gives(
    engines: Engines, request: pytest.FixtureRequest
) -> None:
    exchange = json.loads(
        (REPO / "tests" / "fixtures" / "grafana" / "prometheus_exchange.json").read_text()
    )
    outcomes: list[dict[str, Any]] = []
    for recorded in exchange["requests"]:
        mine, theirs = engines.raw(recorded)
        shape_only = recorded.get("compare") == "shape"
        outcome = _shape(mine) if shape_only else compare(mine, theirs)
        where = recorded["method"] + " " + recorded["path"]
        _record(outcomes, recorded["name"], where, outcome, theirs)
    _report(request.node.name, outcomes)


def _shape(mine: tuple[int, Any]) -> Outcome:
    """Server-specific answers (build info, metadata): a success with a data object, and
    no build ``features`` (Grafana's heuristics.go then treats the server as Prometheus)."""
    code, body = mine
    data = body.get("data") if isinstance(body, dict) else None
    ok = code == 200 and body.get("status") == "success" and isinstance(data, dict)
    if ok and not data.get("features"):
        return Outcome("same")
    return Outcome("mismatch", f"{code} {str(body)[:200]}")
