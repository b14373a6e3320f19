"""Data quality of a GPU's own sensors: stuck values and dropouts.

Why apart from the detector (``detectors/quality.py``): both checks judge one GPU's
telemetry against the rest of that GPU's telemetry (a temperature flat while the load
moves, a signal missing while the others arrive), with their own per-sensor clocks; the
detector steps them beside the target checks and owns the state and the gate.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode, quiet_nan
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.records import Evidence, Severity
from hbmwatch.taxonomy import Cause

GPU_ENTITY = ("cluster", "rack", "host", "gpu", "sku")
TEMPS = ("mem_temp", "hot_temp", *(f"stack{i}" for i in range(MAX_STACKS)))
GAP_SIGNALS = ("mem_temp", "hot_temp", "power", "clock", "mem_clock", "bw", "util")
GAPS = (*GAP_SIGNALS, *(f"stack{i}" for i in range(MAX_STACKS)))
#: The longest interval between a sensor's samples that the stuck check takes for its
#: exporter's refresh (dcgm-exporter's default is 30 s) rather than for an outage.
MAX_REFRESH_MS = 60_000
#: A sensor sampled that rarely must also hold its value over this many samples: a steady
#: whole degree read every 30 s repeats by chance for 8 minutes (seen in the simulator), not
#: 120 times in a row at 1 s.  At 30 s a stuck sensor is found after 12 minutes.
STUCK_MIN_SAMPLES = 24
#: Samples further apart than this are sparse: a steady whole-degree reading then repeats by
#: chance, so the GPU's other temperature must also have moved by ``PARTNER_MOVE_C``.
SPARSE_MS = 5_000
PARTNER_MOVE_C = 2.0
#: Each temperature's partner (its column in ``TEMPS``): memory <-> hotspot, stacks -> hotspot.
PARTNER = np.array([1, 0, *([1] * MAX_STACKS)])


class CheckReport(NamedTuple):
    """What one check says in its finding; the detector adds the kind, times and cause list."""

    evidence: list[Evidence]
    summary: str
    entity: dict[str, str]
    severity: Severity = Severity.WARNING
    cause: Cause = Cause.SENSOR


class SensorChecks:
    """The ``stuck`` and ``gap`` checks of ``DataQuality``, as a mixin over its settings and
    tables (``stuck_``, ``seen_``, ``gpus_``)."""

    stuck_s: float
    power_move_frac: float
    bw_move: float
    gap_s: float
    stuck_: EntityTable
    seen_: EntityTable
    gpus_: EntityTable

    def _stuck_step(
        self,
        s: dict[str, np.ndarray],
        x: np.ndarray,
        power: np.ndarray,
        bw: np.ndarray,
        scale: np.ndarray,
        t_ms: int,
    ) -> np.ndarray:
        k = x.shape[1]
        o = x[:, PARTNER].ravel()
        x = x.ravel()
        p, b = np.repeat(power, k), np.repeat(bw, k)
        known = ~np.isnan(x)
        # A value seen again after a gap (target down, dropout) restarts the clock: only time
        # watched counts as time unchanged.  NaN never equals: the first value counts too.
        # A gap is longer than ``gap_s`` and than 1.5x the interval the sensor's samples
        # came at last (an exporter refreshing every 30 s is watched, not gone).
        waited = t_ms - s["seen_ms_"]
        unseen = ~(waited <= np.fmax(self.gap_s * 1000, 1.5 * s["every_ms_"]))
        changed = known & ((x != s["value_"]) | unseen)
        with np.errstate(invalid="ignore"):
            s["every_ms_"] = np.where(known & (waited <= MAX_REFRESH_MS), waited, s["every_ms_"])
        s["seen_ms_"] = np.where(known, t_ms, s["seen_ms_"])
        s["value_"] = np.where(changed, x, s["value_"])
        s["since_ms_"] = np.where(changed, t_ms, s["since_ms_"])
        for name, now, fn in (("pmin_", p, np.fmin), ("pmax_", p, np.fmax),
                              ("bmin_", b, np.fmin), ("bmax_", b, np.fmax),
                              ("omin_", o, np.fmin), ("omax_", o, np.fmax)):  # fmt: skip
            s[name] = np.where(changed, now, fn(s[name], now))
        with np.errstate(invalid="ignore"):
            moved = (s["pmax_"] - s["pmin_"] >= self.power_move_frac * scale) | (
                s["bmax_"] - s["bmin_"] >= self.bw_move
            )
            sparse = s["every_ms_"] > SPARSE_MS
            moved &= ~sparse | (s["omax_"] - s["omin_"] >= PARTNER_MOVE_C)
        held_s = (t_ms - s["since_ms_"]) / 1000.0
        need_s = self._stuck_need_s(s["every_ms_"])
        return np.where(known, np.where(moved, held_s / need_s, 0.0), np.nan)

    def _stuck_need_s(self, every_ms: np.ndarray) -> np.ndarray:
        """How long a value must hold: ``stuck_s``, or ``STUCK_MIN_SAMPLES`` samples apart."""
        return np.fmax(self.stuck_s, STUCK_MIN_SAMPLES * every_ms / 1000.0)

    def _gap_step(self, s: dict[str, np.ndarray], x: np.ndarray, t_ms: int) -> np.ndarray:
        """Scored only at steps where the GPU delivered something else (it is alive)."""
        k = x.shape[1]
        known = ~np.isnan(x)
        alive = np.repeat(known.any(axis=1), k)
        last = s["last_ms_"] = np.where(known.ravel(), t_ms, s["last_ms_"])
        missing = np.where(alive & ~np.isnan(last), (t_ms - last) / 1000.0 / self.gap_s, np.nan)
        return quiet_nan(np.nanmax, missing.reshape(-1, k), axis=1)  # one finding per GPU

    def _missing(self, gkey: str, t_ms: int) -> list[tuple[str, float]]:
        """The GPU's signals missing for ``gap_s`` or more now, with when each was last seen."""
        out = []
        for sig in GAPS:
            row = self.seen_.index.get(f"{gkey}|{sig}")
            last = float(self.seen_["last_ms_"][row]) if row is not None else np.nan
            if t_ms - last >= self.gap_s * 1000:
                out.append((sig, last))
        return out

    def _stuck_report(
        self, frame: Frame, ekey: str, sub: str, ep: Episode, t_ms: int, end: int | None
    ) -> CheckReport:
        start = ep.started_ms
        row = self.stuck_.index[f"{ekey}|{sub}"]
        s = self.stuck_
        held = (t_ms - start) / 1000.0  # until now, or until the value changed
        value = float(ep.extra.setdefault("value", float(s["value_"][row])))
        scale = float(self.gpus_["power_scale_"][self.gpus_.index[ekey]])
        evidence = [
            Evidence(sensor_series(frame, "gpu", ekey, sub), "unchanged_for_s", held,
                     float(self._stuck_need_s(s["every_ms_"][row])), start, t_ms,
                     note=f"held at {value:g}"),
            Evidence(frame.series_of("gpu", ekey, "power"), "power_range_w",
                     _f(s["pmax_"][row] - s["pmin_"][row]),
                     _f(self.power_move_frac * scale), start, t_ms),
            Evidence(frame.series_of("gpu", ekey, "bw"), "bandwidth_range_ratio",
                     _f(s["bmax_"][row] - s["bmin_"][row]), self.bw_move, start, t_ms),
        ]  # fmt: skip
        verb = "was stuck" if end is not None else "stuck"
        summary = f"{sub} {verb} at {value:g} for {held:.0f} s while the GPU's load moved"
        return CheckReport(evidence, summary, {**gpu_entity(frame, ekey), "signal": sub})

    def _gap_report(
        self, frame: Frame, ekey: str, ep: Episode, t_ms: int, end: int | None
    ) -> CheckReport:
        missing = self._missing(ekey, t_ms)
        if missing:  # at the close the signals are back: keep what was last missing
            ep.extra["missing"] = {sig: [last, t_ms] for sig, last in missing}
        gone = ep.extra.get("missing", {})
        if end is not None:  # all back now: each was missing until this step
            gone = {sig: [last, t_ms] for sig, (last, _) in gone.items()}
        evidence = [
            Evidence(sensor_series(frame, "gpu", ekey, sig), "missing_for_s", (to - last) / 1000,
                     self.gap_s, int(last), int(to), note="the GPU's other signals arrive")
            for sig, (last, to) in sorted(gone.items())
        ]  # fmt: skip
        names = ", ".join(sorted(gone)) or "signals"
        took = (t_ms - ep.started_ms) / 1000
        summary = (
            f"{names} missing for {took:.0f} s while the GPU still reports"
            if end is None
            else f"{names} back after {took:.0f} s missing"
        )
        return CheckReport(evidence, summary, gpu_entity(frame, ekey))


