"""Detection limits from randomised runs: recall by relative magnitude and duration.

``hbmwatch eval --random`` scores its runs at the incident level exactly as the bundled
ones (``incident_scoring.score_run``, through ``incident_report.score_incidents``); this
module joins each fault's outcome with what was drawn for it
(``simulator.random_scenarios.FaultDraw``) and bins.  Definitions:

* **Found**: the fault got exactly one covering incident (``one_incident``), a page
  (``page_delay_s`` set) and the right top cause (``top1``).  Recall = found / faults.
* **Bins**: relative magnitude by ``MAGNITUDE_EDGES`` (faults of kinds with no magnitude
  in a row of their own, "none"), duration by ``DURATION_EDGES`` (s); a bin holds
  ``[low, high)``, the last ``[low, high]``.
* **Where recall falls to 0.5**: over faults above their kind's *duration* limit
  (``DETECTABLE``), recall per magnitude bin; walking down from the biggest bin, the first
  bin with recall >= 0.5 followed by one below it; the crossing is interpolated linearly in
  recall between the two bins' geometric centres, on a log scale.  Likewise for duration
  over faults above their kind's *magnitude* limit.  None when no bin pair crosses
  (``note`` says whether recall stayed above or below 0.5 throughout).
* **Above the limits**: faults at least ``DETECTABLE[kind]`` big and long.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hbmwatch.evaluation.incident_scoring import IncidentOutcome
from hbmwatch.simulator.random_scenarios import DETECTABLE, FaultDraw
from hbmwatch.simulator.scenario import FaultKind

MAGNITUDE_EDGES = (0.1, 0.2, 0.35, 0.5, 0.7, 1.0, 1.5, 3.0)
DURATION_EDGES = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 7200.0)
MIN_PER_KIND = 12  # faults of a kind before it gets its own table
TARGET_RECALL = 0.9


@dataclass(frozen=True)
class Scored:
    """One fault: what was drawn and whether it was found."""

    draw: FaultDraw
    found: bool


def found(o: IncidentOutcome) -> bool:
    return o.one_incident and o.page_delay_s is not None and o.top1


def join(draws: Iterable[FaultDraw], outcomes: Iterable[IncidentOutcome]) -> list[Scored]:
    """Each drawn fault with its outcome (matched by scenario and fault id)."""
    by_key = {(o.scenario, o.fault_id): o for o in outcomes}
    return [Scored(d, found(by_key[(d.scenario, d.fault_id)])) for d in draws
            if (d.scenario, d.fault_id) in by_key]  # fmt: skip


def bin_of(value: float | None, edges: Sequence[float]) -> int | None:
    """Index of the bin ``[edges[i], edges[i+1])`` holding ``value`` (None: none fits)."""
    if value is None:
        return None
    for i in range(len(edges) - 1):
        if edges[i] <= value < edges[i + 1]:
            return i
    return len(edges) - 2 if math.isclose(value, edges[-1]) else None


def labels(edges: Sequence[float], unit: str = "") -> list[str]:
    return [f"{_num(a)}-{_num(b)}{unit}" for a, b in itertools.pairwise(edges)]


def _num(x: float) -> str:
    return f"{math.floor(x):g}" if x >= 10 else f"{x:g}"


def recall_by_bin(items: Sequence[Scored], attr: str,
                  edges: Sequence[float]) -> list[tuple[int, int]]:  # fmt: skip
    """(found, n) per bin of ``attr`` (``rel_magnitude`` or ``duration_s``)."""
    cells = [[0, 0] for _ in range(len(edges) - 1)]
    for s in items:
        i = bin_of(getattr(s.draw, attr), edges)
        if i is not None:
            cells[i][0] += s.found
            cells[i][1] += 1
    return [(a, b) for a, b in cells]


def crossing(edges: Sequence[float], cells: Sequence[tuple[int, int]]) -> tuple[float | None, str]:
    """Where recall falls to 0.5 walking down from the biggest bin (module doc); empty
    bins are skipped."""
    points = [(math.sqrt(edges[i] * edges[i + 1]), f / n)
              for i, (f, n) in enumerate(cells) if n > 0]  # fmt: skip
    if not points:
        return None, "no faults"
    points.reverse()  # biggest first
    if points[0][1] < 0.5:
        return None, "n/a (recall below 0.5 even in the biggest bin)"
    for (c_hi, r_hi), (c_lo, r_lo) in itertools.pairwise(points):
        if r_lo < 0.5 <= r_hi:
            w = (r_hi - 0.5) / (r_hi - r_lo)
            return math.exp(math.log(c_hi) + w * (math.log(c_lo) - math.log(c_hi))), ""
    return None, "n/a (recall at or above 0.5 down to the smallest bin)"


def above_limits(d: FaultDraw) -> bool:
    rel, dur = DETECTABLE[FaultKind(d.kind)]
    return d.duration_s >= dur and (rel is None or d.rel_magnitude is None
                                    or d.rel_magnitude >= rel)  # fmt: skip


def _long_enough(d: FaultDraw) -> bool:
    return d.duration_s >= DETECTABLE[FaultKind(d.kind)][1]


def _big_enough(d: FaultDraw) -> bool:
    rel = DETECTABLE[FaultKind(d.kind)][0]
    return rel is None or d.rel_magnitude is None or d.rel_magnitude >= rel


@dataclass
class LimitTable:
    """Recall per relative-magnitude bin (rows, then "none") x duration bin (columns)."""

    kind: str  # "all" or a fault kind
    n: int
    cells: list[list[tuple[int, int]]]  # rows: MAGNITUDE bins + "none"; columns: DURATION
    magnitude_at_half: float | None
    magnitude_note: str
    duration_at_half: float | None
    duration_note: str
    above: tuple[int, int]  # found, n above the stated limits


def limit_table(kind: str, items: Sequence[Scored]) -> LimitTable:
    rows: list[list[tuple[int, int]]] = []
    for i in [*range(len(MAGNITUDE_EDGES) - 1), None]:
        in_row = [s for s in items if bin_of(s.draw.rel_magnitude, MAGNITUDE_EDGES) == i]
        rows.append(recall_by_bin(in_row, "duration_s", DURATION_EDGES))
    by_mag = recall_by_bin([s for s in items if _long_enough(s.draw)], "rel_magnitude",
                           MAGNITUDE_EDGES)  # fmt: skip
    by_dur = recall_by_bin([s for s in items if _big_enough(s.draw)], "duration_s",
                           DURATION_EDGES)  # fmt: skip
    above = [s for s in items if above_limits(s.draw)]
    return LimitTable(kind, len(items), rows, *crossing(MAGNITUDE_EDGES, by_mag),
                      *crossing(DURATION_EDGES, by_dur),
                      (sum(s.found for s in above), len(above)))  # fmt: skip


@dataclass
class LimitsReport:
    overall: LimitTable
    by_kind: dict[str, LimitTable]
    above_recall: float | None
    unexplained_pages_per_1000_gpu_h: float | None
    healthy_gpu_hours: float
    redraws: int
    faults: list[Scored]

    @property
    def passed(self) -> bool:
        rate = self.unexplained_pages_per_1000_gpu_h
        return (self.above_recall is None or self.above_recall >= TARGET_RECALL) and (
            rate is None or rate <= 1.0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "magnitude_bins": [*labels(MAGNITUDE_EDGES), "none"],
            "duration_bins": labels(DURATION_EDGES, " s"),
            "overall": asdict(self.overall),
            "by_kind": {k: asdict(t) for k, t in self.by_kind.items()},
            "detectable": {k.value: {"min_relative_magnitude": r, "min_duration_s": d}
                           for k, (r, d) in DETECTABLE.items()},
            "above_limits_recall": self.above_recall,
            "unexplained_pages_per_1000_gpu_h": self.unexplained_pages_per_1000_gpu_h,
            "healthy_gpu_hours": self.healthy_gpu_hours,
            "redraws": self.redraws,
            "passed": self.passed,
            "faults": [asdict(s.draw) | {"found": s.found} for s in self.faults],
        }  # fmt: skip


def limits_report(draws: Iterable[FaultDraw], outcomes: Iterable[IncidentOutcome], *,
                  unexplained_rate: float | None, healthy_gpu_hours: float,
                  redraws: int = 0) -> LimitsReport:  # fmt: skip
    """The detection-limit report of scored random runs (module doc)."""
    items = join(draws, outcomes)
    kinds: Mapping[str, list[Scored]] = {}
    for s in items:
        kinds.setdefault(s.draw.kind, []).append(s)  # type: ignore[attr-defined]
    by_kind = {k: limit_table(k, v) for k, v in sorted(kinds.items()) if len(v) >= MIN_PER_KIND}
    overall = limit_table("all", items)
    f, n = overall.above
    return LimitsReport(overall, by_kind, f / n if n else None, unexplained_rate,
                        healthy_gpu_hours, redraws, items)  # fmt: skip


# -- printing -------------------------------------------------------------------------------
def _cell(found_n: tuple[int, int]) -> str:
    f, n = found_n
    return "" if n == 0 else f"{f / n:.2f} ({n})"


def _at(value: float | None, note: str, unit: str) -> str:
    return f"{value:.3g}{unit}" if value is not None else note


def limit_rich_table(t: LimitTable) -> Any:
    """Recall (and fault count) per relative magnitude x duration, with the 0.5 crossings."""
    from rich.table import Table

    f, n = t.above
    table = Table(
        title=f"detection limits, {t.kind} ({t.n} faults): recall (n) by relative magnitude "
        f"x duration; recall 0.5 at magnitude {_at(t.magnitude_at_half, t.magnitude_note, 'x')}"
        f", duration {_at(t.duration_at_half, t.duration_note, ' s')}; above the stated limits"
        f" {_cell((f, n)) or 'none'}"
    )
    table.add_column("magnitude \\ duration")
    for label in labels(DURATION_EDGES, " s"):
        table.add_column(label, justify="right")
    for label, row in zip([*labels(MAGNITUDE_EDGES), "none"], t.cells, strict=True):
        if any(n for _, n in row):
            table.add_row(label, *(_cell(c) for c in row))
    return table


def summary_lines(r: LimitsReport) -> list[str]:
    rate = r.unexplained_pages_per_1000_gpu_h
    above = "n/a" if r.above_recall is None else f"{r.above_recall:.3f}"
    return [
        f"recall above the stated limits (DETECTABLE): {above} "
        f"(target >= {TARGET_RECALL}; {r.overall.above[1]} faults)",
        "  per kind: " + ", ".join(f"{k} {f}/{n}" for k, (f, n) in _above_by_kind(r).items()),
        "  alone / overlapping another fault: "
        + " / ".join(
            _share([s for s in r.faults if above_limits(s.draw) and s.draw.overlap is o])
            for o in (False, True)
        ),
        f"unexplained pages / 1,000 healthy GPU-h: {'n/a' if rate is None else f'{rate:.2f}'} "
        f"(target <= 1; {r.healthy_gpu_hours:.0f} healthy GPU-h)",
        f"draws the simulator refused (drawn again): {r.redraws}",
        f"random eval passed (recall above the limits, unexplained pages): "
        f"{'yes' if r.passed else 'NO'}",
    ]


def _share(items: Sequence[Scored]) -> str:
    return f"{sum(s.found for s in items)}/{len(items)}"


def _above_by_kind(r: LimitsReport) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for s in r.faults:
        if above_limits(s.draw):
            f, n = out.get(s.draw.kind, (0, 0))
            out[s.draw.kind] = (f + s.found, n + 1)
    return dict(sorted(out.items()))
