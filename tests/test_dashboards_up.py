"""The dashboards on a running ``hbmwatch up`` (SQLite, the default simulated scenario).

What a new user sees: the real service in a subprocess, its simulated fleet scraped into
the embedded SQLite store, and Grafana's queries sent to its /prometheus.  A query must
return data wherever the fleet has the series it reads: a selector the fleet does not fill
(the default scenario has no PCIe byte counters, link widths or negotiated fabric
bandwidth, and per-stack temperatures on some GPUs only) excuses the query, a side of an
``or`` excuses only itself, and a filter (a comparison, ``and``) may be empty when what it
filters is not.  Virtual series are excused while /prometheus does not serve them.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import promql_parser as pp
import pytest

from tests.dashboard_data import answer
from tests.dashboard_queries import VIRTUAL, Query, selectors, substitute
from tests.test_dashboards_data import STORE_QUERIES
from tests.test_service import HBMWATCH, clean_env, free_port

START_DEADLINE_S = 180.0  # a loaded 2-core machine: generous
DATA_DEADLINE_S = 90.0  # after the start: within pytest's 300 s per test, set-up included
_FILTERS = {"==", "!=", ">", "<", ">=", "<=", "and", "unless"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """``hbmwatch up`` on its defaults (SQLite in the working directory), until its
    /prometheus answers a counter's rate for the simulated fleet."""
    folder = tmp_path_factory.mktemp("up")
    port = free_port()
    log = (folder / "up.log").open("w")
    env = clean_env(HBMWATCH_API__PORT=str(port), HBMWATCH_SIMULATOR__BASE_PORT="0")
    proc = subprocess.Popen([*HBMWATCH, "up"], cwd=folder, text=True, stdout=log,
                            stderr=subprocess.STDOUT, env=env)  # fmt: skip
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}/prometheus/", timeout=60)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _has_data(client, "sum(rate(gpu_energy_joules_total[1m]))"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no rates from hbmwatch up: {(folder / 'up.log').read_text()[-3000:]}")
            time.sleep(1)
        yield client
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        log.close()


def _has_data(client: httpx.Client, expr: str) -> bool:
    try:
        body = client.post("api/v1/query", data={"query": expr, "time": time.time()}).json()
    except (httpx.HTTPError, ValueError):
        return False
    return body.get("status") == "success" and bool(body["data"]["result"])


@pytest.fixture(scope="module")
def values(up: httpx.Client) -> dict[str, str]:
    """The dashboards' variables: a GPU with per-stack temperatures and a workload."""
    for expr in (
        "count by (cluster, rack, host, gpu) (gpu_hbm_stack_temperature_celsius) and on "
        "(cluster, rack, host, gpu) count by (cluster, rack, host, gpu) (workload_requests_total)",
        "count by (cluster, rack, host, gpu) (workload_requests_total)",
    ):
        body = up.post("api/v1/query", data={"query": expr, "time": time.time()}).json()
        if result := body["data"]["result"]:
            labels = min((r["metric"] for r in result), key=lambda m: sorted(m.items()))
            place = {k: labels.get(k, "") for k in ("cluster", "rack", "host", "gpu")}
            return {**place, "namespace": ".*", "pod": ".*"}  # the workload filters on "All"
    pytest.fail("the simulated fleet has no workloads")


def expected(node: Any, client: httpx.Client) -> bool:
    """Whether the fleet has what ``node`` reads: every selector it needs selects series."""
    if isinstance(node, pp.VectorSelector):
        return _has_data(client, f"count({node})")
    if isinstance(node, pp.MatrixSelector):
        return expected(node.vector_selector, client)
    if isinstance(node, pp.BinaryExpr):
        sides = (expected(node.lhs, client), expected(node.rhs, client))
        return any(sides) if str(node.op) == "or" else all(sides)
    children = {pp.ParenExpr: "expr", pp.UnaryExpr: "expr", pp.SubqueryExpr: "expr",
                pp.AggregateExpr: "expr"}  # fmt: skip
    if type(node) in children:
        return expected(node.expr, client)
    if isinstance(node, pp.Call):
        return all(expected(a, client) for a in node.args if not _literal(a))
    return True


def _literal(node: Any) -> bool:
    return isinstance(node, pp.NumberLiteral | pp.StringLiteral)


def _filtered(node: Any) -> Any | None:
    """What a filtering expression filters (its left side), else None."""
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    filtering = isinstance(node, pp.BinaryExpr) and str(node.op) in _FILTERS
    if filtering and (node.modifier is None or not node.modifier.return_bool):
        return node.lhs
    return None


@pytest.mark.parametrize("query", STORE_QUERIES, ids=[str(q) for q in STORE_QUERIES])
def test_query_returns_data_on_hbmwatch_up(
    query: Query, up: httpx.Client, values: dict[str, str]
) -> None:
    known = set(up.get("api/v1/label/__name__/values").json()["data"])
    tree = pp.parse(substitute(query.expr, values))
    if names := {s.name for s in selectors(tree)} & VIRTUAL.keys() - known:
        pytest.skip(
            f"no alerting state yet for {sorted(names)} (the default scenario's "
            "fault may not have paged); tests/test_dashboards_data.py covers them"
        )
    if not expected(tree, up):
        pytest.skip("the default simulated fleet has no series for this query")
    deadline = time.monotonic() + DATA_DEADLINE_S  # rate windows fill as the service runs
    while not (result := answer(up, query, time.time(), **values)):
        inner = _filtered(tree)
        if inner is not None and _has_data(up, str(inner)):
            return  # nothing to show is the right answer: the filter keeps nothing now
        if time.monotonic() > deadline:
            pytest.fail(f"{query}: no data on hbmwatch up for {substitute(query.expr, values)}")
        time.sleep(2)
    assert result