def gpu_entity(frame: Frame, gkey: str) -> dict[str, str]:
    row = frame.gpus.index.get(gkey)
    labels = frame.gpus.labels[row] if row is not None else {}
    out = {k: labels[k] for k in GPU_ENTITY if labels.get(k)}
    if not out:  # the key is cluster/host/gpu
        cluster, host, gpu = ([*gkey.split("/"), "", ""])[:3]
        out = {k: v for k, v in (("cluster", cluster), ("host", host), ("gpu", gpu)) if v}
    return out


def sensor_series(frame: Frame, table: str, key: str, signal: str) -> str:
    """A signal's series text; a stack's is the memory temperature's with its ``stack``."""
    if not signal.startswith("stack"):
        return frame.series_of(table, key, signal)
    base = frame.series_of(table, key, "mem_temp")
    labels = base.partition("{")[2]
    name = "gpu_hbm_stack_temperature_celsius"
    return f'{name}{{{labels[:-1]},stack="{signal[5:]}"}}' if labels else f"{name}{{{key}}}"


def sensor_values(frame: Frame, names: tuple[str, ...]) -> np.ndarray:
    """(G, len(names), T): GPU signals, then the eight stacks."""
    plain = [frame.g(n)[:, None, :] for n in names if not n.startswith("stack")]
    return np.concatenate([*plain, frame.stacks], axis=1)


def _f(value: float) -> float:
    return float(np.nan_to_num(value))
