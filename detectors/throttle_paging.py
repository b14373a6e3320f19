"""When throttling is worth a page: it lasted past a budget, or a workload on the GPU regressed.

A GPU throttling on its power cap at the daily peak, with no workload slower for it, is a
fact worth recording (a finding, a dashboard) but not worth waking anyone: at 14:50 every
healthy GPU of a busy fleet does it.  So a throttle finding is ``info`` until either it has
cost the GPU ``page_clock_drop`` of its clock (against its own unthrottled baseline) for
``page_after_s`` in all (no longer a peak: how the GPU now runs), or a p99 or step-time
regression is open on the same GPU (or on its host, for a workload that names no GPU): then
it is ``warning`` for the rest of its episode, and says why.  Peak throttling that trims a
few percent off the clock for hours never uses up the budget: it slows nobody down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hbmwatch.records import Finding
from hbmwatch.taxonomy import FindingKind

REGRESSIONS = (FindingKind.P99_REGRESSION, FindingKind.STEP_TIME_REGRESSION)


@dataclass
class Regressions:
    """The open workload regressions of a frame, by the GPU (or host) they run on."""

    by_gpu: dict[tuple[str, str, str], str] = field(default_factory=dict)
    by_host: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def of(cls, findings: Iterable[Finding]) -> Regressions:
        out = cls()
        for f in findings:
            if f.kind not in REGRESSIONS or not f.open or not f.entity.get("host"):
                continue
            e = f.entity
            what = (
                f"{f.kind} on {e.get('service') or e.get('job') or e.get('model') or 'a workload'}"
            )
            place = (e.get("cluster", ""), e["host"])
            if e.get("gpu"):
                out.by_gpu.setdefault((*place, e["gpu"]), what)
            else:
                out.by_host.setdefault(place, what)
        return out

    def on(self, entity: Mapping[str, str]) -> str:
        """The regression open on this GPU (or its host), in words; "" when none."""
        place = (entity.get("cluster", ""), entity.get("host", ""))
        return self.by_gpu.get((*place, entity.get("gpu", "")), "") or self.by_host.get(place, "")


def page_reason(
    regressions: Regressions,
    entity: Mapping[str, str],
    costly_s: float,
    page_after_s: float,
    clock_drop: float,
) -> str:
    """Why this throttle episode pages, in words; "" while it hurts nobody.

    ``costly_s``: seconds of the episode with the clock ``clock_drop`` or more under its own
    unthrottled baseline.
    """
    hurt = regressions.on(entity)
    if hurt:
        return f"{hurt} on this GPU"
    if costly_s >= page_after_s:
        return (
            f"clock {clock_drop:.0%}+ under its baseline for {costly_s / 60:.0f} min "
            f"(budget {page_after_s / 60:g} min)"
        )
    return ""
