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

A load over any the GPU was calm at (a pod moved onto an idle GPU) is one its own load
model cannot speak for: there a rise counts only as far as the sensor also stands over what
its same-SKU rack peers run at at that load (``peer_load_gaps``, less its usual gap to
them), and the gap to the peers' median counts only as far as that gap at load does too;
while a GPU sheds the heat of a load it just lost, neither counts (heat lags the load).

Rates of rise are reported with each finding.  Hysteresis (enter at 1, leave under 0.5 of
the thresholds) and minimum durations keep one noisy sample from opening or closing one.

This module holds the detector's step loop (baselines, load slopes, peer gaps, scores) and
its state; the fleet's layout and each frame's inputs are in ``detectors/thermal_layout.py``,
per-GPU findings in ``detectors/thermal_findings.py``, and rack-wide rises with the cause
they imply in ``detectors/thermal_racks.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hbmwatch.detectors.base import (
    EntityTable,
    Hysteresis,
    SparseGate,
    latest,
    nanmedian,
    quiet_nan,
)
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import TrendBaseline, decay
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.detectors.thermal_findings import GpuFindings
from hbmwatch.detectors.thermal_layout import (
    N_SENSORS,
    PRIOR_SLOPE,
    UNSEEN_LOAD,
    FleetLayout,
    FrameInputs,
    LocalRows,
    Trace,
)
from hbmwatch.detectors.thermal_racks import RackWarming
from hbmwatch.records import Finding


