"""Requests at the edges of Prometheus' HTTP API over dataset 1: parameter forms (RFC 3339
times, duration steps), the errors it answers for bad parameters, and the label and series
endpoints over ranges that cut series which stopped or started late.
"""

from __future__ import annotations

from typing import Any

from tests.conftest import NOW

Q = "/api/v1/query"
R = "/api/v1/query_range"
P = "sum by (host) (rate(gpu_energy_joules_total[5m]))"
H = 3600.0


def requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, params); a list value is a repeated parameter (``match[]``)."""
    span = {"start": NOW - H, "end": NOW}
    tail = {"start": NOW - 600, "end": NOW}
    late = {"start": NOW - 2 * H, "end": NOW - 110 * 60}
    before = {"start": NOW - 26 * H, "end": NOW - 25 * H}  # a day before any sample
    return [
        ("GET", Q, {"query": P, "time": "2027-01-15T08:00:00Z"}),
        ("GET", Q, {"query": P, "time": "2027-01-15T07:59:59.5Z"}),
        ("GET", Q, {"query": P, "time": "2027-01-15T08:30:00+01:00"}),
        ("GET", Q, {"query": P, "time": f"{NOW - 61.123456:.6f}"}),
        ("GET", Q, {"query": P, "time": "abc"}),
        ("GET", Q, {"time": NOW}),
        ("GET", Q, {"query": "", "time": NOW}),
        ("GET", Q, {"query": P, "time": NOW, "timeout": "30s"}),
        ("GET", Q, {"query": P, "time": NOW, "timeout": "soon"}),
        ("GET", Q, {"query": '"a string"', "time": NOW}),
        ("GET", Q, {"query": "42", "time": NOW}),
        ("GET", Q, {"query": "gpu_power_watts[1m]", "time": NOW}),
        ("POST", R, {"query": P, **span, "step": "1m"}),
        ("POST", R, {"query": P, **span, "step": "90s"}),
        ("POST", R, {"query": P, **span, "step": "15.5"}),
        (
            "POST",
            R,
            {
                "query": P,
                "start": "2027-01-15T07:00:00Z",
                "end": "2027-01-15T08:00:00Z",
                "step": "5m",
            },
        ),
        ("POST", R, {"query": P, "start": NOW, "end": NOW - H, "step": 60}),
        ("POST", R, {"query": P, **span, "step": 0}),
        ("POST", R, {"query": P, **span, "step": -15}),
        ("POST", R, {"query": P, "start": NOW - 2 * H, "end": NOW, "step": 0.5}),
        ("POST", R, {"query": P, **span}),
        ("POST", R, {"query": "gpu_power_watts[1m]", **span, "step": 60}),
        ("POST", R, {"query": "42", "start": NOW - 300, "end": NOW, "step": 60}),
        ("POST", R, {"query": "gpu_power_watts", "start": NOW, "end": NOW, "step": 60}),
        ("GET", "/api/v1/series", span),
        ("GET", "/api/v1/series", {"match[]": "gpu_power_watts", **span}),
        (
            "GET",
            "/api/v1/series",
            {"match[]": ["gpu_power_watts", 'gpu_pcie_naks_total{host="h1"}'], **span},
        ),
        ("POST", "/api/v1/series", {"match[]": '{host="h2"}', **tail}),
        ("POST", "/api/v1/series", {"match[]": "gpu_clock_hertz", **late}),
        ("POST", "/api/v1/series", {"match[]": "gpu_clock_hertz{", **span}),
        ("GET", "/api/v1/labels", span),
        ("GET", "/api/v1/labels", {"match[]": 'gpu_power_watts{host="h2"}', **span}),
        ("GET", "/api/v1/labels", {"match[]": "gpu_hbm_stack_temperature_celsius", **tail}),
        ("GET", "/api/v1/label/host/values", span),
        ("GET", "/api/v1/label/__name__/values", {"match[]": '{rack="r0"}', **span}),
        ("GET", "/api/v1/label/stack/values", {"match[]": "gpu_power_watts", **span}),
        ("GET", "/api/v1/label/nope/values", span),
        ("GET", "/api/v1/label/gpu/values", {"match[]": '{host="h0"}', **late}),
        ("GET", "/api/v1/label/bad-name/values", span),
        ("GET", "/api/v1/series", {"match[]": "gpu_power_watts", **before}),
        ("GET", "/api/v1/labels", before),
        ("GET", "/api/v1/label/host/values", before),
    ]
