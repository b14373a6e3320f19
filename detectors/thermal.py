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

Rates of rise are reported with each finding.  Hysteresis (enter at 1, leave under 0.5 of
the thresholds) and minimum durations keep one noisy sample from opening or closing one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from detectors.base import (
    EntityTable,
    Episode,
    Hysteresis,
    latest,
    make_finding,
    nanmedian,
    quiet_nan,
)
from detectors.frame import MAX_STACKS, Frame
from detectors.scorers import TrendBaseline, decay, group_median
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.skus import lookup
from hbmwatch.taxonomy import Cause, FindingKind

SENSORS = ("memory", "hotspot", *(f"stack{i}" for i in range(MAX_STACKS)))
N_SENSORS = len(SENSORS)
DEFAULT_LIMITS = (95.0, 89.0)  # memory, hotspot: the strictest SKU's when one is unknown


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
        self.level_half_life_s = level_half_life_s
        self.offset_half_life_s = offset_half_life_s
        self.rack_half_life_s = rack_half_life_s
        self._init_state()

    def _init_state(self) -> None:
        self.temps_ = TrendBaseline(
            level_half_life_s=self.level_half_life_s, min_scale=0.5, warmup_s=self.warmup_s
        )
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

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        x = self._sensor_values(frame)  # (G, S, T)
        limits = self._limits(frame)  # (G, S)
        groups = _peer_groups(frame)
        keys = [f"{g}#{s}" for g in frame.gpus.keys for s in SENSORS]
        rows = self.temps_.rows(keys)
        srows = self.sensors_.rows(keys)
        drows = self.drivers_.rows([f"{g}#{d}" for g in frame.gpus.keys for d in ("bw", "pw")])
        frows = self.rate_.rows(frame.gpus.keys)
        drivers = _drivers(frame)  # (G, 2, T)
        rise = np.full((n, N_SENSORS, frame.steps), np.nan)
        excess = np.full((n, N_SENSORS, frame.steps), np.nan)
        is_open = self.gpu_open_.is_open(frame.gpus.keys)
        bw_dev = np.full((n, frame.steps), np.nan)
        scores = np.full((n, frame.steps), np.nan)
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            d_now = drivers[:, :, i].ravel()
            d_dev = self.drivers_.deviation(drows, d_now, t_ms).reshape(n, 2)
            self.drivers_.learn_one(drows, d_now, t_ms)
            bw_dev[:, i] = d_dev[:, 0]
            load = np.repeat(d_dev[:, :1], N_SENSORS, axis=1)
            load[:, 1] = d_dev[:, 1]
            xi = x[:, :, i].ravel()
            dev = self.temps_.deviation(rows, xi, t_ms)
            rise_i, excess_i = self._adjust(srows, dev, load.ravel(), xi, groups, n)
            rise[:, :, i], excess[:, :, i] = rise_i, excess_i
            learn = np.repeat(np.where(is_open, 0.02, 1.0), N_SENSORS)
            self.temps_.learn_one(rows, xi, t_ms, learn)
            score, gpu_rise = self._score(rise_i, excess_i, x[:, :, i], limits)
            scores[:, i] = score
            self.rate_.learn_one(frows, gpu_rise, t_ms)
            findings += self._step_gpus(frame, i, t_ms, score, x, rise, excess, limits)
            is_open = self.gpu_open_.is_open(frame.gpus.keys)
            findings += self._step_racks(frame, t_ms, gpu_rise)
        frame.derived["thermal_rise"] = quiet_nan(np.nanmax, rise, axis=1)
        frame.derived["bw_dev"] = bw_dev
        frame.scores[self.name] = scores
        findings += self._refresh_open(frame, x, rise, excess, limits)
        return latest(findings)

    def _sensor_values(self, frame: Frame) -> np.ndarray:
        return np.concatenate(
            [frame.g("mem_temp")[:, None, :], frame.g("hot_temp")[:, None, :], frame.stacks],
            axis=1,
        )

    def _limits(self, frame: Frame) -> np.ndarray:
        out = np.empty((len(frame.gpus), N_SENSORS))
        for row, labels in enumerate(frame.gpus.labels):
            sku = lookup(labels.get("sku", "")) if labels.get("sku") else None
            mem, hot = (sku.memory_slowdown_c, sku.hotspot_slowdown_c) if sku else DEFAULT_LIMITS
            out[row] = mem
            out[row, 1] = hot
        return out

    def _adjust(
        self,
        srows: np.ndarray,
        dev: np.ndarray,
        load: np.ndarray,
        x: np.ndarray,
        groups: np.ndarray,
        n: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Load-adjusted rise over the own baseline, and the excess over peers / siblings."""
        s = self.sensors_
        ok = ~np.isnan(dev) & ~np.isnan(load)
        a = decay(1.0, self.level_half_life_s)
        sxy, sxx = s["sxy_"][srows], s["sxx_"][srows]
        beta = np.clip(sxy / np.fmax(sxx, 1e-9), 0.0, 60.0)
        beta = np.where(sxx > 1e-6, beta, 0.0)
        rise = dev - beta * np.nan_to_num(load)
        # Learn the load slope from small moves only: a fault's big rise must not teach it.
        calm = ok & (np.abs(dev) < 4.0)
        s["sxy_"][srows] = np.where(calm, sxy + a * (dev * load - sxy), sxy)
        s["sxx_"][srows] = np.where(calm, sxx + a * (load * load - sxx), sxx)
        gap = _gaps(x.reshape(n, N_SENSORS), groups)
        excess = self._excess(srows, gap.ravel())
        return rise.reshape(n, N_SENSORS), excess.reshape(n, N_SENSORS)

    def _excess(self, srows: np.ndarray, gap: np.ndarray) -> np.ndarray:
        s = self.sensors_
        usual = s["gap_"][srows]
        seen = s["gap_seen_"][srows]
        excess = np.where(seen >= self.warmup_s, gap - usual, np.nan)
        ok = ~np.isnan(gap)
        a = np.where(seen < self.warmup_s, 1.0 / (seen + 1.0), decay(1.0, self.offset_half_life_s))
        quiet = ok & ~(np.nan_to_num(excess) > self.stack_enter_c / 2)
        s["gap_"][srows] = np.where(
            quiet, np.where(np.isnan(usual), gap, usual + a * (gap - np.nan_to_num(usual))), usual
        )
        s["gap_seen_"][srows] = seen + quiet
        return excess

    def _score(
        self, rise: np.ndarray, excess: np.ndarray, x: np.ndarray, limits: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU: how far past its nearest threshold (1 = at it), and its largest rise."""
        with np.errstate(all="ignore"):
            peer_enter = np.r_[self.peer_enter_c, self.peer_enter_c, [self.stack_enter_c] * 8]
            parts = np.stack(
                [
                    rise / self.rise_enter_c,
                    excess / peer_enter[None, :],
                    (x - (limits - self.margin_c)) / self.margin_c + 1.0,
                ]
            )
            score = np.nanmax(np.nan_to_num(parts, nan=-np.inf).max(axis=0), axis=1)
            gpu_rise = nanmedian(rise, axis=1)
        score = np.where(np.isinf(score), np.nan, score)
        return score, gpu_rise

    # -- per-GPU findings ----------------------------------------------------------------
    def _step_gpus(
        self,
        frame: Frame,
        i: int,
        t_ms: int,
        score: np.ndarray,
        x: np.ndarray,
        rise: np.ndarray,
        excess: np.ndarray,
        limits: np.ndarray,
    ) -> list[Finding]:
        keys = frame.gpus.keys
        opened, closed = self.gpu_open_.step(keys, score, t_ms)
        out = []
        for key in opened:
            row = frame.gpus.index[key]
            start = int(self.gpu_open_.over_since(key))
            self.gpu_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._gpu_finding(frame, row, i, t_ms, x, rise, excess, limits))
        for key in closed:
            row = frame.gpus.index[key]
            out.append(self._gpu_finding(frame, row, i, t_ms, x, rise, excess, limits, end=t_ms))
            self.gpu_open_.episodes.pop(key, None)
        return out

    def _gpu_finding(
        self,
        frame: Frame,
        row: int,
        i: int,
        t_ms: int,
        x: np.ndarray,
        rise: np.ndarray,
        excess: np.ndarray,
        limits: np.ndarray,
        end: int | None = None,
    ) -> Finding:
        key = frame.gpus.keys[row]
        labels = frame.gpus.labels[row]
        ep = self.gpu_open_.episodes.get(key) or Episode(t_ms, t_ms)
        xs, rs, es = x[row, :, i], rise[row, :, i], excess[row, :, i]
        worst = self._worst_sensor(xs, rs, es, limits[row])
        sensor = SENSORS[worst]
        ep.peak = max(ep.peak, float(np.nan_to_num(xs[worst])))
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
        peer_enter = np.r_[self.peer_enter_c, self.peer_enter_c, [self.stack_enter_c] * 8]
        with np.errstate(all="ignore"):
            parts = np.stack([
                rise / self.rise_enter_c,
                excess / peer_enter,
                (x - (limits - self.margin_c)) / self.margin_c + 1.0,
            ])  # fmt: skip
            per_sensor = np.nan_to_num(parts, nan=-np.inf).max(axis=0)
        per_sensor = np.where(np.isnan(x), -np.inf, per_sensor)
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
    def _step_racks(self, frame: Frame, t_ms: int, gpu_rise: np.ndarray) -> list[Finding]:
        racks: dict[str, list[int]] = {}
        for row, labels in enumerate(frame.gpus.labels):
            racks.setdefault(f"{labels.get('cluster', '')}/{labels.get('rack', '')}", []).append(
                row
            )
        keys = list(racks)
        rrows = self.racks_.rows(keys)
        score = np.full(len(keys), np.nan)
        for j, (_rkey, members) in enumerate(racks.items()):
            r = gpu_rise[members]
            r = r[~np.isnan(r)]
            if len(r) < self.rack_min_gpus:
                continue
            row = rrows[j]
            last = self.racks_["last_ms_"][row]
            a = decay((t_ms - last) / 1000.0 if not np.isnan(last) else 1.0, self.rack_half_life_s)
            self.racks_["rise_"][row] += a * (float(r.mean()) - self.racks_["rise_"][row])
            self.racks_["frac_"][row] += a * (float((r > 0.5).mean()) - self.racks_["frac_"][row])
            self.racks_["last_ms_"][row] = t_ms
            frac_ok = self.racks_["frac_"][row] >= self.rack_fraction
            score[j] = self.racks_["rise_"][row] / self.rack_enter_c if frac_ok else 0.0
        opened, closed = self.rack_open_.step(keys, score, t_ms)
        out = []
        for key in opened:
            start = int(self.rack_open_.over_since(key))
            self.rack_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._rack_finding(frame, key, racks[key], t_ms))
        for key in closed:
            out.append(self._rack_finding(frame, key, racks[key], t_ms, end=t_ms))
            self.rack_open_.episodes.pop(key, None)
        return out

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

    def _refresh_open(
        self,
        frame: Frame,
        x: np.ndarray,
        rise: np.ndarray,
        excess: np.ndarray,
        limits: np.ndarray,
    ) -> list[Finding]:
        """Open findings, re-stated with this frame's numbers (their causes may sharpen)."""
        last = frame.steps - 1
        t_ms = int(frame.times_ms[last])
        out = []
        for key in self.gpu_open_.episodes:
            row = frame.gpus.index.get(key)
            if row is not None and not np.isnan(x[row, :, last]).all():
                out.append(self._gpu_finding(frame, row, last, t_ms, x, rise, excess, limits))
        for rack_key in self.rack_open_.episodes:
            members = [
                r for r, lab in enumerate(frame.gpus.labels)
                if f"{lab.get('cluster', '')}/{lab.get('rack', '')}" == rack_key
            ]  # fmt: skip
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
    return float(np.nan_to_num(value))


