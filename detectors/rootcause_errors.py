"""The GPU-error candidate of root cause: a fatal or reset-needing error on the same GPU.

Why from findings rather than a signal in the context ring: an error is one event, its
meaning is in the code table, and the ``gpu_errors`` detector (which runs first) already
holds it open while the GPU stays broken (a GPU off the bus reports nothing more, so no
signal would show it changing).  A critical ``gpu_errors`` finding on the regression's GPU
(or on a GPU of its node, for a job that names only its node) that started no later than
``lead_s`` after the regression explains it outright: strength 1, with the code, its
meaning and its action as evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hbmwatch.records import Evidence, Finding, Severity
from hbmwatch.taxonomy import FindingKind


@dataclass(frozen=True)
class ErrorCause:
    """The GPU-error candidate: how strong, its evidence, which GPU, and how late."""

    strength: float
    evidence: tuple[Evidence, ...]
    key: str
    late: bool
    summary: str
    entity: dict[str, str]


def gpu_error_findings(findings: Iterable[Finding]) -> list[Finding]:
    """The open findings that can explain a regression: critical GPU errors (a benign
    storm is the application's own fault, not the GPU's)."""
    return [
        f for f in findings
        if f.kind == FindingKind.GPU_ERRORS and f.severity is Severity.CRITICAL
        and f.ended_ms is None
    ]  # fmt: skip


def gpu_error_cause(
    errors: Sequence[Finding], gpus: Sequence[str], start_ms: int, lead_s: float
) -> ErrorCause | None:
    """The earliest critical GPU error on one of ``gpus`` (keys cluster/host/gpu)."""
    mine = [f for f in errors if _key(f) in set(gpus)]
    if not mine:
        return None
    f = min(mine, key=lambda f: f.started_ms)
    late = f.started_ms > start_ms + lead_s * 1000
    lead = (start_ms - f.started_ms) / 1000.0
    when = (f"started {lead:.0f} s before the regression" if lead >= 0
            else f"started {-lead:.0f} s after the regression")  # fmt: skip
    evidence = f.causes[0].evidence if f.causes else f.evidence
    return ErrorCause(1.0, tuple(evidence), _key(f), late, f"{f.summary}; {when}",
                      dict(f.entity))  # fmt: skip


def _key(f: Finding) -> str:
    e = f.entity
    return f"{e.get('cluster', '')}/{e.get('host', '')}/{e.get('gpu', '')}"
