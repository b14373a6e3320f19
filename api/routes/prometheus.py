"""A Prometheus-compatible read API under ``/prometheus``: Grafana's Prometheus datasource,
``promtool``-style clients and anything else that speaks Prometheus' HTTP API read the store
with PromQL here (``http://host:8427/prometheus``).

Parameters come from the query string or a form body (Grafana POSTs forms), answers and
errors have Prometheus' shapes (docs/promql.md lists the deliberate differences).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from hbmwatch import metrics
from hbmwatch.api import promjson
from hbmwatch.api.deps import ScopeRead
from hbmwatch.matchers import Matcher
from hbmwatch.promql import resolution, virtual
from hbmwatch.promql.engine import Evaluator, parse
from hbmwatch.promql.engine import matchers_of as selector_matchers
from hbmwatch.promql.errors import BadQuery, QueryError
from hbmwatch.promql.source import StoreSource, labels_of_key
from hbmwatch.promql.values import Grid, Labels, Scalar, Windows
from hbmwatch.promql.virtual import WithVirtual
from hbmwatch.query import time_budget
from hbmwatch.store.store import SchemaOutdated, StoreUnavailable
from hbmwatch.validation import HbmwatchError, QueryTooExpensive


class PrometheusRoute(APIRoute):
    """A route whose query and parameter errors take Prometheus' shape, not hbmwatch's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except (QueryError, HbmwatchError) as exc:
                return _failure(exc)

        return handle


class PromSuccess(BaseModel):
    status: Literal["success"]
    data: Any
    warnings: list[str] | None = None


class PromError(BaseModel):
    status: Literal["error"]
    errorType: str = Field(examples=["bad_data"])
    error: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": PromError, "description": text}
    for code, text in {
        400: "bad_data: the query or a parameter cannot be parsed.",
        401: "A token is needed.",
        422: "execution: cannot be evaluated, over a budget; unsupported: a construct "
        "hbmwatch does not evaluate, named.",
        503: "The store is unavailable.",
    }.items()
}


def _documented(*names: str) -> dict[str, Any]:
    """Parameters come from the query string or a form body; the schema names them."""
    params = [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
              for n in names]  # fmt: skip
    return {"parameters": params}


router = APIRouter(
    prefix="/prometheus/api/v1",
    tags=["prometheus"],
    route_class=PrometheusRoute,
    responses={200: {"model": PromSuccess}, **_ERRORS},
)
MAX_POINTS = 11_000
#: the Prometheus version whose API and PromQL this one follows (Grafana reads it)
COMPATIBLE_WITH = "2.42.0"


