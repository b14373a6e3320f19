"""A frame: new samples laid out on a time grid, one row per GPU, workload and target.

Detectors never see series ids or label sets: ``FrameBuilder`` routes each canonical series
to an entity row and a signal once (cached by series id), turns counters into increments
per step (across resets and 32/64-bit wraps, remembering each counter's last value between
frames), and scatters everything onto a grid of ``step_ms``.  A missing value is NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from hbmwatch.metrics import THERMAL_THROTTLE_REASONS
from hbmwatch.records import Finding, SeriesKey
from store.feed import SampleBlock

POWER_THROTTLE_REASONS = ("power", "power_brake", "board_limit")
MAX_STACKS = 8
WRAPS = (2.0**32, 2.0**64)

GPU_LABELS = ("cluster", "rack", "host", "gpu", "sku", "vendor")
WORKLOAD_LABELS = ("cluster", "rack", "host", "gpu", "partition", "service", "model", "phase")
TARGET_LABELS = ("cluster", "rack", "host", "target", "source")


class Route(NamedTuple):
    table: str  # gpu | wl | tgt
    key: str
    signal: str
    how: str  # last | mean | max | sum | frac
    slot: int = -1  # stack index for "stack"


@dataclass
class Entities:
    keys: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, labels: Mapping[str, str]) -> int:
        row = self.index.get(key)
        if row is None:
            row = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.labels.append(dict(labels))
        return row

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class Frame:
    """Signals on a grid: ``times_ms[i]`` is the start of step i, ``[t, t + step)``."""

    start_ms: int
    step_ms: int
    steps: int
    gpus: Entities
    workloads: Entities
    targets: Entities
    gpu: dict[str, np.ndarray]  # (G, T)
    stacks: np.ndarray  # (G, MAX_STACKS, T)
    wl: dict[str, np.ndarray]  # (W, T)
    tgt: dict[str, np.ndarray]  # (N, T)
    series: dict[tuple[str, str, str], str]  # (table, key, signal) -> a series' text
    resets: dict[str, int]  # GPU key -> counter resets seen in this frame
    link_errors: dict[str, dict[str, float]]  # GPU key -> link -> errors in this frame
    late: int = 0
    #: What earlier detectors computed for later ones (per GPU, (G, T)), this cycle only.
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    #: Findings open after the detectors that ran before, for correlation.
    open_findings: list[Finding] = field(default_factory=list)
    context: Any = None  # detectors.context.Context, set by the runner
    #: Each detector's score per entity and step (1.0 = at its threshold), for score-file.
    scores: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def times_ms(self) -> np.ndarray:
        return self.start_ms + self.step_ms * np.arange(self.steps, dtype=np.int64)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.step_ms * self.steps

    def g(self, name: str) -> np.ndarray:
        """A GPU signal, all NaN if no GPU reported it in this frame."""
        return self.gpu.get(name, np.full((len(self.gpus), self.steps), np.nan))

    def w(self, name: str) -> np.ndarray:
        return self.wl.get(name, np.full((len(self.workloads), self.steps), np.nan))

    def t(self, name: str) -> np.ndarray:
        return self.tgt.get(name, np.full((len(self.targets), self.steps), np.nan))

    def series_of(self, table: str, key: str, signal: str) -> str:
        """The text of the series behind a signal (rebuilt if this frame did not see it)."""
        found = self.series.get((table, key, signal))
        if found is not None:
            return found
        metric = SIGNAL_METRIC.get(signal, signal)
        if table == "gpu" and key.count("/") == 2:
            cluster, host, gpu = key.split("/")
            return f'{metric}{{cluster="{cluster}",host="{host}",gpu="{gpu}"}}'
        return f"{metric}{{{key}}}"


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
}


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
    return None


def counter_deltas(prev: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Increase from ``prev`` to ``values`` elementwise, and where a reset happened.

    A drop from the top half of a 32- or 64-bit range is a wrap; any other drop is a reset
    and the new value is the increase (as Prometheus' ``rate`` counts it).

    >>> d, r = counter_deltas(np.array([4294967000.0, 500.0, np.nan]), np.array([100.0, 20.0, 7.0]))
    >>> d.tolist(), r.tolist()
    ([396.0, 20.0, nan], [False, True, False])
    """
    delta = values - prev
    drop = delta < 0
    wrapped = np.full(values.shape, np.nan)
    for span in WRAPS:
        fits = drop & np.isnan(wrapped) & (prev >= span / 2) & (prev < span)
        wrapped = np.where(fits, span - prev + values, wrapped)
    is_wrap = ~np.isnan(wrapped) & (wrapped < 2.0**30)
    reset = drop & ~is_wrap
    delta = np.where(is_wrap, wrapped, np.where(reset, values, delta))
    return delta, reset


