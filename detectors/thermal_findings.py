"""Per-GPU thermal findings: the worst sensor, its evidence, and the episode's open and close.

Why a module of its own: what a finding says about one GPU (which sensor, by how much
over which threshold, how fast it rises) is read off the step loop's trace only when a
GPU opens, closes or is re-stated; the loop itself (``detectors/thermal.py``) never
needs it.  The cause comes from ``detectors/thermal_racks.py`` (one GPU, or its rack).
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import numpy as np

from hbmwatch.detectors.base import Episode, Hysteresis, make_finding
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import TrendBaseline
from hbmwatch.detectors.thermal_layout import SENSORS, Trace
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.taxonomy import FindingKind


class GpuFindings:
    """Per-GPU findings of ``ThermalExcursions``, as a mixin over its thresholds, its
    ``gpu_open_`` gate and its ``rate_`` baseline."""

    name: str
    rise_enter_c: float
    peer_enter_c: float
    stack_enter_c: float
    margin_c: float
    rate_: TrendBaseline
    gpu_open_: Hysteresis

    if TYPE_CHECKING:

        def _peer_enter(self) -> np.ndarray: ...

        def _gpu_causes(
            self, frame: Frame, row: int, worst: int, rise: np.ndarray, excess: np.ndarray
        ) -> list[RankedCause]: ...

    def _step_gpus(
        self,
        frame: Frame,
        i: int,
        t_ms: int,
        opened: list[str],
        closed: list[str],
        trace: Trace,
    ) -> list[Finding]:
        """Findings for the GPUs that opened and closed at step ``i``."""
        out = []
        for key in opened:
            row = frame.gpus.index[key]
            start = int(self.gpu_open_.over_since(key))
            self.gpu_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._gpu_finding(frame, row, i, t_ms, trace))
        for key in closed:
            row = frame.gpus.index[key]
            out.append(self._gpu_finding(frame, row, i, t_ms, trace, end=t_ms))
            self.gpu_open_.episodes.pop(key, None)
        return out

    def _gpu_finding(
        self,
        frame: Frame,
        row: int,
        i: int,
        t_ms: int,
        trace: Trace,
        end: int | None = None,
    ) -> Finding:
        key = frame.gpus.keys[row]
        labels = frame.gpus.labels[row]
        ep = self.gpu_open_.episodes.get(key) or Episode(t_ms, t_ms)
        xs, rs, es = trace.x[row, :, i], trace.rise[row, :, i], trace.excess[row, :, i]
        limits = trace.limits
        worst = self._worst_sensor(xs, rs, es, limits[row])
        sensor = SENSORS[worst]
        ep.peak = max(ep.peak, _f(xs[worst]))
        rate_row = self.rate_.rows([key])[0]
        rate = float(self.rate_.table["trend_"][rate_row]) * 60.0
        headroom = float(limits[row, worst] - xs[worst])
        text = self._sensor_series(frame, key, sensor)
        evidence = [
            Evidence(text, "temperature_c", float(xs[worst]), None, ep.started_ms, t_ms),
            Evidence(text, "rise_over_load_baseline_c", _f(rs[worst]), self.rise_enter_c,
                     ep.started_ms, t_ms, note=f"rising {rate:+.1f} C/min"),
            Evidence(text, "excess_over_peers_c" if worst < 2 else "excess_over_sibling_stacks_c",
                     _f(es[worst]), self.peer_enter_c if worst < 2 else self.stack_enter_c),
            Evidence(text, "headroom_to_slowdown_c", headroom, self.margin_c),
        ]  # fmt: skip
        causes = self._gpu_causes(frame, row, worst, rs, es)
        severity = Severity.CRITICAL if headroom <= 0 else Severity.WARNING
        summary = (
            f"{sensor} at {xs[worst]:.0f} C: {_f(rs[worst]):+.1f} C over its baseline for its "
            f"load, {rate:+.1f} C/min, {headroom:.0f} C below the slowdown limit"
        )
        entity = {k: labels[k] for k in ("cluster", "rack", "host", "gpu", "sku") if k in labels}
        return make_finding(
            kind=FindingKind.THERMAL_EXCURSION, detector=self.name, entity=entity,
            severity=severity, summary=summary, started_ms=ep.started_ms,
            raised_ms=ep.raised_ms, updated_ms=t_ms, ended_ms=end, evidence=evidence,
            causes=causes,
        )  # fmt: skip

    def _worst_sensor(
        self, x: np.ndarray, rise: np.ndarray, excess: np.ndarray, limits: np.ndarray
    ) -> int:
        """The sensor furthest past any of its thresholds, as ``_score`` weighs them."""
        with np.errstate(all="ignore"):
            part = np.fmax(rise / self.rise_enter_c, excess / self._peer_enter())
            part = np.fmax(part, (x - (limits - self.margin_c)) / self.margin_c + 1.0)
        per_sensor = np.where(np.isnan(x), -np.inf, np.nan_to_num(part, nan=-np.inf))
        return int(np.argmax(per_sensor)) if np.isfinite(per_sensor).any() else 0

    def _sensor_series(self, frame: Frame, key: str, sensor: str) -> str:
        if sensor == "memory":
            return frame.series_of("gpu", key, "mem_temp")
        if sensor == "hotspot":
            return frame.series_of("gpu", key, "hot_temp")
        base = frame.series_of("gpu", key, "mem_temp")
        name = "gpu_hbm_stack_temperature_celsius"
        labels = base.partition("{")[2]
        return f'{name}{{{labels[:-1]},stack="{sensor[5:]}"}}' if labels else name


def _f(value: float) -> float:
    """``float(np.nan_to_num(value))`` for one number, without numpy's per-call cost."""
    v = float(value)
    if math.isnan(v):
        return 0.0
    return math.copysign(sys.float_info.max, v) if math.isinf(v) else v
