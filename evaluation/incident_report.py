"""The incident-level table ``hbmwatch eval`` prints beside the finding-level one.

Per scenario and fault kind (pooled over seeds), then per fault kind over all scenarios,
then what no fault explains; ``checks`` holds the targets of issue 13 ("Must hold"):
per fault kind at least 0.95 of faults with exactly one incident and top cause right in at
least 0.9; median time to page at most 60 s over the thermal kinds; no noisy neighbour
blamed on heat; at most 1 unexplained page per 1,000 healthy GPU-hours; and of issue 18:
every ``xid_fatal`` / ``row_remap_failure`` fault paged, its incident naming every pod on
its GPUs, and no pod move opening an incident.  Definitions are in
``hbmwatch.evaluation.incident_scoring``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from hbmwatch.evaluation.incident_scoring import (
    PODS_NAMED_FAULTS,
    IncidentOutcome,
    MoveOutcome,
    PagedRunLike,
    RunIncidents,
    score_run,
)
from hbmwatch.evaluation.scoring import (
    THERMAL_FAULTS,
    CheckedReport,
    mean,
    ok_text,
    pct,
    quantile,
    sec,
)

TARGETS = {"one_incident": 0.95, "top1": 0.9, "thermal_page_median_s": 60.0,
           "unexplained_pages_per_1000_gpu_h": 1.0, "noisy_not_heat": 1.0, "paged": 1.0,
           "pods_named": 1.0, "moves_quiet": 1.0}  # fmt: skip
COLUMNS = ("scenario", "fault kind", "n", "one incident", "paged", "page p50", "title",
           "top-1", "top-3", "entity", "evidence")  # fmt: skip


@dataclass
class GroupStats:
    """One row: faults of one kind (in one scenario, or in all: ``scenario`` = "all")."""

    scenario: str
    kind: str
    n: int
    one_incident: float
    paged: float
    page_median_s: float | None
    page_p95_s: float | None
    title_right: float
    top1: float
    top3: float
    names_entity: float
    has_evidence: float

    def row(self) -> tuple[str, ...]:
        return (self.scenario, self.kind, str(self.n), pct(self.one_incident), pct(self.paged),
                sec(self.page_median_s), pct(self.title_right), pct(self.top1), pct(self.top3),
                pct(self.names_entity), pct(self.has_evidence))  # fmt: skip


def group_stats(scenario: str, kind: str, outs: Sequence[IncidentOutcome]) -> GroupStats:
    delays = [o.page_delay_s for o in outs if o.page_delay_s is not None]
    share = lambda attr: mean([bool(getattr(o, attr)) for o in outs]) or 0.0  # noqa: E731
    return GroupStats(
        scenario=scenario, kind=kind, n=len(outs), one_incident=share("one_incident"),
        paged=len(delays) / len(outs), page_median_s=quantile(delays, 50),
        page_p95_s=quantile(delays, 95), title_right=share("title_right"), top1=share("top1"),
        top3=share("top3"), names_entity=share("names_entity"),
        has_evidence=share("has_evidence"),
    )  # fmt: skip


@dataclass
class IncidentReport(CheckedReport):
    runs: int
    by_scenario: list[GroupStats]
    by_kind: dict[str, GroupStats]
    thermal_page_median_s: float | None
    noisy_not_heat: float | None
    pages: int
    unexplained_pages: int
    incidents: int
    unexplained_incidents: int
    healthy_gpu_hours: float
    unexplained_pages_per_1000_gpu_h: float | None
    unexplained_incidents_per_1000_gpu_h: float | None
    checks: dict[str, bool | None]
    faults: list[IncidentOutcome]
    pods_named: float | None = None  # of faults whose incident must name their pods
    moves_quiet: float | None = None  # of pod moves
    moves: list[MoveOutcome] | None = None
    #: Each unexplained page: run, time, its new alerts' labels.
    unexplained: list[dict[str, Any]] | None = None

    def rows(self) -> list[tuple[str, ...]]:
        """Per scenario and kind, per kind ("all", with its check), then the overall lines;
        every row has the table's columns plus "check"."""
        rate = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        kinds = [(*g.row(), ok_text(self._kind_ok(g.kind))) for g in self.by_kind.values()]
        return [
            *((*g.row(), "") for g in self.by_scenario),
            *kinds,
            _line("thermal faults: page p50", sec(self.thermal_page_median_s),
                  self.checks.get("thermal_page_median"), col=5),
            _line("noisy neighbour not blamed on heat", pct(self.noisy_not_heat),
                  self.checks.get("noisy_not_heat")),
            _line("GPU error faults: page and incident name every pod on the GPU",
                  pct(self.pods_named), self.checks.get("pods_named")),
            _line(f"pod moves without an incident ({len(self.moves or [])} moves)",
                  pct(self.moves_quiet), self.checks.get("moves_quiet")),
            _line(f"unexplained pages / 1,000 GPU-h ({self.unexplained_pages} of {self.pages} "
                  f"pages in {self.healthy_gpu_hours:.0f} GPU-h)",
                  rate(self.unexplained_pages_per_1000_gpu_h),
                  self.checks.get("unexplained_pages")),
            _line(f"unexplained incidents / 1,000 GPU-h ({self.unexplained_incidents} of "
                  f"{self.incidents})", rate(self.unexplained_incidents_per_1000_gpu_h), None),
            _line("passed", "yes" if self.passed else "NO", None),
        ]  # fmt: skip

    def _kind_ok(self, kind: str) -> bool | None:
        checks = [self.checks.get(f"{c}:{kind}") for c in ("one_incident", "top1", "paged")]
        return False if False in checks else True if True in checks else None

    def table(self) -> Any:
        """A ``rich.table.Table`` of ``rows()``."""
        from rich.table import Table

        table = Table(title="incident evaluation (what on-call was paged)")
        for name in (*COLUMNS, "check"):
            table.add_column(name, justify="left" if name in COLUMNS[:2] else "right")
        rows = self.rows()
        cuts = {len(self.by_scenario), len(self.by_scenario) + len(self.by_kind)}
        for i, row in enumerate(rows):
            if i in cuts:
                table.add_section()
            table.add_row(*row)
        return table