class ThermalExcursions(GpuFindings, RackWarming):
    """Per-GPU and rack-wide thermal excursions with their likely cause.

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
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
        lag_half_life_s: float = 30.0,
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
        self.lag_half_life_s = lag_half_life_s
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
        # ``lgap_``: the usual gap to peers at the same load; ``hi_``: the highest load the
        # sensor was calm at (the top of the range its own load slope knows).
        self.sensors_ = EntityTable({
            "sxy_": 0.0, "sxx_": 0.0, "gap_": np.nan, "gap_seen_": 0.0,
            "lgap_": np.nan, "hi_": np.nan,
        })  # fmt: skip
        self.racks_ = EntityTable({"rise_": 0.0, "frac_": 0.0, "last_ms_": np.nan})
        # Per driver: its recent peak, decaying at ``lag_half_life_s`` (heat lags the load).
        self.lag_ = EntityTable({"load_": np.nan})
        self.gpu_open_ = Hysteresis(
            enter=1.0, exit=0.5, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )
        self.rack_open_ = Hysteresis(
            enter=1.0, exit=0.4, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )
        self._layout: FleetLayout | None = None  # rows into the tables above: reset with them

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        lay = self._layout_for(frame)
        x = self._sensor_values(frame)  # (G, S, T)
        inputs = FrameInputs.of(frame, lay, x, self.margin_c)
        shape = (frame.steps, n, N_SENSORS)
        rise, excess = np.full(shape, np.nan), np.full(shape, np.nan)
        scores = np.full((frame.steps, n), np.nan)
        bw_dev = np.full((frame.steps, n), np.nan)
        local = LocalRows(self, lay, inputs.live)
        peer_enter = self._peer_enter()
        gate = SparseGate(self.gpu_open_, lay.keys)
        trace = Trace(x, rise.transpose(1, 2, 0), excess.transpose(1, 2, 0), lay.limits)
        # Sensors with no value in the frame learn nothing and score nothing: the per-sensor
        # arithmetic runs on the others (``live``) and leaves theirs NaN.
        live_rise, live_excess = rise.reshape(frame.steps, -1), excess.reshape(frame.steps, -1)
        sensor_of = inputs.live % N_SENSORS
        prior, allow = PRIOR_SLOPE[sensor_of], peer_enter[sensor_of]
        by_peers = sensor_of < 2  # memory and hotspot; stacks are judged by their siblings
        lag_decay = 1.0 - decay(frame.step_ms / 1000.0, self.lag_half_life_s)  # kept
        far_under = lay.limits.reshape(-1)[inputs.live] - self.young_margin_c
        young = np.zeros(n * N_SENSORS, dtype=bool)
        any_young = bool((local.temps["seen_s_"] < self.young_s).any())  # a settled fleet: no
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            bw_dev[i], d_dev = self._learnsensor_drivers(local.drivers, inputs.drivers[i], t_ms)
            dev = self.temps_.deviation_local(local.temps, inputs.x[i], t_ms)
            local.lag = np.fmax(inputs.drivers[i], local.lag * lag_decay)
            settling = local.lag[inputs.load_at] - inputs.load_abs[i] > UNSEEN_LOAD
            excess_i, at_load = self._excess(
                local.sensors, inputs.gaps[i], inputs.load_gaps[i], allow, by_peers
            )
            rise_i = self._rise(
                local.sensors, dev, d_dev[inputs.load_at], prior, inputs.load_abs[i], at_load
            )
            live_rise[i, inputs.live], live_excess[i, inputs.live] = _settling(
                rise_i, excess_i, settling, by_peers
            )
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

    def _layout_for(self, frame: Frame) -> FleetLayout:
        """The fleet's layout, rebuilt only when the frame's GPUs or their labels change."""
        lay = self._layout
        if lay is None or lay.keys != frame.gpus.keys or lay.labels != frame.gpus.labels:
            lay = self._layout = FleetLayout.of(self, frame)
        return lay

    def _sensor_values(self, frame: Frame) -> np.ndarray:
        return np.concatenate(
            [frame.g("mem_temp")[:, None, :], frame.g("hot_temp")[:, None, :], frame.stacks],
            axis=1,
        )

    def _learnsensor_drivers(
        self, s: dict[str, np.ndarray], d_now: np.ndarray, t_ms: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each driver's deviation from its baseline (bandwidth and power of each GPU, in
        turn), learned; and per GPU the bandwidth's, which later detectors read."""
        d_dev = self.drivers_.deviation_local(s, d_now, t_ms)
        self.drivers_.learn_local(s, d_now, t_ms)
        return d_dev[0::2], d_dev

    def _rise(
        self,
        s: dict[str, np.ndarray],
        dev: np.ndarray,
        load: np.ndarray,
        prior: np.ndarray,
        load_abs: np.ndarray,
        at_load: np.ndarray,
    ) -> np.ndarray:
        """Rise over the own baseline less what the load explains; learns the load slope.

        The learned slope explains loads within the range it was learned on (three RMS of
        the calm moves, at least ``UNSEEN_LOAD``); a load above that is explained at least at
        the ``prior`` slope, so a GPU's first copy or GEMM is not a rise (a drop below is
        not: heat lags the load).  The floor keeps the daily ramp on the learned slope.

        A load over the highest the sensor was ever calm at (``hi_``, plus ``UNSEEN_LOAD``;
        a load counts as far as it was also its baseline, since the first seconds of a new
        load are calm only because heat lags) is one its own baseline cannot speak for (an
        idle GPU that a pod moved onto): there
        the rise counts only as far as the temperature also stands over what its same-SKU
        peers run at at that load (``at_load``, less its usual gap), when peers have a say.
        A sensor never calm yet (or loaded from state saved before ``hi_``) keeps the prior.
        """
        ok = ~np.isnan(dev) & ~np.isnan(load)
        a = decay(1.0, self.level_half_life_s)
        sxy, sxx, hi = s["sxy_"], s["sxx_"], s["hi_"]
        beta = np.clip(sxy / np.fmax(sxx, 1e-9), 0.0, 60.0)
        beta = np.where(sxx > 1e-6, beta, 0.0)
        load0 = np.nan_to_num(load)
        unseen = load0 > np.fmax(3.0 * np.sqrt(sxx), UNSEEN_LOAD)
        rise = dev - np.where(unseen, np.fmax(beta, prior), beta) * load0
        # State saved before ``hi_``: the top of the range its slope was learned on.
        hi = np.where(np.isnan(hi) & (sxx > 1e-6), load_abs - load + 3.0 * np.sqrt(sxx), hi)
        beyond = (load_abs > hi + UNSEEN_LOAD) & ~np.isnan(at_load) & ~np.isnan(rise)
        rise = np.where(beyond, np.fmin(rise, at_load), rise)
        # Learn the load slope from small moves only: a fault's big rise must not teach it.
        calm = ok & (np.abs(dev) < 4.0)
        s["sxy_"] = np.where(calm, sxy + a * (dev * load - sxy), sxy)
        s["sxx_"] = np.where(calm, sxx + a * (load * load - sxx), sxx)
        s["hi_"] = np.where(calm, np.fmax(hi, load_abs - np.fmax(load, 0.0)), hi)
        return rise

    def _excess(
        self,
        s: dict[str, np.ndarray],
        gap: np.ndarray,
        load_gap: np.ndarray,
        allow: np.ndarray,
        by_peers: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The gap to peers / sibling stacks less the usual gap, which it learns when quiet;
        and the gap to peers at the same load less its usual (for ``_rise``; NaN until
        the usual is learned: it then has no say).

        Until the usual gap is learned, the gap less ``allow`` (the threshold again): twice
        the threshold counts from the first sample, and is not learned as usual.  Memory
        and hotspot stand out from their peers only as far as they also do from the peers
        at their load: a GPU that took on a pod is hotter than the idle peers' median it
        was learned against, not hotter than the busy ones.
        """
        usual, usual_at_load = s["gap_"], s["lgap_"]
        seen = s["gap_seen_"]
        warm = seen >= self.warmup_s
        excess = np.where(warm, gap - usual, gap - allow)
        # Warm without a usual gap at load (state saved before ``lgap_``): no say yet.
        at_load = np.where(warm, load_gap - usual_at_load, load_gap - allow)
        vetoed = by_peers & ~np.isnan(excess) & ~np.isnan(at_load)
        excess = np.where(vetoed, np.fmin(excess, at_load), excess)
        a = np.where(seen < self.warmup_s, 1.0 / (seen + 1.0), decay(1.0, self.offset_half_life_s))
        quiet = ~(np.nan_to_num(excess) > self.stack_enter_c / 2)
        s["gap_"] = _learn_usual(usual, gap, quiet, a)
        s["lgap_"] = _learn_usual(usual_at_load, load_gap, quiet, a)
        s["gap_seen_"] = seen + (quiet & ~np.isnan(gap))
        return excess, np.where(warm, at_load, np.nan)

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

    def _refresh_open(self, frame: Frame, lay: FleetLayout, trace: Trace) -> list[Finding]:
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
            "lag": self.lag_.state_dict(),
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
        self.lag_.load_state_dict(state.get("lag", {}))
        self.gpu_open_.load_state_dict(state.get("gpu_open", {}))
        self.rack_open_.load_state_dict(state.get("rack_open", {}))


def _settling(
    rise: np.ndarray, excess: np.ndarray, settling: np.ndarray, by_peers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rise and excess of sensors whose load fell by over ``UNSEEN_LOAD`` lately held at 0:
    heat lags the load, so a GPU still shedding the heat of a pod that left sits over its
    idle baseline and over its idle peers while its load is back at theirs.  The SKU's
    limit still applies."""
    rise = np.where(settling & ~np.isnan(rise), np.fmin(rise, 0.0), rise)
    excess = np.where(settling & by_peers & ~np.isnan(excess), np.fmin(excess, 0.0), excess)
    return rise, excess


def _learn_usual(
    usual: np.ndarray, gap: np.ndarray, quiet: np.ndarray, a: np.ndarray
) -> np.ndarray:
    """The usual gap moved toward a quiet step's gap (set by the first); NaN gaps teach nothing."""
    step = np.where(np.isnan(usual), gap, usual + a * (gap - np.nan_to_num(usual)))
    return np.where(quiet & ~np.isnan(gap), step, usual)
