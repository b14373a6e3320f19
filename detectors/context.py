"""The last minutes of every GPU's and workload's signals, coarsened, for correlation.

Root-cause ranking looks back from a regression's start for what changed first on the same
GPU, node and rack.  Reading those windows back from the store for every regression would
be I/O inside a detector, so the runner keeps this ring instead: each signal at
``resolution_s`` (the mean of the frame's steps in each slot) for ``horizon_s``.  It is
volatile by design: after a restart it refills within the horizon, and the baselines that
matter live in the detectors' persisted state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hbmwatch.detectors.base import EntityTable, quiet_nan
from hbmwatch.detectors.frame import Frame

GPU_SIGNALS = (
    "mem_temp", "hot_temp", "power", "power_limit", "clock", "bw", "util",
    "thr_thermal", "thr_hbm", "thr_power", "pcie_replays", "fabric_errors",
)  # fmt: skip
DERIVED_GPU = ("thermal_rise", "bw_dev")
WORKLOAD_SIGNALS = ("lat_excess", "requests")


class Context:
    def __init__(self, *, resolution_s: float = 5.0, horizon_s: float = 900.0) -> None:
        self.res_ms = int(resolution_s * 1000)
        self.slots = int(horizon_s / resolution_s)
        width = {s: self.slots for s in GPU_SIGNALS + DERIVED_GPU}
        self.gpus = EntityTable({s: np.nan for s in width}, width)
        wl_width = {s: self.slots for s in WORKLOAD_SIGNALS}
        self.workloads = EntityTable({s: np.nan for s in wl_width}, wl_width)
        self.slot_time = np.full(self.slots, -1, dtype=np.int64)
        self.gpu_labels: dict[str, dict[str, str]] = {}
        self.workload_labels: dict[str, dict[str, str]] = {}

    def _slots(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """Each step's slot start, and the distinct slots the frame touches."""
        starts = frame.times_ms // self.res_ms * self.res_ms
        return starts, np.unique(starts)

    def append(self, frame: Frame) -> None:
        """Fold a frame's GPU signals (raw and derived) into the ring."""
        if frame.steps == 0 or len(frame.gpus) == 0:
            return
        rows = self.gpus.rows(frame.gpus.keys)
        for key, labels in zip(frame.gpus.keys, frame.gpus.labels, strict=True):
            self.gpu_labels.setdefault(key, labels)
        for name in GPU_SIGNALS:
            self._fold(self.gpus, rows, name, frame.gpu.get(name), frame)
        for name in DERIVED_GPU:
            self._fold(self.gpus, rows, name, frame.derived.get(name), frame)

    def append_workloads(self, frame: Frame, signals: dict[str, np.ndarray]) -> None:
        if frame.steps == 0 or len(frame.workloads) == 0:
            return
        rows = self.workloads.rows(frame.workloads.keys)
        for key, labels in zip(frame.workloads.keys, frame.workloads.labels, strict=True):
            self.workload_labels.setdefault(key, labels)
        for name in WORKLOAD_SIGNALS:
            self._fold(self.workloads, rows, name, signals.get(name), frame)

    def _fold(
        self,
        table: EntityTable,
        rows: np.ndarray,
        name: str,
        values: np.ndarray | None,
        frame: Frame,
    ) -> None:
        starts, slots = self._slots(frame)
        for slot_start in slots.tolist():
            col = (slot_start // self.res_ms) % self.slots
            if self.slot_time[col] != slot_start:
                self.slot_time[col] = slot_start
                self.gpus.arrays.update(
                    {s: _clear(self.gpus.arrays[s], col) for s in self.gpus.arrays}
                )
                self.workloads.arrays.update(
                    {s: _clear(self.workloads.arrays[s], col) for s in self.workloads.arrays}
                )
            if values is None:
                continue
            in_slot = starts == slot_start
            mean = quiet_nan(np.nanmean, values[:, in_slot], axis=1)
            old = table[name][rows, col]
            table[name][rows, col] = np.where(np.isnan(mean), old, mean)

    def window(
        self, table: str, keys: Sequence[str], name: str, since_ms: int, until_ms: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slot times and values (keys x slots, time-ordered) of one signal in a span."""
        ent = self.gpus if table == "gpu" else self.workloads
        cols = np.flatnonzero((self.slot_time >= since_ms) & (self.slot_time < until_ms))
        cols = cols[np.argsort(self.slot_time[cols])]
        known = [k for k in keys if k in ent.index]
        if not known:
            return self.slot_time[cols], np.full((0, len(cols)), np.nan)
        rows = ent.rows(known)
        return self.slot_time[cols], ent[name][rows][:, cols]


def _clear(a: np.ndarray, col: int) -> np.ndarray:
    a[:, col] = np.nan
    return a
