"""What a ``gpu_errors`` finding says: the code, its meaning and action, and its evidence.

Apart from the detector (``detectors/gpu_errors.py``) because the words follow the code
table (``hbmwatch/gpu_errors.py``) and on-call reads them first: "XID 79 on r0-node1 GPU 3:
GPU has fallen off the bus (fatal)".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hbmwatch.detectors.base import Episode, make_finding
from hbmwatch.detectors.frame import Frame
from hbmwatch.gpu_errors import Action, ErrorCode, lookup
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.taxonomy import Cause, FindingKind

PLACE = ("cluster", "rack", "host", "gpu")
ACTION_WORDS = {
    Action.FATAL: "fatal",
    Action.NEEDS_RESET: "needs a GPU reset",
    Action.BENIGN: "benign",
    Action.UNKNOWN: "not in the code table",
}
_RANK = {Action.FATAL: 0, Action.NEEDS_RESET: 1, Action.BENIGN: 2, Action.UNKNOWN: 3}


@dataclass(frozen=True)
class Condition:
    """What holds on one GPU now."""

    fatal: bool = False
    reset: bool = False
    storm: bool = False
    storm_events: float = 0.0
    remap_failed: bool = False
    health_failed: bool = False
    health: float = float("nan")
    codes: dict[str, float] = field(default_factory=dict)  # code -> events in the episode
    last_code: dict[str, str] = field(default_factory=dict)  # class -> last code

    @property
    def critical(self) -> bool:
        return self.fatal or self.reset or self.remap_failed or self.health_failed

    @property
    def active(self) -> bool:
        return self.critical or self.storm


def code_of(text: str) -> ErrorCode | None:
    """The table's entry for ``xid:79``, None for text that is not a code."""
    scheme, _, number = text.partition(":")
    return lookup(scheme, number) if scheme and number.isdigit() else None


def code_name(e: ErrorCode) -> str:
    """``XID 79``, ``AFID 12``."""
    return f"{e.scheme.upper()} {e.code}"


def entity_of(frame: Frame, key: str) -> dict[str, str]:
    """The GPU's placement labels (a hand-built frame's key is cluster/host/gpu)."""
    row = frame.gpus.index[key]
    labels = frame.gpus.labels[row]
    out = {k: str(labels[k]) for k in PLACE if labels.get(k)}
    if not out.get("host"):
        cluster, host, gpu = ([*key.split("/"), "", ""])[:3]
        out = {k: v for k, v in (("cluster", cluster), ("host", host), ("gpu", gpu)) if v}
    return out


def _series(metric: str, entity: dict[str, str], **extra: str) -> str:
    labels = {**{k: entity[k] for k in PLACE if entity.get(k)}, **extra}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _where(entity: dict[str, str]) -> str:
    return f"{entity.get('host', '?')} GPU {entity.get('gpu', '?')}"


def headline(cond: Condition, entity: dict[str, str], storm_window_s: float) -> str:
    """The finding's summary: the worst thing that holds, named by its code."""
    where = _where(entity)
    for on, cls in ((cond.fatal, "fatal"), (cond.reset, "reset")):
        if on:
            code = code_of(cond.last_code.get(cls, ""))
            what = "fatal GPU error" if cls == "fatal" else "GPU error that needs a reset"
            text = (f"{code_name(code)} on {where}: {code.meaning} ({ACTION_WORDS[code.action]})"
                    if code else f"{what} on {where}")  # fmt: skip
            return text + ("; row remap failed" if cond.remap_failed else "")
    seen = _seen(cond)
    if cond.remap_failed:
        return f"row remap failed on {where}: no spare row left, the GPU needs service{seen}"
    if cond.health_failed:
        return f"exporter health verdict fail on {where}{seen}"
    code = code_of(cond.last_code.get("benign", ""))
    name = f"{code_name(code)} storm" if code else "GPU error storm"
    meaning = f" ({code.meaning}, {ACTION_WORDS[code.action]})" if code else ""
    minutes = storm_window_s / 60
    return f"{name} on {where}: {cond.storm_events:.0f} events in {minutes:.0f} min{meaning}"


