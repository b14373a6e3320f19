"""A small fleet's series for every dashboard query, and running the queries as Grafana does.

``fleet_series`` is half an hour of samples of two hosts (an MI300X host whose fabric
counters come per link, an H100 host whose come as ``link="all"`` only), their workloads
and scrape targets, with a degraded fabric link, a PCIe link that retrained narrower and a
counter reset, plus the virtual series (an open incident, firing alerts, open findings), so
every panel has something to show, filtering tables included.  ``answer`` sends one query
the way Grafana's Prometheus datasource does (form POST; label values with ``match[]``),
multi-value variables on "All".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from hbmwatch.metrics import METRICS, MetricDef, Scope
from tests.dashboard_queries import (
    DASHBOARDS,
    VARIABLE_VALUES,
    Query,
    load_json,
    substitute,
    variables,
)

#: The newest sample; a fixed past time, so a real Prometheus keeps and serves it.
END_S = 1_750_000_020
SPAN_S = 30 * 60
STEP_S = 15
#: The range a range query asks for, and its step (Grafana: the panel's width decides).
RANGE_STEP_S = 60

_HOSTS = {
    "n0": {"rack": "r0", "sku": "MI300X", "vendor": "amd", "fabric": "xgmi"},
    "n1": {"rack": "r1", "sku": "H100", "vendor": "nvidia", "fabric": "nvlink"},
}
_CHOICES = {
    "reason": ("hbm_thermal", "power"),
    "domain": ("compute", "memory"),
    "stack": ("0", "1"),
    "error": ("crc", "replay"),
    "severity": ("correctable",),
    "quantile": ("0.5", "0.99"),
    "phase": ("ttft", "e2e"),
    "scheme": ("xid",),  # issue 18's error and health series (one value each)
    "code": ("79",),
    "check": ("overall",),
}


@dataclass(frozen=True)
class Series:
    name: str
    labels: Mapping[str, str]
    points: tuple[tuple[int, float], ...]  # (unix seconds, value)


def _times() -> list[int]:
    return list(range(END_S - SPAN_S, END_S + 1, STEP_S))


def _device_label_sets(m: MetricDef) -> Iterator[dict[str, str]]:
    for host, info in _HOSTS.items():
        for gpu in ("0", "1"):
            base = {"cluster": "c0", "rack": info["rack"], "host": host, "gpu": gpu,
                    "sku": info["sku"], "vendor": info["vendor"]}  # fmt: skip
            names = [n for n in m.labels if n not in ("fabric", "link", "direction")]
            for combo in itertools.product(*(_CHOICES[n] for n in names)):
                labels = {**base, **dict(zip(names, combo, strict=True))}
                if "fabric" in m.labels:
                    labels["fabric"] = info["fabric"]
                links = ("0", "1") if info["fabric"] == "xgmi" else ("all",)
                links = links if "link" in m.labels else ("",)
                directions = ("both",) if info["fabric"] == "nvlink" else ("rx", "tx")
                if m.name.startswith("gpu_pcie"):
                    directions = ("rx", "tx")
                directions = directions if "direction" in m.labels else ("",)
                for link, direction in itertools.product(links, directions):
                    extra = {"link": link, "direction": direction}
                    yield {**labels, **{k: v for k, v in extra.items() if v}}


def _value(m: MetricDef, labels: Mapping[str, str], i: int, n: int) -> float:
    if m.is_counter:
        return float(7 * (i if i < n // 2 else i - n // 2))  # restarts once, halfway
    late = i > n // 2
    if m.name == "gpu_fabric_link_bandwidth_bytes_per_second":
        degraded = (labels["host"], labels["gpu"], labels["link"]) == ("n0", "0", "1") and late
        return 64e9 if degraded else 128e9
    if m.name == "gpu_pcie_link_width_lanes":
        return 8.0 if (labels["host"], labels["gpu"]) == ("n0", "1") and late else 16.0
    if m.name == "gpu_pcie_link_speed_transfers_per_second":
        return 32e9
    if m.unit == "info":
        return 1.0
    if m.unit == "boolean":
        return float(i // 20 % 2)
    if m.unit == "ratio":
        return 0.5 + 0.01 * (i % 7)
    return 60.0 + i % 11 + (5.0 if labels.get("host") == "n1" else 0.0)


def _canonical() -> Iterator[Series]:
    times = _times()
    for m in METRICS.values():
        if m.scope is Scope.DEVICE:
            sets = list(_device_label_sets(m))
        elif m.scope is Scope.WORKLOAD:
            sets = [
                {"cluster": "c0", "rack": _HOSTS[h]["rack"], "host": h, "gpu": "0",
                 "service": "chat", "model": "llama", **dict(zip(names, combo, strict=True))}
                for h in _HOSTS
                for names in [[n for n in ("phase", "quantile") if n in m.required_labels]]
                for combo in itertools.product(*(_CHOICES[n] for n in names))
            ]  # fmt: skip
        elif m.scope is Scope.ATTRIBUTION:  # a pod on each host's GPU 0, a Slurm job on GPU 1
            sets = [
                {"cluster": "c0", "rack": i["rack"], "host": h, "gpu": "0", "namespace": "ml",
                 "pod": f"chat-{h}", "container": "vllm"}
                for h, i in _HOSTS.items()
            ] + [{"cluster": "c0", "rack": i["rack"], "host": h, "gpu": "1", "job": f"42{n}"}
                 for n, (h, i) in enumerate(_HOSTS.items())]  # fmt: skip
        elif m.scope is Scope.SERIES:  # a user's queue depth per host
            sets = [{"cluster": "c0", "rack": i["rack"], "host": h, "series": "queue_depth"}
                    for h, i in _HOSTS.items()]  # fmt: skip
        else:  # collector
            sets = [{"cluster": "c0", "rack": i["rack"], "host": h, "target": f"dme-{h}",
                     **({"reason": "malformed"} if "reason" in m.labels else {})}
                    for h, i in _HOSTS.items()]  # fmt: skip
        for labels in sets:
            points = tuple((t, _value(m, labels, i, len(times))) for i, t in enumerate(times))
            yield Series(m.name, labels, points)


def virtual_series() -> list[Series]:
    """An incident open on rack r0 for the last 20 minutes, its alert on n0 GPU 0 and a
    fabric alert on n0 GPU 1 firing, the open findings behind them."""
    opened = END_S - 20 * 60
    times = [t for t in _times() if t >= opened]

    def ones(name: str, labels: dict[str, str], value: float = 1.0) -> Series:
        return Series(name, labels, tuple((t, value) for t in times))

    gpu = {"cluster": "c0", "rack": "r0", "host": "n0"}
    return [
        ones(
            "hbmwatch_incident_open",
            {
                "incident_id": "i1",
                "title": "rack r0 (c0): HBM hot",
                "severity": "critical",
                "state": "open",
                "kind": "thermal_excursion",
                "cluster": "c0",
                "rack": "r0",
            },
        ),
        ones(
            "ALERTS",
            {
                "alertname": "HBMThermalExcursion",
                "alertstate": "firing",
                "severity": "critical",
                "kind": "thermal_excursion",
                "scope": "gpu",
                "muted": "false",
                "incident": "i1",
                **gpu,
                "gpu": "0",
            },
        ),
        ones(
            "ALERTS",
            {
                "alertname": "GPUFabricErrors",
                "alertstate": "firing",
                "severity": "warning",
                "kind": "fabric_errors",
                "scope": "gpu",
                "muted": "false",
                **gpu,
                "gpu": "1",
            },
        ),
        ones("hbmwatch_findings_open", {"kind": "thermal_excursion", "severity": "critical"}),
        ones("hbmwatch_findings_open", {"kind": "fabric_errors", "severity": "warning"}),
    ]


def fleet_series() -> list[Series]:
    return [*_canonical(), *virtual_series()]


def openmetrics(series: list[Series]) -> str:
    """OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics`` (seconds)."""
    lines = []
    for name, group in itertools.groupby(sorted(series, key=lambda s: s.name), lambda s: s.name):
        lines.append(f"# TYPE {name} unknown")
        for s in group:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            lines += [f"{name}{{{labels}}} {v!r} {t}" for t, v in s.points]
    return "\n".join(lines) + "\n# EOF\n"


# -- asking -------------------------------------------------------------------------------------


def answer(client: httpx.Client, query: Query, end_s: float, **values: str) -> list[Any]:
    """What the datasource would get back for ``query`` at ``end_s``: the result list of a
    query, or a variable's label values.  Raises on an error answer."""
    dashboard = load_json(DASHBOARDS / "json" / query.dashboard)
    every = {v["name"]: ".*" for v in variables(dashboard) if v.get("includeAll")}  # "All"
    expr = substitute(query.expr, {**VARIABLE_VALUES, **every, **values})
    if query.kind == "variable":
        response = client.get(
            f"api/v1/label/{query.label}/values",
            params={"match[]": expr, "start": end_s - SPAN_S, "end": end_s},
        )
    elif query.instant:
        response = client.post("api/v1/query", data={"query": expr, "time": end_s})
    else:
        start = end_s - SPAN_S + 300
        response = client.post(
            "api/v1/query_range",
            data={"query": expr, "start": start, "end": end_s, "step": RANGE_STEP_S},
        )
    body = response.json()
    if response.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"{query}: {response.status_code} {body} for {expr}")
    data = body["data"]
    return data if query.kind == "variable" else data["result"]
