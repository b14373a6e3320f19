"""The signals a frame carries and the canonical series behind each.

Why a module of its own: which metric becomes which signal (and how samples of one cell
combine) is the one place detectors meet metric names; the frame (``detectors/frame.py``)
and its builder (``detectors/frame_builder.py``) only use the codes defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from hbmwatch.gpu_errors import Action, lookup
from hbmwatch.metrics import THERMAL_THROTTLE_REASONS
from hbmwatch.records import SeriesKey

POWER_THROTTLE_REASONS = ("power", "power_brake", "board_limit")
MAX_STACKS = 8


class Route(NamedTuple):
    table: str  # gpu | wl | tgt
    key: str
    signal: str
    how: str  # last | mean | max | sum | frac
    slot: int = -1  # stack index for "stack"


def gpu_key(labels: Mapping[str, str]) -> str:
    return f"{labels.get('cluster', '')}/{labels.get('host', '')}/{labels.get('gpu', '')}"


def route(key: SeriesKey) -> Route | None:
    """Where a canonical series goes in a frame, or None if no detector reads it."""
    m, label = key.metric, key.label
    if m.startswith("gpu_"):
        return _device_route(key, gpu_key(dict(key.labels)))
    if m.startswith("workload_"):
        wkey = f"{label('service')}/{label('phase')}"
        q = label("quantile")
        if m == "workload_latency_seconds" and q in _QUANTILE_SIGNAL:
            return Route("wl", wkey, _QUANTILE_SIGNAL[q], "last")
        if m == "workload_latency_resolution_seconds" and q in _QUANTILE_SIGNAL:
            return Route("wl", wkey, "res" + _QUANTILE_SIGNAL[q][1:], "last")
        if m == "workload_window_requests":
            return Route("wl", wkey, "window_requests", "last")
        if m == "workload_requests_total":
            return Route("wl", wkey, "requests", "sum")
        return None
    target = label("target")
    if m == "hbmwatch_target_up" and target:
        return Route("tgt", target, "up", "last")
    if m == "hbmwatch_scrape_dropped_total" and target and label("reason") == "sentinel":
        return Route("tgt", target, "sentinel", "sum")
    return None


#: Metrics read sample by sample at their own timestamps, not laid on the grid: a user's
#: own series (``detectors/generic.py``), which may be sampled every 5 minutes or every 100 ms.
RAW_METRICS: tuple[str, ...] = ("user_series_value",)


def reads(key: SeriesKey) -> bool:
    """Whether a frame carries the series: on the grid (``route``) or raw."""
    return key.metric in RAW_METRICS or route(key) is not None


_QUANTILE_SIGNAL = {"0.5": "p50", "0.95": "p95", "0.99": "p99"}
_GAUGES = {
    "gpu_memory_temperature_celsius": ("mem_temp", "last"),
    "gpu_hotspot_temperature_celsius": ("hot_temp", "last"),
    "gpu_power_watts": ("power", "last"),
    "gpu_power_limit_watts": ("power_limit", "last"),
    "gpu_memory_bandwidth_utilization_ratio": ("bw", "mean"),
    "gpu_utilization_ratio": ("util", "mean"),
}
_COUNTERS = {
    "gpu_pcie_replays_total": "pcie_replays",
    "gpu_pcie_recoveries_total": "pcie_recoveries",
    "gpu_fabric_errors_total": "fabric_errors",
}


#: The canonical metric behind each GPU signal, for evidence when no series text is at hand.
SIGNAL_METRIC: dict[str, str] = {
    **{signal: metric for metric, (signal, _) in _GAUGES.items()},
    **{signal: metric for metric, signal in _COUNTERS.items()},
    "clock": "gpu_clock_hertz",
    "mem_clock": "gpu_clock_hertz",
    "thr_hbm": "gpu_throttle_seconds_total",
    "thr_thermal": "gpu_throttle_seconds_total",
    "thr_power": "gpu_throttle_seconds_total",
    **{signal: "gpu_error_events_total" for signal in ("err_fatal", "err_reset", "err_benign")},
    "remap_failed": "gpu_row_remap_failed",
    "health": "gpu_health_status",
}

#: GPU error events by what they ask of an operator: one signal per action class.  An
#: unknown code counts with the benign ones: worth a look in a storm, not a page alone.
ERROR_SIGNAL: dict[Action, str] = {
    Action.FATAL: "err_fatal",
    Action.NEEDS_RESET: "err_reset",
    Action.BENIGN: "err_benign",
    Action.UNKNOWN: "err_benign",
}


def error_code(key: SeriesKey) -> str | None:
    """``xid:79`` for a ``gpu_error_events_total`` series, None for others or a bad code."""
    if key.metric != "gpu_error_events_total":
        return None
    scheme, code = key.label("scheme") or "", key.label("code") or ""
    return f"{scheme}:{int(code)}" if scheme and code.isdigit() else None


def _device_route(key: SeriesKey, gkey: str) -> Route | None:
    m, label = key.metric, key.label
    if m in _GAUGES:
        signal, how = _GAUGES[m]
        if how == "last" and label("partition") not in (None, "", "0"):
            return None  # physical sensors live on partition 0 only
        return Route("gpu", gkey, signal, how)
    if m == "gpu_hbm_stack_temperature_celsius":
        stack = label("stack") or ""
        if stack.isdigit() and int(stack) < MAX_STACKS:
            return Route("gpu", gkey, "stack", "last", int(stack))
        return None
    if m == "gpu_clock_hertz":
        domain = label("domain")
        if domain in ("compute", "memory"):
            return Route("gpu", gkey, "clock" if domain == "compute" else "mem_clock", "last")
        return None
    if m in ("gpu_throttle_active", "gpu_throttle_seconds_total"):
        reason = label("reason") or ""
        how = "max" if m == "gpu_throttle_active" else "frac"
        if reason == "hbm_thermal":
            return Route("gpu", gkey, "thr_hbm", how)
        if reason in THERMAL_THROTTLE_REASONS:
            return Route("gpu", gkey, "thr_thermal", how)
        if reason in POWER_THROTTLE_REASONS:
            return Route("gpu", gkey, "thr_power", how)
        return None
    if m in _COUNTERS:
        return Route("gpu", gkey, _COUNTERS[m], "sum")
    if m == "gpu_ecc_errors_total" and label("severity") == "uncorrectable":
        return Route("gpu", gkey, "ecc_uncorrectable", "sum")
    return _error_route(key, gkey)


def _error_route(key: SeriesKey, gkey: str) -> Route | None:
    """GPU error events by action class; the worst remap and health verdict per GPU."""
    code = error_code(key)
    if code is not None:
        scheme, number = code.split(":")
        return Route("gpu", gkey, ERROR_SIGNAL[lookup(scheme, number).action], "sum")
    if key.metric == "gpu_row_remap_failed":
        return Route("gpu", gkey, "remap_failed", "max")
    if key.metric == "gpu_health_status":
        return Route("gpu", gkey, "health", "max")
    return None


#: How samples of a signal falling in one cell of the grid combine.
SIGNAL_REDUCTION: dict[str, str] = {
    "mem_temp": "last", "hot_temp": "last", "power": "last", "power_limit": "last",
    "clock": "last", "mem_clock": "last", "bw": "mean", "util": "mean",
    "thr_hbm": "max", "thr_thermal": "max", "thr_power": "max",
    "pcie_replays": "sum", "pcie_recoveries": "sum", "fabric_errors": "sum",
    "ecc_uncorrectable": "sum", "err_fatal": "sum", "err_reset": "sum", "err_benign": "sum",
    "remap_failed": "max", "health": "max",
    "p50": "last", "p95": "last", "p99": "last", "res50": "last", "res95": "last",
    "res99": "last", "window_requests": "last", "requests": "sum",
    "up": "last", "sentinel": "sum",
}  # fmt: skip

#: Every metric a frame reads: what the runner asks the store to keep in memory.
WATCHED_METRICS: tuple[str, ...] = (
    *_GAUGES,
    *_COUNTERS,
    "gpu_hbm_stack_temperature_celsius",
    "gpu_clock_hertz",
    "gpu_throttle_active",
    "gpu_throttle_seconds_total",
    "gpu_ecc_errors_total",
    "gpu_error_events_total",
    "gpu_row_remap_failed",
    "gpu_health_status",
    "workload_latency_seconds",
    "workload_latency_resolution_seconds",
    "workload_window_requests",
    "workload_requests_total",
    "hbmwatch_target_up",
    "hbmwatch_scrape_dropped_total",
    *RAW_METRICS,
)

#: Every signal a frame can carry, in a fixed order (the builder's signal codes).
SIGNALS: tuple[str, ...] = (*SIGNAL_REDUCTION, "stack")
SIGNAL_CODE: dict[str, int] = {signal: i for i, signal in enumerate(SIGNALS)}