def _seen(cond: Condition) -> str:
    """``; with AFID 30, AFID 25 (not in the code table)``: the codes that came with it."""
    found = [c for c in map(code_of, cond.codes) if c is not None]
    if not found:
        return ""
    names = ", ".join(code_name(c) for c in found)
    unknown = all(c.action is Action.UNKNOWN for c in found)
    return f"; with {names}" + (" (not in the code table)" if unknown else "")


def evidence(det: Any, cond: Condition, entity: dict[str, str], ep: Episode,
             t_ms: int) -> list[Evidence]:  # fmt: skip
    """Each code's events in the episode with its meaning and action; remap and health."""
    out = []
    coded = [(code_of(c), n) for c, n in cond.codes.items()]
    for code, n in sorted((x for x in coded if x[0]), key=lambda x: (_RANK[x[0].action], -x[1])):
        serious = code.action in (Action.FATAL, Action.NEEDS_RESET)
        source = f"; source: {code.source}" if code.source else ""
        out.append(Evidence(
            _series("gpu_error_events_total", entity, scheme=code.scheme, code=str(code.code)),
            "error_events", float(n), 1.0 if serious else float(det.storm_events),
            ep.started_ms, t_ms,
            note=f"{code_name(code)}: {code.meaning}; action: {ACTION_WORDS[code.action]}{source}",
        ))  # fmt: skip
    if cond.remap_failed:
        out.append(Evidence(_series("gpu_row_remap_failed", entity), "row_remap_failed", 1.0,
                            1.0, ep.started_ms, t_ms, note="no spare row left: the GPU needs "
                            "service"))  # fmt: skip
    if cond.health_failed:
        out.append(Evidence(_series("gpu_health_status", entity), "health_status",
                            cond.health, 2.0, ep.started_ms, t_ms,
                            note="the exporter's verdict: 0 pass, 1 warn, 2 fail"))  # fmt: skip
    return out


def finding(det: Any, frame: Frame, key: str, ep: Episode, cond: Condition, t_ms: int,
            end: int | None = None) -> Finding:  # fmt: skip
    """The finding of one GPU's episode (its last statement when ``end`` is set)."""
    entity = dict(ep.extra.get("entity") or entity_of(frame, key))
    if end is not None:  # the last statement keeps what the episode was about
        cond = Condition(**{**ep.extra.get("last", {}), "codes": cond.codes or {}})
    else:
        ep.extra["last"] = _facts(cond)
    severity = Severity.CRITICAL if cond.critical else Severity.WARNING
    summary = headline(cond, entity, det.storm_window_s)
    if end is not None:
        summary = f"{summary}; resolved"
    ev = evidence(det, cond, entity, ep, t_ms)
    confidence = 0.95 if cond.critical else 0.6
    cause = RankedCause(Cause.GPU_ERROR, confidence, tuple(ev[:4]), summary, entity)
    return make_finding(
        kind=FindingKind.GPU_ERRORS, detector=det.name, entity=entity, severity=severity,
        summary=summary, started_ms=ep.started_ms, raised_ms=ep.raised_ms, updated_ms=t_ms,
        ended_ms=end, evidence=ev, causes=[cause],
    )  # fmt: skip


def _facts(cond: Condition) -> dict[str, Any]:
    """A condition as JSON (the episode keeps it for its last statement)."""
    return {
        "fatal": cond.fatal, "reset": cond.reset, "storm": cond.storm,
        "storm_events": cond.storm_events, "remap_failed": cond.remap_failed,
        "health_failed": cond.health_failed,
        "health": cond.health if cond.health == cond.health else -1.0,  # NaN is not JSON
        "last_code": dict(cond.last_code),
    }  # fmt: skip
