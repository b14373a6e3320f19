"""Thermal excursions: memory, per-stack and hotspot temperatures, four ways.

For every GPU, each sensor (memory, hotspot, and each HBM stack where the source has them)
is compared:

1. **against the SKU's limit**: within ``margin_c`` of the slowdown temperature;
2. **against its own baseline for its load**: a robust level-and-trend baseline, minus
   what the load explains (a per-sensor regression of the deviation on the deviation of
   the GPU's memory bandwidth, or of its power for the hotspot, learned online), so a busy
   hour is not an excursion and a co-tenant's copy traffic is not either;
3. **against its peers**: the gap to the median GPU of the same SKU in the same rack, less
   the gap it usually has; and each stack against its sibling stacks the same way;
4. **rack-wide**: the mean load-adjusted rise of a rack's GPUs, which averages away the
   per-GPU noise and so catches coolant loss and room heat minutes before any one GPU
   crosses a threshold.  Which racks rise together decides the cause: one rack, ``cooling``;
   most racks of a cluster, ``ambient``; one GPU or one stack, ``thermal``.

A GPU seen for the first time is judged against its SKU and its peers while its own
baselines warm: the SKU's limit applies from the first sample; the gap to peers / sibling
stacks counts before its usual gap is learned once it is twice the threshold (a stack 10 C
over its siblings is not normal for any SKU); a load above any the GPU has been seen at is
explained with a prior slope (``MEMORY_C_PER_BANDWIDTH``, ``HOTSPOT_C_PER_POWER``) until
its own is learned; and while the own baseline is young (``young_s``) a rise over it alone
is no excursion more than ``young_margin_c`` under the slowdown limit, because a package
still soaking up heat, or a load the baseline never saw, looks like a rise (on a real H200
a hotspot 46 C under its limit was reported 5 s after the warm-up ended).

Rates of rise are reported with each finding.  Hysteresis (enter at 1, leave under 0.5 of
the thresholds) and minimum durations keep one noisy sample from opening or closing one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from detectors.base import (
    EntityTable,
    Episode,
    Hysteresis,
    SparseGate,
    latest,
    make_finding,
    nanmedian,
    quiet_nan,
)
from detectors.frame import Frame
from detectors.scorers import TrendBaseline, decay, group_median_columns
from detectors.signals import MAX_STACKS
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.skus import Sku, lookup
from hbmwatch.taxonomy import Cause, FindingKind

SENSORS = ("memory", "hotspot", *(f"stack{i}" for i in range(MAX_STACKS)))
N_SENSORS = len(SENSORS)
DEFAULT_LIMITS = (95.0, 89.0)  # memory, hotspot: the strictest SKU's when one is unknown
#: What a load the GPU was never seen at explains, until its own slope is learned: on the
#: real H200 capture (docs/detection.md) memory warmed 20 C at 0.88 of its bandwidth and the
#: hotspot 24 C at +0.75 of its power limit; the priors sit a little under both.
MEMORY_C_PER_BANDWIDTH = 20.0
HOTSPOT_C_PER_POWER = 30.0
UNSEEN_LOAD = 0.2  # a load this far over its baseline (bandwidth or power share) is "new"


class ThermalExcursions:
    """Per-GPU and rack-wide thermal excursions with their likely cause.

    >>> import numpy as np
    >>> from detectors.frame import Entities, Frame
    >>> det = ThermalExcursions(warmup_s=30, min_on_s=3)
    >>> def frame(t0, temps):
    ...     gpus = Entities()
    ...     gpus.add("c/h/0", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0", "sku": "H200"})
    ...     stacks = np.full((1, 8, len(temps)), np.nan)
    ...     f = Frame(t0, 1000, len(temps), gpus, Entities(), Entities(), {}, stacks,
    ...               {}, {}, {}, {}, {})
    ...     f.gpu["mem_temp"] = np.array([temps], dtype=float)
    ...     f.gpu["bw"] = np.full((1, len(temps)), 0.5)
    ...     return f
    >>> rng = np.random.default_rng(0)
    >>> det.update(frame(0, 60 + rng.normal(0, 0.4, 120).round()))
    []
    >>> [f.summary.split(":")[0] for f in det.update(frame(120_000, [75.0] * 10))]
    ['memory at 75 C']
    """

    name = "thermal"

    def __init__(
        self,
        *,
        rise_enter_c: float = 6.0,
        stack_enter_c: float = 5.0,
        peer_enter_c: float = 8.0,
        margin_c: float = 5.0,
        rack_enter_c: float = 1.0,
        rack_fraction: float = 0.75,
        rack_min_gpus: int = 4,
        min_on_s: float = 5.0,
        min_off_s: float = 60.0,
        warmup_s: float = 180.0,
        young_s: float = 360.0,
        young_margin_c: float = 30.0,
        level_half_life_s: float = 1200.0,
        offset_half_life_s: float = 6 * 3600.0,
        rack_half_life_s: float = 8.0,
    ) -> None:
        self.rise_enter_c = rise_enter_c
        self.stack_enter_c = stack_enter_c
        self.peer_enter_c = peer_enter_c
        self.margin_c = margin_c
        self.rack_enter_c = rack_enter_c
        self.rack_fraction = rack_fraction
        self.rack_min_gpus = rack_min_gpus
        self.min_on_s = min_on_s
        self.min_off_s = min_off_s
        self.warmup_s = warmup_s
        self.young_s = young_s
        self.young_margin_c = young_margin_c
        self.level_half_life_s = level_half_life_s
        self.offset_half_life_s = offset_half_life_s
        self.rack_half_life_s = rack_half_life_s
        self._init_state()

    def _init_state(self) -> None:
        self.temps_ = TrendBaseline(
            level_half_life_s=self.level_half_life_s, min_scale=0.5, warmup_s=self.warmup_s,
            warm_half_life_s=self.warmup_s / 8,
        )  # fmt: skip
        self.drivers_ = TrendBaseline(
            level_half_life_s=self.level_half_life_s, min_scale=0.01, warmup_s=self.warmup_s
        )
        self.rate_ = TrendBaseline(
            level_half_life_s=5.0, trend_half_life_s=20.0, min_scale=0.5, warmup_s=0.0
        )
        # Per sensor: load regression moments and the usual gap to peers / sibling stacks.
        self.sensors_ = EntityTable({"sxy_": 0.0, "sxx_": 0.0, "gap_": np.nan, "gap_seen_": 0.0})
        self.racks_ = EntityTable({"rise_": 0.0, "frac_": 0.0, "last_ms_": np.nan})
        self.gpu_open_ = Hysteresis(
            enter=1.0, exit=0.5, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )
        self.rack_open_ = Hysteresis(
            enter=1.0, exit=0.4, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )
        self._layout: _Layout | None = None  # rows into the tables above: reset with them

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        lay = self._layout_for(frame)
        x = self._sensor_values(frame)  # (G, S, T)
        inputs = _Inputs.of(frame, lay, x, self.margin_c)
        shape = (frame.steps, n, N_SENSORS)
        rise, excess = np.full(shape, np.nan), np.full(shape, np.nan)
        scores = np.full((frame.steps, n), np.nan)
        bw_dev = np.full((frame.steps, n), np.nan)
        local = _Locals(self, lay, inputs.live)
        peer_enter = self._peer_enter()
        gate = SparseGate(self.gpu_open_, lay.keys)
        trace = _Trace(x, rise.transpose(1, 2, 0), excess.transpose(1, 2, 0), lay.limits)
        # Sensors with no value in the frame learn nothing and score nothing: the per-sensor
        # arithmetic runs on the others (``live``) and leaves theirs NaN.
        live_rise, live_excess = rise.reshape(frame.steps, -1), excess.reshape(frame.steps, -1)
        sensor_of = inputs.live % N_SENSORS
        prior, allow = _PRIOR_SLOPE[sensor_of], peer_enter[sensor_of]
        far_under = lay.limits.reshape(-1)[inputs.live] - self.young_margin_c
        young = np.zeros(n * N_SENSORS, dtype=bool)
        any_young = bool((local.temps["seen_s_"] < self.young_s).any())  # a settled fleet: no
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            bw_dev[i], d_dev = self._learn_drivers(local.drivers, inputs.drivers[i], t_ms)
            dev = self.temps_.deviation_local(local.temps, inputs.x[i], t_ms)
            live_rise[i, inputs.live] = self._rise(local.sensors, dev, d_dev[inputs.load_at], prior)
            live_excess[i, inputs.live] = self._excess(local.sensors, inputs.gaps[i], allow)
            if any_young:
                young[inputs.live] = (local.temps["seen_s_"] < self.young_s) & (
                    inputs.x[i] < far_under
                )
            learn = np.where(gate.open[inputs.gpu_of], 0.02, 1.0)
            self.temps_.learn_local(local.temps, inputs.x[i], t_ms, learn)
            young_rise = (
                np.where(young.reshape(n, N_SENSORS), np.nan, rise[i]) if any_young else rise[i]
            )
            scores[i] = self._score(young_rise, excess[i], inputs.limit_part[i], peer_enter)
            gpu_rise = nanmedian(rise[i], axis=1)
            self.rate_.learn_local(local.rate, gpu_rise, t_ms)
            opened, closed = gate.step(scores[i], t_ms)
            if opened or closed:
                local.store()
                findings += self._step_gpus(frame, i, t_ms, opened, closed, trace)
            findings += self._step_racks(frame, lay, t_ms, gpu_rise)
        local.store()
        frame.derived["thermal_rise"] = quiet_nan(np.nanmax, trace.rise, axis=1)
        frame.derived["bw_dev"] = np.ascontiguousarray(bw_dev.T)
        frame.scores[self.name] = np.ascontiguousarray(scores.T)
        findings += self._refresh_open(frame, lay, trace)
        return latest(findings)

    def _layout_for(self, frame: Frame) -> _Layout:
        """The fleet's layout, rebuilt only when the frame's GPUs or their labels change."""
        lay = self._layout
        if lay is None or lay.keys != frame.gpus.keys or lay.labels != frame.gpus.labels:
            lay = self._layout = _Layout.of(self, frame)
        return lay

    def _sensor_values(self, frame: Frame) -> np.ndarray:
        return np.concatenate(
            [frame.g("mem_temp")[:, None, :], frame.g("hot_temp")[:, None, :], frame.stacks],
            axis=1,
        )

    def _learn_drivers(
        self, s: dict[str, np.ndarray], d_now: np.ndarray, t_ms: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each driver's deviation from its baseline (bandwidth and power of each GPU, in
        turn), learned; and per GPU the bandwidth's, which later detectors read."""
        d_dev = self.drivers_.deviation_local(s, d_now, t_ms)
        self.drivers_.learn_local(s, d_now, t_ms)
        return d_dev[0::2], d_dev

    def _rise(
        self, s: dict[str, np.ndarray], dev: np.ndarray, load: np.ndarray, prior: np.ndarray
    ) -> np.ndarray:
        """Rise over the own baseline less what the load explains; learns the load slope.

        The learned slope explains loads within the range it was learned on (three RMS of
        the calm moves, at least ``UNSEEN_LOAD``); a load above that is explained at least at
        the ``prior`` slope, so a GPU's first copy or GEMM is not a rise (a drop below is
        not: heat lags the load).  The floor keeps the daily ramp on the learned slope.
        """
        ok = ~np.isnan(dev) & ~np.isnan(load)
        a = decay(1.0, self.level_half_life_s)
        sxy, sxx = s["sxy_"], s["sxx_"]
        beta = np.clip(sxy / np.fmax(sxx, 1e-9), 0.0, 60.0)
        beta = np.where(sxx > 1e-6, beta, 0.0)
        load0 = np.nan_to_num(load)
        unseen = load0 > np.fmax(3.0 * np.sqrt(sxx), UNSEEN_LOAD)
        rise = dev - np.where(unseen, np.fmax(beta, prior), beta) * load0
        # Learn the load slope from small moves only: a fault's big rise must not teach it.
        calm = ok & (np.abs(dev) < 4.0)
        s["sxy_"] = np.where(calm, sxy + a * (dev * load - sxy), sxy)
        s["sxx_"] = np.where(calm, sxx + a * (load * load - sxx), sxx)
        return rise

    def _excess(self, s: dict[str, np.ndarray], gap: np.ndarray, allow: np.ndarray) -> np.ndarray:
        """The gap to peers / sibling stacks less the usual gap, which it learns when quiet.

        Until the usual gap is learned, the gap less ``allow`` (the threshold again): twice
        the threshold counts from the first sample, and is not learned as usual.
        """
        usual = s["gap_"]
        seen = s["gap_seen_"]
        excess = np.where(seen >= self.warmup_s, gap - usual, gap - allow)
        ok = ~np.isnan(gap)
        a = np.where(seen < self.warmup_s, 1.0 / (seen + 1.0), decay(1.0, self.offset_half_life_s))
        quiet = ok & ~(np.nan_to_num(excess) > self.stack_enter_c / 2)
        s["gap_"] = np.where(
            quiet, np.where(np.isnan(usual), gap, usual + a * (gap - np.nan_to_num(usual))), usual
        )
        s["gap_seen_"] = seen + quiet
        return excess

    def _score(
        self, rise: np.ndarray, excess: np.ndarray, limit_part: np.ndarray, peer_enter: np.ndarray
    ) -> np.ndarray:
        """Per GPU: how far past its nearest threshold (1 = at it); NaN without data.

        The largest of the three parts over every sensor, NaN parts left out.  ``fmax``
        skips NaN as the former stack of parts with NaN set to -inf did, and mapping
        infinities to the largest floats after the maximum gives what mapping them before
        did, because that mapping keeps order.
        """
        with np.errstate(all="ignore"):
            part = np.fmax(rise / self.rise_enter_c, excess / peer_enter)
            part = np.fmax(part, limit_part)
        score = np.nan_to_num(part, nan=-np.inf).max(axis=1)
        return np.where(np.isinf(score), np.nan, score)

    def _peer_enter(self) -> np.ndarray:
        """Each sensor's peer threshold: memory and hotspot against peers, stacks siblings."""
        return np.r_[self.peer_enter_c, self.peer_enter_c, [self.stack_enter_c] * MAX_STACKS]

    # -- per-GPU findings ----------------------------------------------------------------
    def _step_gpus(
        self,
        frame: Frame,
        i: int,
        t_ms: int,
        opened: list[str],
        closed: list[str],
        trace: _Trace,
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
        trace: _Trace,
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

    def _gpu_causes(
        self, frame: Frame, row: int, worst: int, rise: np.ndarray, excess: np.ndarray
    ) -> list[RankedCause]:
        labels = frame.gpus.labels[row]
        cluster, rack = labels.get("cluster", ""), labels.get("rack", "")
        rack_ep = self.rack_open_.episodes.get(f"{cluster}/{rack}")
        scope = self._heat_scope(cluster, rack)
        if rack_ep is not None:
            scope = self._rack_scope(rack_ep, cluster, rack)
        if scope is not None:
            cause, note = scope
            return [
                RankedCause(cause, 0.85, summary=note),
                RankedCause(Cause.THERMAL, 0.15, summary="this GPU runs hot with the others"),
            ]
        where = "one HBM stack runs hotter than its siblings" if worst >= 2 else "this GPU alone"
        return [RankedCause(Cause.THERMAL, 0.9, summary=f"{where}; its rack's other GPUs do not")]

    def _heat_scope(self, cluster: str, rack: str) -> tuple[Cause, str] | None:
        """``cooling`` if this rack runs hot alone, ``ambient`` if most of its cluster does.

        A rack counts as hot while its rack-wide finding is open, or while its GPUs rise
        together now: racks cross the threshold seconds apart in a room's heat wave.
        """
        racks = self.racks_
        if f"{cluster}/{rack}" not in racks.index:
            return None
        hot = [
            k for k, row in racks.index.items()
            if k.startswith(f"{cluster}/") and (
                k in self.rack_open_.episodes
                or (racks["rise_"][row] >= 0.5 * self.rack_enter_c
                    and racks["frac_"][row] >= self.rack_fraction)
            )
        ]  # fmt: skip
        same_cluster = [k for k in racks.index if k.startswith(f"{cluster}/")]
        if f"{cluster}/{rack}" not in hot:
            return None
        if len(hot) >= 2 and len(hot) >= 0.5 * len(same_cluster):
            return (
                Cause.AMBIENT,
                f"{len(hot)} of {len(same_cluster)} racks of {cluster} warm together",
            )
        return Cause.COOLING, f"rack {rack} warms alone in {cluster}"

    def _rack_scope(self, ep: Episode, cluster: str, rack: str) -> tuple[Cause, str]:
        """The rack episode's cause, decided once and only widened (cooling -> ambient).

        Racks cool down at different times after a room's heat wave; the cause must not
        fall back to ``cooling`` when the last rack is the only one still warm.
        """
        scope = self._heat_scope(cluster, rack)
        held = ep.extra.get("cause")
        if scope is not None and (held is None or scope[0] is Cause.AMBIENT):
            ep.extra["cause"], ep.extra["note"] = scope[0].value, scope[1]
        if "cause" not in ep.extra:
            return Cause.COOLING, f"rack {rack} warms alone"
        return Cause(ep.extra["cause"]), ep.extra["note"]

    # -- rack-wide findings ----------------------------------------------------------------
    def _step_racks(
        self, frame: Frame, lay: _Layout, t_ms: int, gpu_rise: np.ndarray
    ) -> list[Finding]:
        score = self._rack_scores(lay, t_ms, gpu_rise)
        opened, closed = self.rack_open_.step(lay.rack_keys, score, t_ms)
        out = []
        for key in opened:
            start = int(self.rack_open_.over_since(key))
            self.rack_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._rack_finding(frame, key, lay.racks[key], t_ms))
        for key in closed:
            out.append(self._rack_finding(frame, key, lay.racks[key], t_ms, end=t_ms))
            self.rack_open_.episodes.pop(key, None)
        return out

    def _rack_scores(self, lay: _Layout, t_ms: int, gpu_rise: np.ndarray) -> np.ndarray:
        """Each rack's smoothed mean rise (1 = at ``rack_enter_c``) while most GPUs rise;
        NaN for a rack with fewer than ``rack_min_gpus`` GPUs reporting."""
        mean, frac = lay.rack_means(gpu_rise, self.rack_min_gpus)
        score = np.full(len(lay.rack_keys), np.nan)
        live = np.flatnonzero(~np.isnan(mean))
        if len(live) == 0:
            return score
        t, rows = self.racks_, lay.rack_rows[live]
        last = t["last_ms_"][rows]
        a = decay(np.where(np.isnan(last), 1.0, (t_ms - last) / 1000.0), self.rack_half_life_s)
        t["rise_"][rows] += a * (mean[live] - t["rise_"][rows])
        t["frac_"][rows] += a * (frac[live] - t["frac_"][rows])
        t["last_ms_"][rows] = t_ms
        frac_ok = t["frac_"][rows] >= self.rack_fraction
        score[live] = np.where(frac_ok, t["rise_"][rows] / self.rack_enter_c, 0.0)
        return score

    def _rack_finding(
        self, frame: Frame, rkey: str, members: list[int], t_ms: int, end: int | None = None
    ) -> Finding:
        cluster, rack = rkey.split("/", 1)
        ep = self.rack_open_.episodes.get(rkey) or Episode(t_ms, t_ms)
        row = self.racks_.index[rkey]
        rise, frac = float(self.racks_["rise_"][row]), float(self.racks_["frac_"][row])
        cause, note = self._rack_scope(ep, cluster, rack)
        other = Cause.AMBIENT if cause is Cause.COOLING else Cause.COOLING
        series = frame.series_of("gpu", frame.gpus.keys[members[0]], "mem_temp")
        evidence = [
            Evidence(f"mean over rack {rack}: " + series.split("{")[0], "rack_mean_rise_c", rise,
                     self.rack_enter_c, ep.started_ms, t_ms),
            Evidence(f"GPUs of rack {rack}", "fraction_of_gpus_rising", frac, self.rack_fraction),
        ]  # fmt: skip
        return make_finding(
            kind=FindingKind.THERMAL_EXCURSION, detector=self.name,
            entity={"cluster": cluster, "rack": rack}, severity=Severity.WARNING,
            summary=(f"rack {rack}: {len(members)} GPUs {rise:+.1f} C over their baselines "
                     f"together ({frac:.0%} rising); {note}"),
            started_ms=ep.started_ms, raised_ms=ep.raised_ms, updated_ms=t_ms, ended_ms=end,
            evidence=evidence,
            causes=[RankedCause(cause, 0.8, summary=note), RankedCause(other, 0.2)],
        )  # fmt: skip

    def _refresh_open(self, frame: Frame, lay: _Layout, trace: _Trace) -> list[Finding]:
        """Open findings, re-stated with this frame's numbers (their causes may sharpen)."""
        last = frame.steps - 1
        t_ms = int(frame.times_ms[last])
        out = []
        for key in self.gpu_open_.episodes:
            row = frame.gpus.index.get(key)
            if row is not None and not np.isnan(trace.x[row, :, last]).all():
                out.append(self._gpu_finding(frame, row, last, t_ms, trace))
        for rack_key in self.rack_open_.episodes:
            members = lay.racks.get(rack_key)
            if members:
                out.append(self._rack_finding(frame, rack_key, members, t_ms))
        return out

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "temps": self.temps_.state_dict(),
            "drivers": self.drivers_.state_dict(),
            "rate": self.rate_.state_dict(),
            "sensors": self.sensors_.state_dict(),
            "racks": self.racks_.state_dict(),
            "gpu_open": self.gpu_open_.state_dict(),
            "rack_open": self.rack_open_.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.temps_.load_state_dict(state.get("temps", {}))
        self.drivers_.load_state_dict(state.get("drivers", {}))
        self.rate_.load_state_dict(state.get("rate", {}))
        self.sensors_.load_state_dict(state.get("sensors", {}))
        self.racks_.load_state_dict(state.get("racks", {}))
        self.gpu_open_.load_state_dict(state.get("gpu_open", {}))
        self.rack_open_.load_state_dict(state.get("rack_open", {}))


def _f(value: float) -> float:
    """``float(np.nan_to_num(value))`` for one number, without numpy's per-call cost."""
    v = float(value)
    if math.isnan(v):
        return 0.0
    return math.copysign(sys.float_info.max, v) if math.isinf(v) else v


#: Which driver loads each sensor: bandwidth (0) for memory and stacks, power (1) for hotspot.
_SENSOR_DRIVER = np.array([0, 1] + [0] * MAX_STACKS)
#: Each sensor's prior slope on its driver, C per unit (bandwidth or relative power).
_PRIOR_SLOPE = np.array(
    [MEMORY_C_PER_BANDWIDTH, HOTSPOT_C_PER_POWER] + [MEMORY_C_PER_BANDWIDTH] * MAX_STACKS
)


@dataclass
class _Layout:
    """What the frames of an unchanged fleet share: state rows, peers, racks and limits.

    Built when the frame's GPUs or their labels change and kept otherwise (the builder
    hands the same fleet every cycle), which saves making and looking up 10,000 sensor
    keys and a Python pass over the GPUs' labels every step.
    """

    keys: list[str]
    labels: list[dict[str, str]]
    rows: np.ndarray  # temps_ rows, one per GPU and sensor
    srows: np.ndarray  # sensors_ rows, the same keys
    drows: np.ndarray  # drivers_ rows, bandwidth and power per GPU
    frows: np.ndarray  # rate_ rows, one per GPU
    groups: np.ndarray  # peer group (cluster, rack, SKU) per GPU
    limits: np.ndarray  # (G, S): slowdown limit per sensor
    board: np.ndarray  # (G,): board power, the power scale when no limit is reported
    rack_keys: list[str]  # in order of first appearance, as racks step
    rack_rows: np.ndarray  # racks_ rows
    racks: dict[str, list[int]]  # rack key -> its GPUs' rows
    buckets: list[tuple[np.ndarray, np.ndarray]]  # racks of one size: (racks, (R, k) rows)

    @classmethod
    def of(cls, det: ThermalExcursions, frame: Frame) -> _Layout:
        keys, labels = list(frame.gpus.keys), [dict(lab) for lab in frame.gpus.labels]
        sensor_keys = [f"{g}#{s}" for g in keys for s in SENSORS]
        racks: dict[str, list[int]] = {}
        for row, lab in enumerate(labels):
            racks.setdefault(f"{lab.get('cluster', '')}/{lab.get('rack', '')}", []).append(row)
        by_size: dict[int, list[int]] = {}
        for j, members in enumerate(racks.values()):
            by_size.setdefault(len(members), []).append(j)
        members = list(racks.values())
        skus = {lab.get("sku", "") for lab in labels}
        found = {sku: lookup(sku) if sku else None for sku in skus}
        return cls(
            keys=keys, labels=labels,
            rows=det.temps_.rows(sensor_keys), srows=det.sensors_.rows(sensor_keys),
            drows=det.drivers_.rows([f"{g}#{d}" for g in keys for d in ("bw", "pw")]),
            frows=det.rate_.rows(keys), groups=_peer_groups(labels),
            limits=_limits([found[lab.get("sku", "")] for lab in labels]),
            board=np.array([_board_power(found[lab.get("sku", "")]) for lab in labels]),
            rack_keys=list(racks), rack_rows=det.racks_.rows(list(racks)), racks=racks,
            buckets=[(np.array(js), np.array([members[j] for j in js])) for js in by_size.values()],
        )  # fmt: skip

    def rack_means(self, gpu_rise: np.ndarray, min_gpus: int) -> tuple[np.ndarray, np.ndarray]:
        """Per rack the mean rise of its reporting GPUs and the fraction rising over 0.5 C;
        NaN for a rack with fewer than ``min_gpus`` reporting.

        Racks of one size are averaged as one matrix, row by row, which sums in the same
        order as averaging each rack on its own; a rack missing a GPU is done on its own.
        """
        mean = np.full(len(self.rack_keys), np.nan)
        frac = np.full(len(self.rack_keys), np.nan)
        for racks, members in self.buckets:
            r = gpu_rise[members]
            full = ~np.isnan(r).any(axis=1)
            if members.shape[1] >= min_gpus and full.any():
                mean[racks[full]] = r[full].mean(axis=1)
                frac[racks[full]] = (r[full] > 0.5).mean(axis=1)
            for j in np.flatnonzero(~full).tolist():
                part = r[j][~np.isnan(r[j])]
                if len(part) >= min_gpus:
                    mean[racks[j]], frac[racks[j]] = part.mean(), (part > 0.5).mean()
        return mean, frac


@dataclass
class _Inputs:
    """A frame's inputs, time-major, so each step reads contiguous rows.

    Per-sensor inputs hold only the sensors with a value somewhere in the frame
    (``live``, indices into GPU x sensor): a GPU without HBM stack sensors has 8 of 10.
    """

    live: np.ndarray  # (L,) live sensors, index GPU * S + sensor
    gpu_of: np.ndarray  # (L,) each live sensor's GPU row
    load_at: np.ndarray  # (L,) its driver in the (G * 2) driver deviations
    x: np.ndarray  # (T, L) temperatures
    gaps: np.ndarray  # (T, L) gap to peers (memory, hotspot) or sibling stacks
    limit_part: np.ndarray  # (T, G, S) closeness to the slowdown limit, 1 = within margin
    drivers: np.ndarray  # (T, G * 2) bandwidth and relative power

    @classmethod
    def of(cls, frame: Frame, lay: _Layout, x: np.ndarray, margin: float) -> _Inputs:
        steps = frame.steps
        live = np.flatnonzero(~np.isnan(x).all(axis=2))
        gpu_of, sensor = np.divmod(live, N_SENSORS)
        xt = np.ascontiguousarray(x.transpose(2, 0, 1))
        with np.errstate(invalid="ignore"):
            limit_part = (xt - (lay.limits - margin)) / margin + 1.0
        gaps = _gaps(x, lay.groups).transpose(2, 0, 1).reshape(steps, -1)[:, live]
        drivers = np.ascontiguousarray(_drivers(frame, lay.board).transpose(2, 0, 1))
        return cls(live, gpu_of, gpu_of * 2 + _SENSOR_DRIVER[sensor],
                   xt.reshape(steps, -1)[:, live], np.ascontiguousarray(gaps), limit_part,
                   drivers.reshape(steps, -1))  # fmt: skip


class _Locals:
    """Copies of the state rows the step loop learns, written back by ``store``.

    Gathering and scattering 10,000 rows of six fields every step cost more than the
    arithmetic; the copies are stored before any finding reads the tables and at the end.
    """

    def __init__(self, det: ThermalExcursions, lay: _Layout, live: np.ndarray) -> None:
        self.det, self.lay = det, lay
        self.rows, self.srows = lay.rows[live], lay.srows[live]  # live sensors only
        self.temps = det.temps_.local(self.rows)
        self.drivers = det.drivers_.local(lay.drows)
        self.rate = det.rate_.local(lay.frows)
        self.sensors = {name: det.sensors_[name][self.srows] for name in det.sensors_.fields}

    def store(self) -> None:
        det, lay = self.det, self.lay
        det.temps_.store(self.rows, self.temps)
        det.drivers_.store(lay.drows, self.drivers)
        det.rate_.store(lay.frows, self.rate)
        for name, values in self.sensors.items():
            det.sensors_[name][self.srows] = values


class _Trace(NamedTuple):
    """What findings quote, (G, S, T) each: temperatures, rises, excesses; and limits."""

    x: np.ndarray
    rise: np.ndarray
    excess: np.ndarray
    limits: np.ndarray


def _limits(skus: list[Sku | None]) -> np.ndarray:
    """(G, S): each sensor's slowdown limit; the stacks share the memory limit."""
    out = np.empty((len(skus), N_SENSORS))
    for row, sku in enumerate(skus):
        mem, hot = (sku.memory_slowdown_c, sku.hotspot_slowdown_c) if sku else DEFAULT_LIMITS
        out[row] = mem
        out[row, 1] = hot
    return out


def _peer_groups(labels: list[dict[str, str]]) -> np.ndarray:
    names = [
        f"{lab.get('cluster', '')}/{lab.get('rack', '')}/{lab.get('sku', '')}" for lab in labels
    ]
    _, groups = np.unique(np.array(names), return_inverse=True)
    return groups


def _gaps(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(G, S, T): memory and hotspot against the peers' median, stacks against the
    sibling stacks' median; NaN with fewer than three to compare with.  Every step at once:
    the medians are per step, as one step at a time would take them."""
    out = np.full(x.shape, np.nan)
    for col in (0, 1):
        med, count = group_median_columns(x[:, col], groups)
        out[:, col] = np.where(count >= 3, x[:, col] - med, np.nan)
    stacks = x[:, 2:]
    sib = nanmedian(stacks, axis=1)
    have = (~np.isnan(stacks)).sum(axis=1) >= 3
    out[:, 2:] = np.where(have[:, None], stacks - sib[:, None], np.nan)
    return out


def _drivers(frame: Frame, board: np.ndarray) -> np.ndarray:
    """What loads each sensor: memory bandwidth (memory, stacks) and relative power (hotspot).

    Power is relative to the GPU's power limit, else its SKU's board power, else 1 kW:
    never to anything seen later in the frame, so a step's score does not look ahead.
    """
    power = frame.g("power")
    limit = frame.g("power_limit")
    scale = np.where(np.isnan(limit), board[:, None], limit)
    rel = power / np.fmax(scale, 1.0)
    return np.stack([frame.g("bw"), rel], axis=1)


def _board_power(sku: Sku | None) -> float:
    return float(sku.board_power_watts) if sku else 1000.0