def _line(label: str, value: str, check: bool | None, col: int = 2) -> tuple[str, ...]:
    """An overall row: its label, one value in column ``col``, its check."""
    cells = ["all", label, *([""] * (len(COLUMNS) - 2))]
    cells[col] = value
    return (*cells, ok_text(check) if check is not None else "")


def score_incidents(results: Sequence[PagedRunLike]) -> IncidentReport:
    """Score every run's incidents and pages; pooled over runs."""
    scored: list[RunIncidents] = [score_run(r) for r in results]
    outs = [o for s in scored for o in s.outcomes]
    by_scenario = [group_stats(sc, k, [o for o in outs if (o.scenario, o.kind) == (sc, k)])
                   for sc, k in sorted({(o.scenario, o.kind) for o in outs})]  # fmt: skip
    by_kind = {k: group_stats("all", k, [o for o in outs if o.kind == k])
               for k in sorted({o.kind for o in outs})}  # fmt: skip
    never = float("inf")  # a thermal fault never paged counts as paged never, not skipped
    thermal = [never if o.page_delay_s is None else o.page_delay_s
               for o in outs if o.kind in THERMAL_FAULTS]  # fmt: skip
    noisy = [not o.blamed_heat for o in outs if o.kind == "noisy_neighbour"]
    hours = sum(s.healthy_gpu_hours for s in scored)
    bad_pages = sum(len(s.unexplained_pages) for s in scored)
    bad_incidents = sum(len(s.unexplained_incidents) for s in scored)
    moves = [m for s in scored for m in s.moves]
    report = IncidentReport(
        runs=len(results), by_scenario=by_scenario, by_kind=by_kind,
        thermal_page_median_s=median(thermal) if thermal else None,
        noisy_not_heat=mean(noisy),
        pages=sum(s.pages for s in scored), unexplained_pages=bad_pages,
        incidents=sum(s.incidents for s in scored), unexplained_incidents=bad_incidents,
        healthy_gpu_hours=hours, unexplained_pages_per_1000_gpu_h=_rate(bad_pages, hours),
        unexplained_incidents_per_1000_gpu_h=_rate(bad_incidents, hours), checks={},
        faults=outs, pods_named=mean([bool(o.pods_named) for o in outs
                                      if o.pods_named is not None]),
        moves_quiet=mean([m.quiet for m in moves]), moves=moves,
        unexplained=[d for s in scored for d in s.unexplained_detail],
    )  # fmt: skip
    report.checks = _checks(report)
    return report


def _rate(count: int, hours: float) -> float | None:
    if hours <= 0:
        return float("inf") if count else None
    return count / hours * 1000.0


def _checks(r: IncidentReport) -> dict[str, bool | None]:
    checks: dict[str, bool | None] = {}
    for kind, g in r.by_kind.items():
        checks[f"one_incident:{kind}"] = g.one_incident >= TARGETS["one_incident"]
        checks[f"top1:{kind}"] = g.top1 >= TARGETS["top1"]
        if kind in PODS_NAMED_FAULTS:  # every one must page
            checks[f"paged:{kind}"] = g.paged >= TARGETS["paged"]
    median = r.thermal_page_median_s
    checks["thermal_page_median"] = (
        None if median is None else median <= TARGETS["thermal_page_median_s"]
    )
    checks["noisy_not_heat"] = (
        None if r.noisy_not_heat is None else r.noisy_not_heat >= TARGETS["noisy_not_heat"]
    )
    checks["pods_named"] = _at_least(r.pods_named, TARGETS["pods_named"])
    checks["moves_quiet"] = _at_least(r.moves_quiet, TARGETS["moves_quiet"])
    rate = r.unexplained_pages_per_1000_gpu_h
    checks["unexplained_pages"] = (
        None if rate is None else rate <= TARGETS["unexplained_pages_per_1000_gpu_h"]
    )
    return checks


def _at_least(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target
