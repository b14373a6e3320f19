"""Rack-wide thermal rises, and which racks warming together say about a GPU's heat.

Why a module of its own: a rack's mean load-adjusted rise averages away the per-GPU noise
and so sees coolant loss minutes before any one GPU crosses a threshold, and which racks
rise together decides the cause of every thermal finding: one rack, ``cooling``; most
racks of a cluster, ``ambient``; one GPU or one stack, ``thermal``.
"""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode, Hysteresis, make_finding
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import decay
from hbmwatch.detectors.thermal_layout import FleetLayout
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.taxonomy import Cause, FindingKind


class RackWarming:
    """Rack-wide findings and heat scope of ``ThermalExcursions``, as a mixin over its rack
    thresholds, its ``racks_`` table and its ``rack_open_`` gate."""

    name: str
    rack_enter_c: float
    stack_enter_c: float
    peer_enter_c: float
    rack_fraction: float
    rack_min_gpus: int
    rack_half_life_s: float
    racks_: EntityTable
    rack_open_: Hysteresis
    gpu_open_: Hysteresis

    def _gpu_causes(
        self, frame: Frame, row: int, worst: int, rise: np.ndarray, excess: np.ndarray
    ) -> list[RankedCause]:
        labels = frame.gpus.labels[row]
        cluster, rack = labels.get("cluster", ""), labels.get("rack", "")
        rack_ep = self.rack_open_.episodes.get(f"{cluster}/{rack}")
        scope = self._heat_scope(cluster, rack)
        if rack_ep is not None:
            scope = self._rack_scope(rack_ep, cluster, rack)
        stack = worst >= 2
        if scope is not None:
            cause, note = scope
            beyond = self._beyond_rack(frame.gpus.keys[row], worst, excess)
            if beyond is not None:  # its own heat on top of the rack's: two problems
                where = "one HBM stack runs" if stack else "this GPU runs"
                return [
                    RankedCause(Cause.THERMAL, 0.7, summary=(
                        f"{where} {beyond:.0f} C hotter than its "
                        f"{'sibling stacks' if stack else 'rack peers'}, beyond the rack's warming"
                    )),
                    RankedCause(cause, 0.3, summary=note),
                ]  # fmt: skip
            return [
                RankedCause(cause, 0.85, summary=note),
                RankedCause(Cause.THERMAL, 0.15, summary="this GPU runs hot with the others"),
            ]
        where = "one HBM stack runs hotter than its siblings" if stack else "this GPU alone"
        return [RankedCause(Cause.THERMAL, 0.9, summary=f"{where}; its rack's other GPUs do not")]

    def _beyond_rack(self, key: str, worst: int, excess: np.ndarray) -> float | None:
        """How far the worst sensor stands out from what warms with it (its rack peers, or
        its sibling stacks), when that is past its own entry threshold: a stack degraded
        before its rack lost coolant stays its own problem.  The rack's warming lifts its
        peers and siblings too, so it does not count here.  Decided once per episode: the
        gap narrowing as the rack heats its siblings does not make it the rack's."""
        gap = float(excess[worst]) if worst < len(excess) else float("nan")
        enter = self.stack_enter_c if worst >= 2 else self.peer_enter_c
        ep = self.gpu_open_.episodes.get(key)
        if ep is not None and gap >= enter:
            ep.extra["beyond_rack_c"] = max(gap, float(ep.extra.get("beyond_rack_c", gap)))
        held = ep.extra.get("beyond_rack_c") if ep is not None else None
        return float(held) if held is not None else (gap if gap >= enter else None)

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

    def _step_racks(
        self, frame: Frame, lay: FleetLayout, t_ms: int, gpu_rise: np.ndarray
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

    def _rack_scores(self, lay: FleetLayout, t_ms: int, gpu_rise: np.ndarray) -> np.ndarray:
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
