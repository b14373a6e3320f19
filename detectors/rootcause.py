"""Root cause: for each latency regression, what changed first on the same GPU, node and rack.

A regression (p99 or training step time) names a workload; its GPU (or, for a training job
that names only its node, every GPU of the node) is looked up in the context ring, and
each candidate cause is measured over two windows: a baseline before the regression and
the span from shortly before its start to now.  A candidate's strength is its change
between the windows against a reference size (``REFS``), weighed by

* **temporal precedence**: a cause starts before, or with, the regression, not after it:
  one that started more than ``lead_s`` after the regression is weighed down and never
  ranked first (a GEMM's power cap 60 s after a copy slowed the requests did not cause it);
* **lagged correlation**: the candidate leading the workload's latency excess by 0-30 s.

A GPU error is the one candidate read from a finding rather than a signal: a critical
``gpu_errors`` finding open on the GPU explains the regression outright
(``detectors/rootcause_errors.py``).

Every cause names its entity (the GPU, rack or cluster it is about) and carries the
evidence series with its window, lag and strength; a cause without evidence (``none``)
is never shown as confident.

Thermal candidates (the load-adjusted temperature rise, thermal and HBM-thermal throttle
residency) collapse into one, because a throttle is how heat reaches latency, not a cause
of its own.  It is named from the evidence first (``detectors/heatscope.py``: ``cooling``
when most of the GPU's rack rose with it, ``ambient`` when several racks did), then from
the thermal findings open on the rack or the GPU (``thermal`` for one GPU).  A rise without
any throttling counts for little: memory at 54 C is far from every limit and slows
nothing.  When the thermal candidate is weak the ranking says so ("no thermal cause"):
DOMAIN.md's H200 trace shows memory warming under a co-tenant's copy while the copy, not
the heat, raised p99 (and a real capture in docs/device-runs shows the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.heatscope import heat_scope
from hbmwatch.detectors.leadlag import change, lagged_corr, onset, resolution
from hbmwatch.detectors.rootcause_errors import gpu_error_cause, gpu_error_findings
from hbmwatch.records import (
    NO_EVIDENCE,
    Evidence,
    Finding,
    RankedCause,
    capped_if_unevidenced,
    cause_from_dict,
)
from hbmwatch.taxonomy import Cause, FindingKind

REGRESSIONS = (FindingKind.P99_REGRESSION, FindingKind.STEP_TIME_REGRESSION)

#: Candidate -> (context signal, statistic, reference change that counts as strength 1).
REFS: dict[str, tuple[str, str, float]] = {
    "thermal_rise": ("thermal_rise", "max", 5.0),  # C over the load-adjusted baseline
    "thr_hbm": ("thr_hbm", "mean", 0.2),  # fraction of time throttled
    "thr_thermal": ("thr_thermal", "mean", 0.2),
    "thr_power": ("thr_power", "mean", 0.2),
    "power_limit": ("power_limit", "drop", 0.1),  # relative drop of the limit
    "clock": ("clock", "drop", 0.15),  # relative drop of the compute clock
    "fabric_errors": ("fabric_errors", "mean", 2.0),  # errors per second
    "pcie_replays": ("pcie_replays", "mean", 20.0),  # replays per second
    "bw": ("bw", "level", 0.1),  # utilisation past 0.85
    "bw_dev": ("bw_dev", "mean", 0.05),  # bandwidth over the GPU's own baseline
}
CANDIDATES: dict[Cause, tuple[str, ...]] = {
    Cause.THERMAL: ("thermal_rise", "thr_hbm", "thr_thermal"),
    Cause.POWER_CAP: ("thr_power", "power_limit"),
    Cause.CLOCK_DROP: ("clock",),
    Cause.FABRIC: ("fabric_errors",),
    Cause.PCIE: ("pcie_replays",),
    Cause.MEMORY_BANDWIDTH: ("bw",),
    Cause.CO_TENANT: ("bw_dev",),
}
#: A mechanism rather than a root cause: it ranks under the cause that explains it.
WEIGHT = {Cause.CLOCK_DROP: 0.5, Cause.MEMORY_BANDWIDTH: 0.7}
SAME_GPU_ONLY = (Cause.CO_TENANT, Cause.MEMORY_BANDWIDTH)
#: A signal measured over a detector's learned baseline -> the raw signal it stands on.
OWN_BASELINE = {"bw_dev": "bw"}
#: Heat slows work only through throttling: a rise with no throttle is weak evidence.
MECHANISM_FREE = {"thermal_rise": 0.3}
#: A cause that started after the regression explains it poorly: weighed down, never first.
LATE = 0.25
PLACE_LABELS = ("cluster", "rack", "host", "gpu")


@dataclasses.dataclass(frozen=True)
class Measured:
    """One candidate signal on its worst GPU: strength (0..1), evidence, where, how late."""

    strength: float
    evidence: Evidence | None = None
    key: str = ""
    late: bool = False


@dataclasses.dataclass
class Scored:
    """One candidate cause: its strength and the signals that gave it."""

    strength: float
    cause: Cause
    evidence: list[Evidence]
    key: str
    late: bool
    summary: str = ""
    entity: dict[str, str] | None = None


class RootCause:
    """Ranks candidate causes for every open latency regression and attaches them.

    Runs after the thermal and latency detectors, reading the context ring the runner keeps
    (``frame.context``) and the findings open so far (``frame.open_findings``).  A ranking
    is redone every cycle for ``rank_for_s`` after a regression starts, then kept.
    """

    name = "rootcause"

    def __init__(
        self,
        *,
        baseline_s: float = 300.0,
        guard_s: float = 60.0,
        rank_for_s: float = 300.0,
        min_strength: float = 0.25,
        max_lag_s: float = 30.0,
        lead_s: float = 30.0,
    ) -> None:
        self.baseline_s = baseline_s
        self.lead_s = lead_s
        self.guard_s = guard_s
        self.rank_for_s = rank_for_s
        self.min_strength = min_strength
        self.max_lag_s = max_lag_s
        self.ranked_: dict[str, dict[str, Any]] = {}

    def update(self, frame: Frame) -> list[Finding]:
        ctx = frame.context
        if ctx is None or frame.steps == 0:
            return []
        now = frame.end_ms
        open_ids = set()
        out = []
        thermal = [f for f in frame.open_findings if f.kind == FindingKind.THERMAL_EXCURSION]
        errors = gpu_error_findings(frame.open_findings)
        for f in frame.open_findings:
            if f.kind not in REGRESSIONS:
                continue
            open_ids.add(f.id)
            cached = self.ranked_.get(f.id)
            if cached is None or now - f.started_ms <= self.rank_for_s * 1000:
                causes = self.rank(frame, f, thermal, now, errors)
                self.ranked_[f.id] = {"causes": [dataclasses.asdict(c) for c in causes]}
            else:
                causes = [cause_from_dict(c) for c in cached["causes"]]
            if tuple(causes) != f.causes:
                out.append(dataclasses.replace(f, causes=tuple(causes), updated_ms=now))
        self.ranked_ = {k: v for k, v in self.ranked_.items() if k in open_ids}
        return out

    # -- ranking ----------------------------------------------------------------------------
    def rank(
        self, frame: Frame, reg: Finding, thermal: Sequence[Finding], now: int,
        errors: Sequence[Finding] = (),
    ) -> list[RankedCause]:  # fmt: skip
        ctx = frame.context
        gpus = _gpus_of(ctx, reg.entity)
        start = reg.started_ms
        lo, cut = start - int(self.baseline_s * 1000), start - int(self.guard_s * 1000)
        wkey = f"{reg.entity.get('service', '')}/{reg.entity.get('phase', '')}"
        _, lat = ctx.window("wl", [wkey], "lat_excess", lo, now)
        lat = lat[0] if len(lat) else np.array([])
        scored: list[Scored] = []
        strengths: dict[str, float] = {}
        for cause, names in CANDIDATES.items():
            keys = gpus[:1] if cause in SAME_GPU_ONLY and reg.entity.get("gpu") else gpus
            got = Scored(0.0, cause, [], keys[0], False)
            top = Measured(0.0)
            for name in names:
                m = self._measure(frame, keys, name, (lo, cut, start, now), lat)
                if m.evidence is not None:
                    got.evidence.append(m.evidence)
                strengths[name] = m.strength
                s = m.strength * MECHANISM_FREE.get(name, 1.0)
                if s > got.strength:
                    got.strength, top = s, m
            got.key, got.late = top.key or keys[0], top.late
            got.strength *= WEIGHT.get(cause, 1.0) * (LATE if got.late else 1.0)
            scored.append(got)
        found = gpu_error_cause(errors, gpus, start, self.lead_s)
        if found is not None:
            strength = found.strength * (LATE if found.late else 1.0)
            scored.append(Scored(strength, Cause.GPU_ERROR, list(found.evidence), found.key,
                                 found.late, found.summary, found.entity))  # fmt: skip
        # What started before the regression first, then by strength.
        scored.sort(key=lambda c: (c.late, -c.strength))
        span = (lo, cut, start, now)
        return self._causes(frame, scored, reg, thermal, strengths.get("thr_hbm", 0.0), span)

    def _measure(
        self,
        frame: Frame,
        keys: Sequence[str],
        name: str,
        span: tuple[int, int, int, int],
        lat: np.ndarray,
    ) -> Measured:
        """One candidate signal's strength on its worst GPU, and the evidence for it."""
        lo, cut, start, now = span
        signal, stat, ref = REFS[name]
        times, values = frame.context.window("gpu", keys, signal, lo, now)
        if signal in OWN_BASELINE and np.isnan(values[:, times < cut]).all():
            # The detector's own baseline was not learned before the regression (a GPU seen
            # minutes ago): the raw signal against the regression's baseline window stands in.
            signal = OWN_BASELINE[signal]
            times, values = frame.context.window("gpu", keys, signal, lo, now)
        if values.size == 0 or np.isnan(values).all():
            return Measured(0.0)
        base, inc = values[:, times < cut], values[:, times >= cut]
        moved = change(stat, base, inc)  # per GPU
        if np.isnan(moved).all():
            return Measured(0.0)
        row = int(np.nanargmax(moved))
        strength = float(np.clip(moved[row] / ref, 0.0, 1.0))
        began = onset(times, values[row], base[row], ref, stat)
        corr, lag = lagged_corr(values[row], lat, int(self.max_lag_s * 1000 // resolution(times)))
        late = strength > 0 and began is not None and began > start + self.lead_s * 1000
        strength *= 0.6 + 0.4 * max(corr, 0.0)
        ev = Evidence(
            series=_series(frame, keys[row], signal),
            statistic=f"{stat} change vs the {self.baseline_s:.0f} s before",
            value=float(np.nan_to_num(moved[row])),
            threshold=ref,
            window_start_ms=cut,
            window_end_ms=now,
            lag_seconds=lag * resolution(times) / 1000.0,
            strength=round(corr, 3),
            note=_when(began, start),
        )
        return Measured(strength, ev, keys[row], late)

    def _causes(
        self, frame: Frame, scored: list[Scored], reg: Finding, thermal: Sequence[Finding],
        hbm_throttle: float, span: tuple[int, int, int, int],
    ) -> list[RankedCause]:  # fmt: skip
        total = sum(c.strength for c in scored) or 1.0
        labels = frame.context.gpu_labels
        out = []
        for c in scored:
            if c.strength < 0.05:
                continue
            name, entity = c.cause, c.entity or _place(labels.get(c.key, reg.entity))
            evidence, summary = list(c.evidence), c.summary
            if c.cause is Cause.THERMAL:
                scope = heat_scope(frame.context, c.key, span)
                if scope is not None:
                    name, entity, summary = scope.cause, scope.entity, scope.summary
                    evidence.insert(0, scope.evidence)
                else:
                    name, note = _thermal_label(reg, thermal, hbm_throttle)
                    entity = _widen(name, entity)
                    summary = "; ".join(x for x in (_summary(entity, evidence), note) if x)
            conf = round(c.strength / max(total, 1.0), 3)
            summary = summary or _summary(entity, evidence)
            if c.late:
                summary += "; it started after the regression"
            out.append(RankedCause(name, conf, tuple(evidence), summary, entity))
        best = next((c.strength for c in scored if not c.late), 0.0)
        if not out or best < self.min_strength or scored[0].late:
            out.insert(0, _no_cause(reg, best))
        thermal_strength = next(c.strength for c in scored if c.cause is Cause.THERMAL)
        if thermal_strength < self.min_strength:
            top = out[0]
            note = f"{top.summary}; " if top.summary else ""
            out[0] = dataclasses.replace(top, summary=note + "no thermal cause")
        return [capped_if_unevidenced(c) for c in out[:5]]

    def state_dict(self) -> dict[str, Any]:
        return {"ranked": self.ranked_}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ranked_ = dict(state.get("ranked", {}))


def _gpus_of(ctx: Any, entity: Mapping[str, str]) -> list[str]:
    cluster, host, gpu = entity.get("cluster", ""), entity.get("host", ""), entity.get("gpu")
    if gpu:
        return [f"{cluster}/{host}/{gpu}"]
    prefix = f"{cluster}/{host}/"
    return [k for k in ctx.gpu_labels if k.startswith(prefix)] or [prefix]


def _series(frame: Frame, key: str, signal: str) -> str:
    if signal == "thermal_rise":
        return "load-adjusted rise of " + frame.series_of("gpu", key, "mem_temp")
    if signal == "bw_dev":
        return "excess over its baseline of " + frame.series_of("gpu", key, "bw")
    return frame.series_of("gpu", key, signal)


def _thermal_label(
    reg: Finding, thermal: Sequence[Finding], hbm_throttle: float
) -> tuple[Cause, str]:
    """Name the heat: from the open thermal finding of the rack, else of the GPU."""
    e = reg.entity
    rack = [f for f in thermal if f.entity.get("rack") == e.get("rack") and "host" not in f.entity]
    gpu = [
        f for f in thermal
        if f.entity.get("host") == e.get("host")
        and (not e.get("gpu") or f.entity.get("gpu") == e.get("gpu"))
    ]  # fmt: skip
    for found in (rack, gpu):
        if found and found[0].top_cause:
            return Cause(found[0].top_cause), found[0].summary
    if hbm_throttle >= 0.5:
        return Cause.HBM_THERMAL_THROTTLE, "HBM thermal throttling on this GPU"
    return Cause.THERMAL, ""


def _place(labels: Mapping[str, str]) -> dict[str, str]:
    """Where a cause is: the canonical placement labels (cluster, rack, host, gpu)."""
    return {k: str(labels[k]) for k in PLACE_LABELS if labels.get(k) not in (None, "")}


def _widen(cause: Cause, entity: Mapping[str, str]) -> dict[str, str]:
    """A rack's or a room's heat is about the rack or the cluster, not the one GPU."""
    keep = {Cause.COOLING: ("cluster", "rack"), Cause.AMBIENT: ("cluster",)}.get(cause)
    return {k: v for k, v in entity.items() if keep is None or k in keep}


def _where(entity: Mapping[str, str]) -> str:
    if "gpu" in entity:
        return f"{entity.get('host', '?')} GPU {entity['gpu']}"
    if "host" in entity:
        return str(entity["host"])
    if "rack" in entity:
        return f"rack {entity['rack']}"
    return f"cluster {entity.get('cluster', '?')}"


def _when(onset: int | None, start: int) -> str:
    if onset is None:
        return ""
    lead = (start - onset) / 1000.0
    return f"started {lead:.0f} s before the regression" if lead >= 0 else (
        f"started {-lead:.0f} s after the regression"
    )  # fmt: skip


def _summary(entity: Mapping[str, str], evidence: Sequence[Evidence]) -> str:
    """One line naming where the cause is and its strongest evidence."""
    if not evidence:
        return f"{_where(entity)}: {NO_EVIDENCE}"
    ev = max(evidence, key=lambda e: abs(e.value) / (e.threshold or 1.0))
    signal = ev.series.split("{", 1)[0]
    lead = f", {ev.note}" if ev.note else ""
    corr = f", leads latency by {ev.lag_seconds:.0f} s (r {ev.strength:.2f})" if ev.strength else ""
    return f"{_where(entity)}: {signal} {ev.value:+.3g} (ref {ev.threshold:g}){lead}{corr}"


def _no_cause(reg: Finding, best: float) -> RankedCause:
    return RankedCause(
        Cause.NONE,
        round(1.0 - best, 3),
        (),
        "no cause found on the same GPU, node or rack before the regression",
        _place(reg.entity),
    )