def _json(body: str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _failure(exc: Exception) -> Response:
    if isinstance(exc, QueryError):
        return _json(promjson.error(exc.error_type, str(exc)), exc.status)
    if isinstance(exc, QueryTooExpensive):
        return _json(promjson.error("execution", str(exc)), 422)
    if isinstance(exc, StoreUnavailable | SchemaOutdated):
        return _json(promjson.error("unavailable", str(exc)), 503)
    if isinstance(exc, HbmwatchError):
        return _json(promjson.error("bad_data", str(exc)), 400)
    raise exc


async def _params(request: Request) -> dict[str, list[str]]:
    """Query-string and form parameters together, as Go's ``Request.FormValue`` sees them."""
    out: dict[str, list[str]] = {}
    if request.method == "POST":
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("", "application/x-www-form-urlencoded"):
            raise BadQuery(f"form bodies must be application/x-www-form-urlencoded, not {kind}")
        body = (await request.body()).decode("utf-8", errors="replace")
        for key, val in parse_qsl(body, keep_blank_values=True):
            out.setdefault(key, []).append(val)
    for key, val in request.query_params.multi_items():
        out.setdefault(key, []).append(val)
    return out


def _one(params: dict[str, list[str]], name: str) -> str:
    return params.get(name, [""])[0]


async def _answer(request: Request, work: Callable[[], str]) -> Response:
    budget = request.app.state.settings.api.query_timeout_seconds

    def run() -> str:
        with time_budget(budget):
            return work()

    try:
        return _json(await run_in_threadpool(run))
    except Exception as exc:
        return _failure(exc)


def _tier(request: Request, params: dict[str, list[str]], tree: Any, grid: Grid) -> str:
    """``resolution=raw|1m|1h`` where the caller asks (an hbmwatch extension), else chosen."""
    asked = _one(params, "resolution") or "auto"
    if not request.app.state.store.has_tiers:  # samples on a remote engine: raw only
        if asked not in ("auto", "raw"):
            raise BadQuery(f'invalid parameter "resolution": {asked!r}: the samples are on a '
                           "remote engine, which hbmwatch reads raw")  # fmt: skip
        return "raw"
    if asked == "auto":
        span = request.app.state.settings.api.promql_raw_max_span_seconds
        return resolution.choose(tree, grid, int(span * 1000))
    if asked not in resolution.TIERS:
        raise BadQuery(f'invalid parameter "resolution": {asked!r} is not auto, raw, 1m or 1h')
    return asked


def _evaluate(request: Request, params: dict[str, list[str]], grid: Grid, *, instant: bool) -> str:
    tree = parse(_one(params, "query"))
    store = request.app.state.store
    source = WithVirtual(store, StoreSource(store, _tier(request, params, tree, grid)))
    value = Evaluator(source).eval(tree, grid)
    if not instant and not isinstance(value, list | Scalar):
        kind = "range vector" if isinstance(value, Windows) else "string"
        raise BadQuery(
            f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector'
        )
    kind, result = promjson.render(value, grid.times, instant=instant)
    return promjson.success(f'{{"resultType":"{kind}","result":{result}}}', source.warnings)


@router.get("/query", openapi_extra=_documented("query", "time", "timeout"))
@router.post("/query", openapi_extra=_documented("query", "time", "timeout"))
async def query(request: Request, _: ScopeRead) -> Response:
    """An instant query: ``query``, ``time`` (default now)."""
    params = await _params(request)
    raw_time = _one(params, "time")
    at = promjson.parse_time(raw_time, "time") if raw_time else int(time.time() * 1000)
    if timeout := _one(params, "timeout"):
        promjson.parse_duration(timeout, "timeout")
    grid = Grid(at, at, 1)
    return await _answer(request, lambda: _evaluate(request, params, grid, instant=True))


@router.get(
    "/query_range", openapi_extra=_documented("query", "start", "end", "step", "resolution")
)
@router.post(
    "/query_range", openapi_extra=_documented("query", "start", "end", "step", "resolution")
)
async def query_range(request: Request, _: ScopeRead) -> Response:
    """A range query: ``query``, ``start``, ``end``, ``step`` (seconds or a duration)."""
    params = await _params(request)
    start = promjson.parse_time(_one(params, "start"), "start")
    end = promjson.parse_time(_one(params, "end"), "end")
    if end < start:
        raise BadQuery('invalid parameter "end": end timestamp must not be before start time')
    step = promjson.parse_duration(_one(params, "step"), "step")
    if step <= 0:
        raise BadQuery(
            'invalid parameter "step": zero or negative query resolution step widths are '
            "not accepted. Try a positive integer"
        )
    if (end - start) // step > MAX_POINTS:
        raise BadQuery(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing "
            "the query resolution (?step=XX)"
        )
    grid = Grid(start, end, step)
    return await _answer(request, lambda: _evaluate(request, params, grid, instant=False))


def _match_sets(params: dict[str, list[str]], *, required: bool) -> list[list[Matcher]]:
    selectors = params.get("match[]", [])
    if required and not selectors:
        raise BadQuery("no match[] parameter provided")
    out = []
    for text in selectors:
        node = parse(text)
        while hasattr(node, "expr") and not hasattr(node, "matchers"):
            node = node.expr
        if not hasattr(node, "matchers") or hasattr(node, "range"):
            raise BadQuery(f'invalid parameter "match[]": {text} is not a series selector')
        out.append(selector_matchers(node))
    return out


def _series(request: Request, params: dict[str, list[str]], *, required: bool):
    """Series matching any ``match[]`` with a sample between ``start`` and ``end``."""
    sets = _match_sets(params, required=required) or [[]]
    start, end = _one(params, "start"), _one(params, "end")
    lo = promjson.parse_time(start, "start") if start else promjson.MIN_TIME_MS
    hi = promjson.parse_time(end, "end") if end else promjson.MAX_TIME_MS
    if hi < lo:
        raise BadQuery('invalid parameter "end": end timestamp must not be before start time')
    bounded = bool(start or end)
    store = request.app.state.store
    seen: dict[str, Labels] = {}
    for matchers in sets:
        _, stored = virtual.wanted(matchers)
        if stored:
            keys = store.label_sets(matchers, lo, hi) if bounded else store.label_sets(matchers)
            for key in keys:
                seen.setdefault(key.text, labels_of_key(key))
        now = store.now_ms()
        for s in virtual.matching(store, matchers, max(lo, 0), min(hi, now)):
            seen.setdefault(json.dumps(s.labels), s.labels)
    return list(seen.values())


@router.get("/series", openapi_extra=_documented("match[]", "start", "end"))
@router.post("/series", openapi_extra=_documented("match[]", "start", "end"))
async def series(request: Request, _: ScopeRead) -> Response:
    """Series that match any ``match[]`` selector."""
    params = await _params(request)

    def work() -> str:
        found = [dict(labels) for labels in _series(request, params, required=True)]
        return promjson.success(json.dumps(found, separators=(",", ":")), [])

    return await _answer(request, work)


@router.get("/labels", openapi_extra=_documented("match[]", "start", "end"))
@router.post("/labels", openapi_extra=_documented("match[]", "start", "end"))
async def labels(request: Request, _: ScopeRead) -> Response:
    """Label names of the series that match ``match[]`` (all series without it)."""
    params = await _params(request)

    def work() -> str:
        names: set[str] = set()
        for labels in _series(request, params, required=False):
            names.update(name for name, _ in labels)
        return promjson.success(json.dumps(sorted(names)), [])

    return await _answer(request, work)


@router.get("/label/{name}/values", openapi_extra=_documented("match[]", "start", "end"))
async def label_values(name: str, request: Request, _: ScopeRead) -> Response:
    """Values of one label over the series that match ``match[]`` (all without it)."""
    params = await _params(request)

    def work() -> str:
        if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", name):
            raise BadQuery(f'invalid label name: "{name}"')
        values: set[str] = set()
        for labels in _series(request, params, required=False):
            got = dict(labels).get(name, "")
            if got:
                values.add(got)
        return promjson.success(json.dumps(sorted(values)), [])

    return await _answer(request, work)


@router.get("/metadata", openapi_extra=_documented("metric", "limit"))
async def metadata(request: Request, _: ScopeRead) -> Response:
    """Type, help and unit of every canonical metric (``metric=`` for one, ``limit=``)."""
    params = await _params(request)
    wanted = _one(params, "metric")
    limit = _one(params, "limit")
    out: dict[str, list[dict[str, str]]] = {}
    for definition in metrics.METRICS.values():
        if wanted and definition.name != wanted:
            continue
        if limit and limit.lstrip("-").isdigit() and 0 <= int(limit) <= len(out):
            break
        kind = "counter" if definition.is_counter else "gauge"
        out[definition.name] = [{"type": kind, "help": definition.help, "unit": definition.unit}]
    return _json(promjson.success(json.dumps(out), []))


@router.get("/status/buildinfo")
async def buildinfo(_: ScopeRead) -> Response:
    """What Grafana reads to learn the server's flavour and version."""
    try:
        ours = version("hbmwatch")
    except PackageNotFoundError:
        ours = "unknown"
    info = {
        "version": COMPATIBLE_WITH,
        "revision": f"hbmwatch-{ours}",
        "branch": "hbmwatch",
        "buildUser": "hbmwatch",
        "buildDate": "",
        "goVersion": "",
    }
    return _json(promjson.success(json.dumps(info), []))


@router.get("/query_exemplars", openapi_extra=_documented("query", "start", "end"))
@router.post("/query_exemplars", openapi_extra=_documented("query", "start", "end"))
async def query_exemplars(_: ScopeRead) -> Response:
    """No exemplars are stored: an empty answer, as Prometheus gives for series without."""
    return _json(promjson.success("[]", []))


@router.get("/rules")
async def rules(_: ScopeRead) -> Response:
    """hbmwatch evaluates no rule groups here (its detectors raise the alerts); Grafana asks."""
    return _json(promjson.success('{"groups":[]}', []))


@router.get("/alerts")
async def alerts(request: Request, _: ScopeRead) -> Response:
    """hbmwatch's pending and firing alerts in Prometheus' ``/api/v1/alerts`` shape."""

    def work() -> str:
        store = request.app.state.store
        live = store.alerts.alerts(since_ms=store.now_ms(), limit=5000)
        items = [
            {
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "state": a.state.value,
                "activeAt": datetime.fromtimestamp(a.started_ms / 1000, UTC).isoformat(),
                "value": "1e+00",
            }
            for a in live
            if a.resolved_ms is None
        ]
        return promjson.success(json.dumps({"alerts": items}, separators=(",", ":")), [])

    return await _answer(request, work)
