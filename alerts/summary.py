"""What an incident says: its ranked causes, severity and title, from its problem.

The title used to be the summary of whichever alert changed last, so a rack losing coolant
read "hotspot at 62 C: -0.4 C over its baseline, -34.1 C/min".  It now names the incident's
place and top cause and states only what its findings' evidence holds, at its peak so far:
"rack r0 (c0) cooling: HBM +38 C over 4 min on 16 GPUs, p99 up to 2.4x on 16 services".
A cause that carries no evidence series is capped and says so, rather than read as sure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from hbmwatch.alerts.grouping import KIND_CAUSE, REGRESSIONS, family_of
from hbmwatch.gpu_errors import Action, lookup
from hbmwatch.records import Evidence, Finding, RankedCause, Severity, capped_if_unevidenced
from hbmwatch.taxonomy import Cause, FindingKind

SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
MAX_CAUSES = 5
MAX_CAUSE_EVIDENCE = 4

_RISES = ("rise_over_load_baseline_c", "rack_mean_rise_c")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_PLACE = ("cluster", "rack", "host", "gpu", "target")
_HEAT_KINDS = (FindingKind.THERMAL_EXCURSION, FindingKind.THROTTLE, FindingKind.FLEET_OUTLIER)
#: Causes known from a workload's slowdown alone: their titles lead with it.
_SLOWDOWN = frozenset({Cause.CO_TENANT, Cause.NONE})


def _with_evidence(f: Finding) -> list[RankedCause]:
    """The finding's causes; its top cause carries the finding's own evidence and place
    when it has none of its own (a rack warming is the evidence for that rack's cooling)."""
    causes = list(f.causes) or [
        RankedCause(KIND_CAUSE.get(f.kind, Cause.NONE), 0.5, summary=f.summary)
    ]
    top = causes[0]
    if top.cause == Cause.NONE:
        return causes
    if not top.evidence and f.evidence:
        top = dataclasses.replace(top, evidence=tuple(f.evidence[:MAX_CAUSE_EVIDENCE]))
    if not top.entity and f.kind not in REGRESSIONS:  # a regression's cause is elsewhere
        top = dataclasses.replace(top, entity=_where(str(top.cause), f.entity))
    causes[0] = top
    return causes


def _where(cause: str, entity: Mapping[str, str]) -> dict[str, str]:
    """The place a cause is about: a rack's cooling, a cluster's heat, else the device."""
    wide = {Cause.AMBIENT: 1, Cause.COOLING: 2}
    keys = _PLACE[: wide[cause]] if cause in wide else _PLACE
    return {k: entity[k] for k in keys if entity.get(k)}


def incident_causes(findings: Sequence[Finding], family: str) -> tuple[RankedCause, ...]:
    """The best statement of each cause across the findings, its evidence pooled; causes
    of the incident's family first (they are why its alerts are one incident)."""
    best: dict[str, RankedCause] = {}
    pooled: dict[str, list[Evidence]] = {}
    for f in findings:
        for c in _with_evidence(f):
            name = str(c.cause)
            if name not in best or c.confidence > best[name].confidence:
                best[name] = c
            have = pooled.setdefault(name, [])
            for e in c.evidence:
                if len(have) < MAX_CAUSE_EVIDENCE and all(
                    (e.series, e.statistic) != (h.series, h.statistic) for h in have
                ):
                    have.append(e)
    out = []
    for name, c in best.items():
        out.append(capped_if_unevidenced(dataclasses.replace(c, evidence=tuple(pooled[name]))))
    out.sort(key=lambda c: (family_of(str(c.cause)) != family, -c.confidence))
    return tuple(out[:MAX_CAUSES])


def severity_of(live: Iterable[Severity], fallback: Severity) -> Severity:
    return max(live, key=SEVERITY_RANK.__getitem__, default=fallback)


def title(place: str, cause: str, findings: Sequence[Finding], peaks: dict[str, float]) -> str:
    """``{place} {cause}: {facts}``; ``peaks`` holds the largest figures seen so far.

    A cause read only from a workload's slowdown (a co-tenant) states the slowdown first:
    a throttle that joined its page is a symptom beside it."""
    facts = [
        _heat(findings, peaks),
        _throttle(findings, peaks),
        _gpu_errors(findings),
        _errors(findings, peaks),
        _down(findings),
    ]
    slower = [
        _regressions(findings, peaks, FindingKind.P99_REGRESSION, "p99"),
        _regressions(findings, peaks, FindingKind.STEP_TIME_REGRESSION, "step time"),
    ]
    facts = [*slower, *facts] if family_of(cause) in _SLOWDOWN else [*facts, *slower]
    text = ", ".join(f for f in facts if f)
    if not text:  # nothing it knows a figure for (a stuck sensor): its first finding's words
        text = findings[0].summary if findings else "no finding"
    return f"{place} {cause}: {text}"


def _peak(peaks: dict[str, float], key: str, value: float) -> float:
    peaks[key] = max(peaks.get(key, value), value)
    return peaks[key]


def _gpus(findings: Iterable[Finding]) -> str:
    gpus = sorted({(f.entity.get("host", ""), f.entity.get("gpu", "")) for f in findings
                   if f.entity.get("gpu")})  # fmt: skip
    if len(gpus) == 1:
        return f" on {gpus[0][0]} gpu {gpus[0][1]}"
    return f" on {len(gpus)} GPUs" if gpus else ""


def _stat(f: Finding, names: Sequence[str]) -> Evidence | None:
    got = [e for e in f.evidence if e.statistic in names]
    return max(got, key=lambda e: e.value) if got else None


def _heat(findings: Sequence[Finding], peaks: dict[str, float]) -> str:
    hot = [f for f in findings if f.kind == FindingKind.THERMAL_EXCURSION]
    rises = [e for e in (_stat(f, _RISES) for f in hot) if e is not None and e.value > 0]
    where = _gpus(f for f in findings if f.kind in _HEAT_KINDS)
    if not rises and "rise" not in peaks:  # no rise to state: how hot it is, if known
        temps = [e for e in (_stat(f, ("temperature_c",)) for f in hot) if e is not None]
        if not temps:
            return ""
        e = max(temps, key=lambda e: e.value)
        return f"{_sensor(e)} at {_peak(peaks, 'temp', e.value):.0f} C{where}"
    e = max(rises, key=lambda e: e.value) if rises else None
    if e is not None and e.value >= peaks.get("rise", 0.0):  # the sensor of the peak
        peaks["hotspot"] = float(_sensor(e) == "hotspot")
    rise = _peak(peaks, "rise", e.value) if e else peaks["rise"]
    if e is not None and e.window_start_ms:
        _peak(peaks, "rise_min", ((e.window_end_ms or 0) - e.window_start_ms) / 60_000)
    minutes = peaks.get("rise_min", 0.0)
    over = f" over {minutes:.0f} min" if minutes >= 1 else ""
    sensor = "hotspot" if peaks.get("hotspot") else "HBM"
    return f"{sensor} {rise:+.0f} C{over}{where}"


def _sensor(e: Evidence) -> str:
    return "HBM" if "memory" in e.series or "hbm" in e.series else "hotspot"


def _throttle(findings: Sequence[Finding], peaks: dict[str, float]) -> str:
    held = [f for f in findings if f.kind == FindingKind.THROTTLE]
    if not held or any(f.kind == FindingKind.THERMAL_EXCURSION for f in findings):
        return ""
    res = max((e.value for f in held for e in f.evidence
               if e.statistic == "throttle_residency"), default=0.0)  # fmt: skip
    reasons = "/".join(sorted({f.entity.get("reason", "") for f in held} - {""}))
    share = f" {_peak(peaks, 'residency', res):.0%} of the time" if res else ""
    return f"{reasons or 'clock'} throttling{share}{_gpus(held)}"


def _errors(findings: Sequence[Finding], peaks: dict[str, float]) -> str:
    out = []
    for kind, what in ((FindingKind.PCIE_ERRORS, "PCIe"), (FindingKind.FABRIC_ERRORS, "fabric")):
        found = [f for f in findings if f.kind == kind]
        rates = [e.value for f in found for e in f.evidence if e.statistic == "errors_per_second"]
        if found:
            rate = f" {_peak(peaks, kind, max(rates)):.3g}/s" if rates else ""
            out.append(f"{what} errors{rate}{_gpus(found)}")
    return ", ".join(out)


def _gpu_errors(findings: Sequence[Finding]) -> str:
    """``XID 79 (GPU has fallen off the bus, fatal) on n1 gpu 3``: the code and its meaning,
    worst first (the detector lists a finding's codes worst first)."""
    found = sorted((f for f in findings if f.kind == FindingKind.GPU_ERRORS),
                   key=lambda f: -SEVERITY_RANK[f.severity])  # fmt: skip
    out: list[str] = []
    for f in found:
        fact = _gpu_error(f) + _gpus([f])
        if fact not in out:
            out.append(fact)
    return ", ".join(out)


def _gpu_error(f: Finding) -> str:
    """The worst thing a finding holds: a fatal or reset code, a failed remap, a failed
    health verdict (with the codes that came with it), else a storm of benign codes."""
    codes, found = [], set()
    for e in f.evidence:
        labels = dict(_LABEL.findall(e.series))
        if e.statistic == "error_events" and labels.get("code", "").isdigit():
            codes.append((lookup(labels.get("scheme", ""), labels["code"]), e.value))
        found.add(e.statistic)
    for code, _ in codes:
        if code.action in (Action.FATAL, Action.NEEDS_RESET):
            action = "fatal" if code.action is Action.FATAL else "needs reset"
            return f"{code.scheme.upper()} {code.code} ({code.meaning}, {action})"
    names = ", ".join(f"{c.scheme.upper()} {c.code}" for c, _ in codes)
    if "row_remap_failed" in found:
        return "row remap failed" + (f" ({names})" if names else "")
    if "health_status" in found:
        return "health verdict fail" + (f" ({names})" if names else "")
    if codes:
        n = sum(v for _, v in codes)
        return f"{names} storm ({n:.0f} events)"
    return "GPU errors"


def _down(findings: Sequence[Finding]) -> str:
    down = sorted({f.entity.get("target", "") for f in findings
                   if f.top_cause == Cause.TARGET_DOWN} - {""})  # fmt: skip
    if len(down) == 1:
        return f"target {down[0]} down"
    return f"{len(down)} targets down" if down else ""


def _regressions(findings: Sequence[Finding], peaks: dict[str, float], kind: str, what: str) -> str:
    regs = [f for f in findings if f.kind == kind and f.kind in REGRESSIONS]
    if not regs:
        return ""
    ratios = [e.value for f in regs for e in f.evidence if e.statistic == "p99_over_baseline_ratio"]
    ratio = _peak(peaks, kind, max(ratios)) if ratios else 0.0
    names = sorted({_workload(f.entity) for f in regs})
    services = {f.entity.get("service", "") for f in regs}
    figure = f" {ratio:.1f}x" if ratio else ""
    if len(names) == 1 or len(services) == 1:
        where = names[0] if len(names) == 1 else next(iter(services))
        return f"{what}{' up to' if len(names) > 1 and figure else ''}{figure} on {where}"
    return f"{what}{' up to' if figure else ''}{figure} on {len(services)} services"


def _workload(entity: Mapping[str, str]) -> str:
    return "/".join(v for v in (entity.get("service", ""), entity.get("phase", "")) if v)