class FrameBuilder:
    """Routes series to rows and keeps each counter's last value between frames."""

    def __init__(self, key_of: Callable[[int], SeriesKey | None]) -> None:
        self.key_of = key_of
        self._routes: dict[int, Route | None] = {}
        self._labels: dict[int, SeriesKey] = {}
        self.last_counter: dict[int, float] = {}
        self.last_counter_ms: dict[int, int] = {}

    def _route(self, sid: int) -> Route | None:
        if sid not in self._routes:
            key = self.key_of(sid)
            self._routes[sid] = route(key) if key is not None else None
            if key is not None:
                self._labels[sid] = key
        return self._routes[sid]

    def build(self, block: SampleBlock, start_ms: int, end_ms: int, step_ms: int) -> Frame:
        steps = max(0, (end_ms - start_ms) // step_ms)
        frame = Frame(
            start_ms, step_ms, steps, Entities(), Entities(), Entities(), {},
            np.zeros((0, MAX_STACKS, steps)), {}, {}, {}, {}, {},
        )  # fmt: skip
        if len(block) == 0 or steps == 0:
            return frame
        order = np.lexsort((block.timestamps_ms, block.series_ids))
        sids = block.series_ids[order]
        ts = block.timestamps_ms[order]
        vals = block.values[order]
        starts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
        ends = np.r_[starts[1:], len(sids)]
        frame.late = int((ts < start_ms).sum())
        parts: dict[tuple[str, str], list[tuple[int, np.ndarray, np.ndarray, int]]] = {}
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            sid = int(sids[a])
            r = self._route(sid)
            if r is None:
                continue
            t, v = ts[a:b], vals[a:b]
            if r.how in ("sum", "frac"):
                # Each counter sample is differenced once: samples of later frames wait
                # (the runner hands them back), ones already used are not used again.
                fresh = (t < end_ms) & (t > self.last_counter_ms.get(sid, -1))
                t, v = t[fresh], v[fresh]
                if len(t) == 0:
                    continue
                v = self._increments(sid, r, t, v, frame)
            keep = (t >= start_ms) & (t < end_ms) & ~np.isnan(v)
            if not keep.any():
                continue
            row = self._row(frame, r, self._labels[sid])
            cols = (t[keep] - start_ms) // step_ms
            parts.setdefault((r.table, r.signal), []).append((row, cols, v[keep], r.slot))
            frame.series.setdefault((r.table, r.key, r.signal), self._labels[sid].text)
        self._scatter(frame, parts)
        return frame

    def _increments(
        self, sid: int, r: Route, t: np.ndarray, v: np.ndarray, frame: Frame
    ) -> np.ndarray:
        prev = np.r_[self.last_counter.get(sid, np.nan), v[:-1]]
        delta, reset = counter_deltas(prev, v)
        self.last_counter[sid] = float(v[-1])
        self.last_counter_ms[sid] = int(t[-1])
        if reset.any() and r.table == "gpu":
            frame.resets[r.key] = frame.resets.get(r.key, 0) + int(reset.sum())
        if r.signal == "fabric_errors":
            link = self._labels[sid].label("link") or "all"
            total = float(np.nansum(delta[t >= frame.start_ms]))
            if total > 0:
                errs = frame.link_errors.setdefault(r.key, {})
                errs[link] = errs.get(link, 0.0) + total
        if r.how == "frac":  # seconds of throttling per step -> fraction of the step
            dt = np.diff(np.r_[t[0] - frame.step_ms, t]) / 1000.0
            delta = np.clip(delta / np.fmax(dt, 1e-3), 0.0, 1.0)
        return delta

    @staticmethod
    def _row(frame: Frame, r: Route, key: SeriesKey) -> int:
        labels = dict(key.labels)
        if r.table == "gpu":
            return frame.gpus.add(r.key, {k: labels[k] for k in GPU_LABELS if k in labels})
        if r.table == "wl":
            return frame.workloads.add(
                r.key, {k: labels[k] for k in WORKLOAD_LABELS if k in labels}
            )
        return frame.targets.add(r.key, {k: labels[k] for k in TARGET_LABELS if k in labels})

    @staticmethod
    def _scatter(
        frame: Frame, parts: dict[tuple[str, str], list[tuple[int, np.ndarray, np.ndarray, int]]]
    ) -> None:
        sizes = {"gpu": len(frame.gpus), "wl": len(frame.workloads), "tgt": len(frame.targets)}
        out = {"gpu": frame.gpu, "wl": frame.wl, "tgt": frame.tgt}
        frame.stacks = np.full((sizes["gpu"], MAX_STACKS, frame.steps), np.nan)
        for (table, signal), items in parts.items():
            rows = np.concatenate([np.full(len(c), row) for row, c, _, _ in items])
            cols = np.concatenate([c for _, c, _, _ in items])
            values = np.concatenate([v for _, _, v, _ in items])
            if signal == "stack":
                slots = np.concatenate([np.full(len(c), s) for _, c, _, s in items])
                frame.stacks[rows, slots, cols] = values
                continue
            how = _HOW[signal]
            shape = (sizes[table], frame.steps)
            if how == "last":
                arr = np.full(shape, np.nan)
                arr[rows, cols] = values
            elif how == "max":
                arr = np.full(shape, -np.inf)
                np.maximum.at(arr, (rows, cols), values)
                arr[np.isinf(arr)] = np.nan
            else:  # mean, or sum of increments
                total = np.zeros(shape)
                count = np.zeros(shape)
                np.add.at(total, (rows, cols), values)
                np.add.at(count, (rows, cols), 1.0)
                with np.errstate(invalid="ignore"):
                    arr = total / count if how == "mean" else np.where(count > 0, total, np.nan)
            out[table][signal] = arr


_HOW: dict[str, str] = {
    "mem_temp": "last", "hot_temp": "last", "power": "last", "power_limit": "last",
    "clock": "last", "mem_clock": "last", "bw": "mean", "util": "mean",
    "thr_hbm": "max", "thr_thermal": "max", "thr_power": "max",
    "pcie_replays": "sum", "pcie_recoveries": "sum", "fabric_errors": "sum",
    "ecc_uncorrectable": "sum",
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
    "workload_latency_seconds",
    "workload_latency_resolution_seconds",
    "workload_window_requests",
    "workload_requests_total",
    "hbmwatch_target_up",
    "hbmwatch_scrape_dropped_total",
)