def _peer_groups(frame: Frame) -> np.ndarray:
    names = [
        f"{lab.get('cluster', '')}/{lab.get('rack', '')}/{lab.get('sku', '')}"
        for lab in frame.gpus.labels
    ]
    _, groups = np.unique(np.array(names), return_inverse=True)
    return groups


def _gaps(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Memory and hotspot: gap to the peers' median; stacks: gap to the sibling median."""
    out = np.full(x.shape, np.nan)
    for col in (0, 1):
        med, count = group_median(x[:, col], groups)
        out[:, col] = np.where(count >= 3, x[:, col] - med, np.nan)
    stacks = x[:, 2:]
    sib = nanmedian(stacks, axis=1)
    have = (~np.isnan(stacks)).sum(axis=1) >= 3
    out[:, 2:] = np.where(have[:, None], stacks - sib[:, None], np.nan)
    return out


def _drivers(frame: Frame) -> np.ndarray:
    """What loads each sensor: memory bandwidth (memory, stacks) and relative power (hotspot).

    Power is relative to the GPU's power limit, else its SKU's board power, else 1 kW:
    never to anything seen later in the frame, so a step's score does not look ahead.
    """
    power = frame.g("power")
    limit = frame.g("power_limit")
    board = np.array([_board_power(lab.get("sku", "")) for lab in frame.gpus.labels])
    scale = np.where(np.isnan(limit), board[:, None], limit)
    rel = power / np.fmax(scale, 1.0)
    return np.stack([frame.g("bw"), rel], axis=1)


def _board_power(sku: str) -> float:
    found = lookup(sku) if sku else None
    return found.board_power_watts if found else 1000.0
