"""Throttling: sustained throttle residency per GPU and reason group, and when it pages.

Works the same way as ``detectors/thermal.py``: vectorised over GPUs, one loop over the
frame's time steps, a per-entity level smoothed by the time between samples (so a 5 s or
30 s scrape interval decays correctly), and ``Hysteresis`` with minimum durations so one
sample never opens or closes a finding.  Each update is clipped at a few times its threshold
before it enters the level, so one throttled sample cannot hold the level over the threshold
for the minimum duration: only sustained residency can.  The helpers at the top are shared
with ``detectors/devices.py`` (link errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hbmwatch.detectors.base import (
    EntityTable,
    Episode,
    Hysteresis,
    SparseGate,
    latest,
    make_finding,
)
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import decay
from hbmwatch.detectors.throttle_paging import Regressions, page_reason
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.settings import DetectionSettings
from hbmwatch.taxonomy import Cause, FindingKind

ENTITY_LABELS = ("cluster", "rack", "host", "gpu", "sku")

#: Throttle reason groups: the frame's signal, the cause, and the exporter metric it comes from.
THROTTLE_GROUPS: tuple[tuple[str, str, Cause, str], ...] = (
    ("power", "thr_power", Cause.POWER_CAP, "power cap"),
    ("hbm", "thr_hbm", Cause.HBM_THERMAL_THROTTLE, "HBM thermal"),
    ("thermal", "thr_thermal", Cause.THERMAL, "thermal"),
)
N_GROUPS = len(THROTTLE_GROUPS)
#: One definition: the setting's default.
PAGE_AFTER_S: float = DetectionSettings.model_fields["throttle_page_after_seconds"].default


def _entity(frame: Frame, row: int, **extra: str) -> dict[str, str]:
    labels = frame.gpus.labels[row]
    out = {k: labels[k] for k in ENTITY_LABELS if labels.get(k)}
    if not out:  # hand-built frames: the key is cluster/host/gpu
        cluster, host, gpu = ([*frame.gpus.keys[row].split("/"), "", ""])[:3]
        out = {k: v for k, v in (("cluster", cluster), ("host", host), ("gpu", gpu)) if v}
    out.update(extra)
    return out


def _dt_s(last_ms: np.ndarray, t_ms: int, step_s: float) -> np.ndarray:
    """Seconds since each entity's previous sample (one step when there was none)."""
    dt = (t_ms - last_ms) / 1000.0
    return np.where(np.isnan(dt) | (dt <= 0), step_s, dt)


def _f(value: float) -> float:
    return float(np.nan_to_num(value))


