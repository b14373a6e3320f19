"""What the running service knows about itself, shared by readiness and ``/metrics``.

The service writes it (the collector's last round, each detection cycle's timing and a
snapshot of the newest derived signals); the API only reads it.  A process that serves the
API without a collector or detectors (tests, an app over a store alone) leaves the
parts it does not run at None, and readiness reports them as not running rather than failing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hbmwatch.skus import lookup


@dataclass(frozen=True, slots=True)
class LabelledValue:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The newest per-GPU and per-workload derived signals of one detection cycle."""

    frame_end_ms: int
    thermal_margin: list[LabelledValue] = field(default_factory=list)
    anomaly_score: list[LabelledValue] = field(default_factory=list)
    latency_p99: list[LabelledValue] = field(default_factory=list)


@dataclass
class ServiceStatus:
    clock: Callable[[], float] = time.time
    started_at: float = field(default_factory=time.time)
    #: The collector's ``last_round_ms`` getter; None when no collector runs in this process.
    collector_last_round_ms: Callable[[], int] | None = None
    collector_interval_seconds: float = 1.0
    detection_interval_seconds: float | None = None  # None: no detectors in this process
    last_cycle_at: float | None = None
    last_cycle_seconds: float | None = None
    snapshot: FleetSnapshot | None = None

    def record_cycle(self, seconds: float, snapshot: FleetSnapshot | None) -> None:
        self.last_cycle_at = self.clock()
        self.last_cycle_seconds = seconds
        if snapshot is not None:
            self.snapshot = snapshot

    def detection_lag_seconds(self) -> float | None:
        """How far the newest analysed frame trails now."""
        if self.snapshot is None:
            return None
        return max(0.0, self.clock() - self.snapshot.frame_end_ms / 1000)


_GPU_LABELS = ("cluster", "rack", "host", "gpu")
_SENSORS = (
    ("memory", "mem_temp", "memory_slowdown_c"),
    ("hotspot", "hot_temp", "hotspot_slowdown_c"),
)
_WL_LABELS = ("cluster", "service", "model", "phase")


def _last_finite(values: np.ndarray) -> np.ndarray:
    """The newest finite value of each row (NaN where a row has none)."""
    ok = np.isfinite(values)
    idx = values.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
    out = values[np.arange(len(values)), idx]
    return np.where(ok.any(axis=1), out, np.nan)


def snapshot_from_frame(frame: Any) -> FleetSnapshot:
    """Thermal margins, detector scores and p99s at the end of a detection frame."""
    snap = FleetSnapshot(frame.end_ms)
    gpu_labels = [{k: lab.get(k, "") for k in _GPU_LABELS} for lab in frame.gpus.labels]
    skus = [lookup(lab.get("sku", "")) if lab.get("sku") else None for lab in frame.gpus.labels]
    if len(gpu_labels) and frame.steps:
        for sensor, signal, limit_field in _SENSORS:
            last = _last_finite(frame.g(signal))
            for row, value in enumerate(last.tolist()):
                sku = skus[row]
                if sku is None or not math.isfinite(value):
                    continue
                labels = {**gpu_labels[row], "sku": sku.name, "sensor": sensor}
                snap.thermal_margin.append(LabelledValue(labels, getattr(sku, limit_field) - value))
        for detector, scores in frame.scores.items():
            if scores.shape[0] != len(gpu_labels) or detector == "series":  # user series' rows
                continue
            for row, value in enumerate(_last_finite(scores).tolist()):
                if math.isfinite(value):
                    labels = {**gpu_labels[row], "detector": detector}
                    snap.anomaly_score.append(LabelledValue(labels, value))
    if len(frame.workloads) and frame.steps:
        for row, value in enumerate(_last_finite(frame.w("p99")).tolist()):
            if math.isfinite(value):
                lab = frame.workloads.labels[row]
                labels = {k: lab.get(k, "") for k in _WL_LABELS}
                snap.latency_p99.append(LabelledValue(labels, value))
    return snap
