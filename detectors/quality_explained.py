"""Telemetry gaps a GPU error explains: a GPU off the bus reads sentinels and drops out.

Why: when a GPU falls off the bus (XID 79), the exporter's lines for it turn to DCGM's
"not supported" sentinels or vanish.  The data-quality checks see that, rightly, but the
telemetry is not what broke: the GPU is, and its ``gpu_errors`` finding (which runs first
in the cycle) already pages for it.  A ``gap`` on a GPU, or ``sentinel`` values from the
exporter of its host, while a critical GPU error is open there is recorded at ``info`` (no
page of its own) with the GPU error as its cause, so it can never become the cause of
the incident over the XID.  Once explained, an episode stays explained to its end: the
exporter's sentinels outlast the GPU error by a scrape or two when the GPU comes back, and
that tail is the same outage, not a new page.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from hbmwatch.detectors.quality_sensors import CheckReport
from hbmwatch.records import Finding, Severity
from hbmwatch.taxonomy import Cause, FindingKind

#: The checks a broken GPU explains, and the entity labels that must match its finding's.
EXPLAINED = {"gap": ("cluster", "host", "gpu"), "sentinel": ("cluster", "host")}


def explained(
    report: CheckReport,
    check: str,
    open_findings: Iterable[Finding],
    memory: MutableMapping[str, Any] | None = None,
) -> CheckReport:
    """The report, at ``info`` with cause ``gpu_error``, when an open critical GPU error on
    the same GPU (``gap``) or host (``sentinel``) explains it, or explained the same episode
    before (``memory``: the episode's own record); else unchanged."""
    labels = EXPLAINED.get(check)
    if labels is None:
        return report
    by = next((f.summary for f in open_findings
               if f.kind == FindingKind.GPU_ERRORS and f.severity is Severity.CRITICAL
               and f.ended_ms is None
               and all(f.entity.get(k, "") == report.entity.get(k, "") for k in labels)),
              None)  # fmt: skip
    if by is None and memory is not None:
        by = memory.get("explained_by")
    if by is None:
        return report
    if memory is not None:
        memory["explained_by"] = by
    return report._replace(
        summary=f"{report.summary} (explained by {by})",
        severity=Severity.INFO,
        cause=Cause.GPU_ERROR,
    )