class Throttling:
    """Sustained throttle residency per GPU and reason group (power, HBM thermal, thermal).

    Why: a throttled GPU runs at lower clocks or memory bandwidth, which is the most direct
    device-side cause of a p99 or step-time regression; the reason group names the cause
    (power cap, HBM thermal throttle, die thermal).  Residency is the fraction of time the
    reason is active (the exporters' residency counters, or the active flag), smoothed with
    a half-life of ``half_life_s``; a finding opens when it stays at or over
    ``min_residency`` for ``min_on_s`` and closes when it stays under ``exit_ratio`` of it for
    ``min_off_s``.  The evidence carries the clock drop against the GPU's own unthrottled clock
    baseline, so the size of the effect is visible next to its cause.

    Throttling that hurts nobody is not a page (``detectors/throttle_paging.py``): a finding
    is ``info`` until it has lasted ``page_after_s`` or a workload regression is open on its
    GPU, then ``warning``.  Residency hovering at the threshold (a daily peak) must not
    close and reopen it: it closes only after ``min_off_s`` under ``exit_ratio`` of it.

    Parameters: ``min_residency`` (fraction of time throttled), ``min_on_s``, ``min_off_s``,
    ``exit_ratio``, ``half_life_s`` (residency smoothing), ``clock_half_life_s`` (how fast the
    unthrottled clock baseline follows the GPU), ``page_after_s``.

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
    >>> def frame(t0, thr):
    ...     gpus = Entities()
    ...     gpus.add("c/h/0", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0"})
    ...     n = len(thr)
    ...     f = Frame(t0, 1000, n, gpus, Entities(), Entities(), {}, np.full((1, 8, n), np.nan),
    ...               {}, {}, {}, {}, {})
    ...     f.gpu["thr_power"] = np.array([thr], dtype=float)
    ...     f.gpu["clock"] = np.where(np.array([thr]) > 0, 1300.0, 1980.0)
    ...     return f
    >>> rng = np.random.default_rng(0)
    >>> det = Throttling()
    >>> det.update(frame(0, (rng.random(60) < 0.03).astype(float)))  # rare blips
    []
    >>> found = det.update(frame(60_000, [1.0] * 30))
    >>> [f"{f.kind} {f.entity['reason']} {f.top_cause}" for f in found]
    ['throttle power power_cap']
    """

    name = "throttle"

    def __init__(
        self,
        *,
        min_residency: float = 0.2,
        min_on_s: float = 10.0,
        min_off_s: float = 300.0,
        exit_ratio: float = 0.5,
        half_life_s: float = 5.0,
        clock_half_life_s: float = 600.0,
        page_after_s: float = PAGE_AFTER_S,
        page_clock_drop: float = 0.1,
    ) -> None:
        self.min_residency = min_residency
        self.min_on_s = min_on_s
        self.min_off_s = min_off_s
        self.exit_ratio = exit_ratio
        self.half_life_s = half_life_s
        self.clock_half_life_s = clock_half_life_s
        self.page_after_s = page_after_s
        self.page_clock_drop = page_clock_drop
        self._regressions = Regressions()
        self._init_state()

    def _init_state(self) -> None:
        #: ``level_`` decides (updates clipped); ``residency_`` is what the evidence reports;
        #: ``costly_s_``: seconds of the open episode with the clock ``page_clock_drop`` down.
        self.residency_ = EntityTable(
            {"level_": 0.0, "residency_": 0.0, "last_ms_": np.nan, "costly_s_": 0.0}
        )
        self.clocks_ = EntityTable({"base_": np.nan, "clock_": np.nan})
        self.open_ = Hysteresis(
            enter=1.0, exit=self.exit_ratio, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )

    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        if not 0 < self.min_residency <= 1 or not 0 < self.exit_ratio <= 1:
            raise ValueError("min_residency and exit_ratio must be in (0, 1]")
        if self.page_after_s < 0:
            raise ValueError("page_after_s must not be negative")
        self._regressions = Regressions.of(frame.open_findings)
        thr = np.stack([frame.g(sig) for _, sig, _, _ in THROTTLE_GROUPS], axis=1)  # (G, 3, T)
        clock = frame.g("clock")
        keys = [f"{g}#{grp}" for g in frame.gpus.keys for grp, *_ in THROTTLE_GROUPS]
        rows = self.residency_.rows(keys)
        crows = self.clocks_.rows(frame.gpus.keys)
        step_s = frame.step_ms / 1000.0
        gate = SparseGate(self.open_, keys)
        res = self.residency_
        level, shown, last = (res[f][rows] for f in ("level_", "residency_", "last_ms_"))
        costly = res["costly_s_"][rows]
        cap = 3.0 * self.min_residency  # one throttled sample moves the level by < 1
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            x = thr[:, :, i].ravel()
            known = ~np.isnan(x)
            a = decay(_dt_s(last, t_ms, step_s), self.half_life_s)
            level = np.where(known, level + a * (np.minimum(x, cap) - level), level)
            shown = np.where(known, shown + a * (x - shown), shown)
            last = np.where(known, t_ms, last)
            score = np.where(known, level / self.min_residency, np.nan)
            self._learn_clock(crows, clock[:, i], level.reshape(n, N_GROUPS), frame)
            opened, closed = gate.step(score, t_ms)
            costly = np.where(gate.open, costly + step_s * self._slowed(crows), 0.0)
            if not (opened or closed):
                continue
            res["level_"][rows], res["residency_"][rows], res["last_ms_"][rows] = level, shown, last
            res["costly_s_"][rows] = costly
            for key in opened:
                start = int(self.open_.over_since(key))
                self.open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            findings += [self._finding(frame, k, t_ms) for k in opened]
            findings += [self._finding(frame, k, t_ms, end=t_ms) for k in closed]
            for key in closed:
                self.open_.episodes.pop(key, None)
        res["level_"][rows], res["residency_"][rows], res["last_ms_"][rows] = level, shown, last
        res["costly_s_"][rows] = costly
        end_ms = int(frame.times_ms[-1])
        present = set(frame.gpus.keys)
        findings += [
            self._finding(frame, k, end_ms)
            for k in self.open_.episodes
            if k.rsplit("#", 1)[0] in present
        ]
        return latest(findings)

    def _slowed(self, crows: np.ndarray) -> np.ndarray:
        """Per GPU and group: 1 where the clock is ``page_clock_drop`` under its baseline."""
        c = self.clocks_
        with np.errstate(divide="ignore", invalid="ignore"):
            drop = 1.0 - c["clock_"][crows] / c["base_"][crows]
        return np.repeat(np.nan_to_num(drop) >= self.page_clock_drop, N_GROUPS).astype(float)

    def _learn_clock(
        self, crows: np.ndarray, clock: np.ndarray, level: np.ndarray, frame: Frame
    ) -> None:
        """The unthrottled clock baseline learns only while no reason group is near active."""
        c = self.clocks_
        known = ~np.isnan(clock)
        calm = (level < self.exit_ratio * self.min_residency).all(axis=1)
        base = c["base_"][crows]
        a = decay(frame.step_ms / 1000.0, self.clock_half_life_s)
        learn = known & calm
        c["base_"][crows] = np.where(
            learn, np.where(np.isnan(base), clock, base + a * (clock - base)), base
        )
        c["clock_"][crows] = np.where(known, clock, c["clock_"][crows])

    def _finding(self, frame: Frame, key: str, t_ms: int, end: int | None = None) -> Finding:
        gkey, group = key.rsplit("#", 1)
        grow = frame.gpus.index[gkey]
        _, signal, cause, words = next(g for g in THROTTLE_GROUPS if g[0] == group)
        ep = self.open_.episodes.get(key) or Episode(t_ms, t_ms)
        residency = float(self.residency_["residency_"][self.residency_.index[key]])
        ep.peak = max(ep.peak, residency)
        crow = self.clocks_.index[gkey]
        base, clock = float(self.clocks_["base_"][crow]), float(self.clocks_["clock_"][crow])
        drop = 1.0 - clock / base if base > 0 and not np.isnan(clock) else float("nan")
        clock_series = frame.series_of("gpu", gkey, "clock")
        evidence = [
            Evidence(frame.series_of("gpu", gkey, signal), "throttle_residency", residency,
                     self.min_residency, ep.started_ms, t_ms,
                     note=f"{words} throttling, peak residency {ep.peak:.0%}"),
            Evidence(clock_series, "clock_drop_vs_own_baseline", _f(drop), None, ep.started_ms,
                     t_ms, note=f"{_f(clock):.0f} now vs {_f(base):.0f} unthrottled"
                     if not np.isnan(drop) else "no unthrottled clock baseline yet"),
        ]  # fmt: skip
        effect = f", clock {drop:.0%} below its own baseline" if drop > 0.02 else ""
        summary = f"{words} throttling {residency:.0%} of the time (peak {ep.peak:.0%}){effect}"
        entity = _entity(frame, grow, reason=group)
        costly_s = float(self.residency_["costly_s_"][self.residency_.index[key]])
        pages = ep.extra.get("pages") or page_reason(
            self._regressions, entity, costly_s, self.page_after_s, self.page_clock_drop
        )
        if pages and key in self.open_.episodes:  # once it pages, the episode keeps paging
            ep.extra["pages"] = pages
        summary += f"; pages: {pages}" if pages else "; no workload slower for it yet"
        return make_finding(
            kind=FindingKind.THROTTLE, detector=self.name, entity=entity,
            severity=Severity.WARNING if pages else Severity.INFO,
            summary=summary, started_ms=ep.started_ms, raised_ms=ep.raised_ms, updated_ms=t_ms,
            ended_ms=end, evidence=evidence,
            causes=[RankedCause(cause, 0.9, summary=f"{words} throttle residency sustained")],
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {
            "residency": self.residency_.state_dict(),
            "clocks": self.clocks_.state_dict(),
            "open": self.open_.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.residency_.load_state_dict(state.get("residency", {}))
        self.clocks_.load_state_dict(state.get("clocks", {}))
        self.open_.load_state_dict(state.get("open", {}))
