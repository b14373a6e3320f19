"""Writes ``tests/fixtures/grafana/prometheus_exchange.json``: the HTTP requests Grafana's
Prometheus datasource sends, as its source code builds them (no Grafana binary here).

Run ``python -m tests.promdiff.grafana_exchange`` to regenerate.  The requests are over
dataset 1 (``tests/promdiff/dataset.py``; Grafana's "now" is 13.377 s before the store clock
``tests.conftest.NOW``).  What each one follows, from grafana/grafana (main, Grafana 12.3):

* ``pkg/promlib/client/client.go``: queries as form POSTs (``Content-Type:
  application/x-www-form-urlencoded``, keys sorted as Go's ``url.Values.Encode`` writes
  them), ``start``/``end`` as seconds with the fraction Go's ``FormatFloat(-1)`` gives,
  ``step`` in seconds; an instant query's ``time`` is the range end, unaligned; resource
  calls under ``api/v1/label/`` and ``api/v1/metadata`` always GET, ``labels``/``series``
  POST.
* ``pkg/promlib/models/query.go``: ``start``/``end`` aligned down to a multiple of ``step``
  (``AlignTimeRange``), ``$__rate_interval`` = max(step + scrape, 4 x scrape) written as a Go
  duration (``1m0s``), ``$__range`` as whole seconds.
* ``pkg/promlib/healthcheck.go`` and ``heuristics.go``: the "Save & test" check, an instant
  ``1+1`` at time 4, then ``api/v1/status/buildinfo``.
* ``packages/grafana-prometheus/src/resource_clients.ts``, ``metric_find_query.ts``,
  ``constants.ts``: the query editor's and variables' ``labels``, ``label/<name>/values``
  (``limit=40000``, optional ``match[]``), ``series`` (``match[]={__name__!=""}``) calls with
  whole-second ``start``/``end``; ``query_result(...)`` variables as an instant query.
* ``packages/grafana-prometheus/src/annotations.ts``: an annotation is a range query with
  ``step`` from the annotation (default 60 s).
* ``pkg/promlib/client/client.go`` ``QueryExemplars`` (a form POST of query, start, end) and
  the datasource's ``loadRules`` (``GET api/v1/rules``); ``api/v1/alerts`` is in the
  client's GET-only list.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlencode

from tests.conftest import NOW, REPO

USER_AGENT = "Grafana/12.3.0"
GRAFANA_NOW = NOW - 13.377
OUT = REPO / "tests" / "fixtures" / "grafana" / "prometheus_exchange.json"


def _go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'f', -1, 64): the shortest text that reads back the same."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _request(name: str, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
    encoded = urlencode(sorted((k, str(v)) for k, v in params.items()))
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "gzip"}
    if method == "POST":
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        return {"name": name, "method": method, "path": path, "headers": headers, "body": encoded}
    path = f"{path}?{encoded}" if encoded else path
    return {"name": name, "method": method, "path": path, "headers": headers, "body": ""}


def _range(name: str, expr: str, span_s: float, step: float) -> dict[str, Any]:
    start = math.floor((GRAFANA_NOW - span_s) / step) * step
    end = math.floor(GRAFANA_NOW / step) * step
    params = {"query": expr, "start": _go_float(start), "end": _go_float(end)}
    params["step"] = _go_float(step)
    return _request(name, "POST", "/api/v1/query_range", params)


def _instant(name: str, expr: str, method: str = "POST") -> dict[str, Any]:
    return _request(name, method, "/api/v1/query", {"query": expr, "time": _go_float(GRAFANA_NOW)})


def _resource(name: str, method: str, path: str, span_s: float, **extra: str) -> dict[str, Any]:
    start = math.floor(GRAFANA_NOW - span_s)
    end = math.ceil(GRAFANA_NOW)
    return _request(name, method, path, {"start": start, "end": end, **extra})


PANELS: tuple[tuple[str, str, float, float], ...] = (
    # (what, expr as Grafana sends it, range seconds, step seconds)
    (
        "panel: energy rate by host, last 1h",
        "sum by (host) (rate(gpu_energy_joules_total[1m0s]))",
        3600.0,
        15.0,
    ),
    (
        "panel: HBM stack max, last 6h",
        "max by (host, gpu) (gpu_hbm_stack_temperature_celsius)",
        6 * 3600.0,
        20.0,
    ),
    ("panel: power, All hosts", 'avg by (rack) (gpu_power_watts{host=~".*"})', 3600.0, 15.0),
    (
        "panel: NAK rate, interval 1m",
        'sum by (direction) (rate(gpu_pcie_naks_total{host=~"h0|h1"}[2m0s]))',
        6 * 3600.0,
        60.0,
    ),
    (
        "panel: clock share",
        'gpu_clock_hertz{domain="compute"} / on(host, gpu) group_left '
        "sum by (host, gpu) (gpu_clock_hertz)",
        3600.0,
        15.0,
    ),
    (
        "annotation: power throttle starts (step 60s)",
        'changes(gpu_throttle_active{reason="power"}[1m]) > 0',
        6 * 3600.0,
        60.0,
    ),
    ("panel: an error Grafana shows", "rate(gpu_power_watts)", 3600.0, 15.0),
)
TABLES: tuple[tuple[str, str, str], ...] = (
    # (what, expr, method)
    ("variable: query_result(topk)", "topk(3, gpu_power_watts)", "GET"),
    (
        "table: ECC errors over the range",
        "sum by (host, severity) (increase(gpu_ecc_errors_total[3600s]))",
        "POST",
    ),
    ("table: throttled GPUs", "max by (host, gpu) (gpu_throttle_active) == 1", "POST"),
    ("stat: energy total", "sum(gpu_energy_joules_total)", "POST"),
    ("table: power, GET", "sort_desc(avg_over_time(gpu_power_watts[5m]))", "GET"),
)


def _resources() -> list[dict[str, Any]]:
    hour, six, limit = 3600.0, 6 * 3600.0, {"limit": "40000"}
    names = "/api/v1/label/__name__/values"
    return [
        _request("health check: 1+1", "POST", "/api/v1/query", {"query": "1+1", "time": "4"}),
        _request("health check: buildinfo", "GET", "/api/v1/status/buildinfo", {})
        | {"compare": "shape"},
        _resource("editor: metric names", "GET", names, hour, **limit),
        _resource("editor: label names", "POST", "/api/v1/labels", hour, **limit),
        _resource(
            "editor: label names of a metric",
            "POST",
            "/api/v1/labels",
            hour,
            **limit,
            **{"match[]": "gpu_power_watts"},
        ),
        _resource("editor: metadata", "GET", "/api/v1/metadata", hour) | {"compare": "shape"},
        _request("editor: recording rules", "GET", "/api/v1/rules", {}),
        _request("alerting: datasource alerts", "GET", "/api/v1/alerts", {}),
        _request(
            "panel: exemplars",
            "POST",
            "/api/v1/query_exemplars",
            {
                "query": "sum(rate(gpu_energy_joules_total[1m0s]))",
                "start": _go_float(math.floor((GRAFANA_NOW - hour) / 15) * 15),
                "end": _go_float(math.floor(GRAFANA_NOW / 15) * 15),
            },
        ),
        _resource("variable: label_values(host)", "GET", "/api/v1/label/host/values", hour),
        _resource(
            'variable: label_values(gpu_power_watts{rack="r0"}, gpu)',
            "GET",
            "/api/v1/label/gpu/values",
            hour,
            **{"match[]": 'gpu_power_watts{rack="r0"}'},
        ),
        _resource(
            "variable: label_values(gpu_hbm_stack_temperature_celsius, stack) over 6h",
            "GET",
            "/api/v1/label/stack/values",
            six,
            **{"match[]": "gpu_hbm_stack_temperature_celsius"},
        ),
        _resource(
            "metrics browser: every series",
            "POST",
            "/api/v1/series",
            hour,
            **limit,
            **{"match[]": '{__name__!=""}'},
        ),
        _resource(
            "variable: series of a selector",
            "POST",
            "/api/v1/series",
            hour,
            **limit,
            **{"match[]": 'gpu_clock_hertz{host=~"h0|h2"}'},
        ),
    ]


def requests() -> list[dict[str, Any]]:
    return (
        _resources()
        + [_instant(name, expr, method) for name, expr, method in TABLES]
        + [_range(name, expr, span, step) for name, expr, span, step in PANELS]
    )


def document() -> dict[str, Any]:
    return {
        "about": (
            "HTTP requests Grafana's Prometheus datasource sends, rebuilt from Grafana's source "
            "(no Grafana binary was run). Paths are relative to the datasource URL. "
            'compare "shape": the answer is server-specific (build info; metadata, which an '
            "offline Prometheus that scrapes nothing lacks): a success with a data object, "
            "and no build features (Grafana then treats the server as Prometheus). Follows "
            "grafana/grafana main at Grafana 12.3: pkg/promlib/client/client.go, "
            "pkg/promlib/models/query.go, pkg/promlib/healthcheck.go, pkg/promlib/heuristics.go, "
            "packages/grafana-prometheus/src/{resource_clients,metric_find_query,constants,"
            "annotations}.ts. Generated by tests/promdiff/grafana_exchange.py over the "
            "differential tests' dataset 1."
        ),
        "grafana_now": GRAFANA_NOW,
        "requests": requests(),
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document(), indent=1) + "\n")


if __name__ == "__main__":
    main()
