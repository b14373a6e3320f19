"""Everything the incident page shows, gathered from the store's public methods (no SQL).

On-call land on ``/incidents/{id}`` from an alert's ``incident_url``.  The first question is
"what is slow and why", so the view brings together the incident (header, timeline,
ranked causes with their evidence), its alerts and the entities they name, and the series
that show it: the p99 latency of the affected workloads, each as a ratio to its own
baseline, and the series behind the top causes' evidence, over the incident's window with
some context before it.

Only what the incident is about is charted: the workloads its latency alerts name, and of
the workloads on GPUs its other alerts name only those whose p99 moved.  Series that are
gone from the store, or evidence texts that are not series selectors (a rack mean, "GPUs
of rack r0"), are skipped with a note rather than failing the page.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from hbmwatch.alerts.engine import describe
from hbmwatch.api.incident import svgchart
from hbmwatch.api.incident.series import (
    BASELINE_MS,
    P99,
    ChartedSeries,
    Window,
    chart_step,
    read_series,
)
from hbmwatch.api.incident.timeline import AlertGroup, TimelineRow, alert_rows, timeline_rows
from hbmwatch.api.incident.words import (
    CauseView,
    Entity,
    EvidenceLine,
    cause_view,
    entities_of,
    evidence_line,
    series_in,
    utc_time,
)
from hbmwatch.query import parse_selector
from hbmwatch.records import Alert, Incident, SeriesKey
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import Cause
from hbmwatch.validation import InvalidQuery

__all__ = ["ChartedSeries", "IncidentView", "build_incident_view", "chart_step",
           "chart_window", "incident_chart", "series_in"]  # fmt: skip

PAD_BEFORE_MS = 15 * 60_000  # context before the incident opened
PAD_AFTER_MS = 10 * 60_000  # after a resolved incident ended (never past now)
LEAD_MS = 60_000  # past now, so the newest point is not on the edge
MAX_LOOKBACK_MS = 60 * 60_000  # the baseline ends at most this long before it opened
TOP_CAUSES = 3
MAX_P99_SERIES = 6
MAX_CAUSE_SERIES = 6
#: A tenant of a GPU an alert names is charted when its p99 rose at least this much.
AFFECTED_RATIO = 1.5
#: A ratio panel spanning more than this (50x beside 3x) gets a log axis.
LOG_SPAN = 20.0
#: Alert labels that narrow "the workloads of this alert" down to latency series.
P99_LABELS = ("cluster", "host", "gpu", "partition", "service", "model", "phase")
UNIT_WORDS = {"times": "times its baseline", "celsius": "°C", "ratio": "fraction of time",
              "watts": "W", "hertz": "Hz"}  # fmt: skip


@dataclass(frozen=True)
class IncidentView:
    incident: Incident
    alerts: tuple[Alert, ...]
    place: str
    now_ms: int
    window_start_ms: int
    window_end_ms: int
    step_s: float
    baseline_start_ms: int
    baseline_end_ms: int
    p99: tuple[ChartedSeries, ...]
    cause_series: tuple[ChartedSeries, ...]
    cause_panel_title: str
    causes: tuple[CauseView, ...]  # the top causes, shown in full
    other_causes: tuple[CauseView, ...]  # ranked below them: named only
    evidence: tuple[EvidenceLine, ...]
    timeline: tuple[TimelineRow, ...]
    alert_rows: tuple[Alert | AlertGroup, ...]  # the alerts table, resolved repeats grouped
    entities: tuple[Entity, ...]
    notes: tuple[str, ...]
    detail_url: str
    acknowledge_url: str

    @property
    def charted(self) -> tuple[ChartedSeries, ...]:
        return self.p99 + self.cause_series

    @property
    def baseline_text(self) -> str:
        """``the median over 07:30:00 to 07:40:00 UTC``: the window every ratio divides by."""
        start, end = utc_time(self.baseline_start_ms), utc_time(self.baseline_end_ms)
        return f"the median over {start} to {end} UTC"


def build_incident_view(
    store: Store, incident_id: str, now_ms: int | None = None
) -> IncidentView | None:
    """The page's content for one incident, or None when the store has no such incident."""
    inc = store.alerts.incident(incident_id)
    if inc is None:
        return None
    now = store.now_ms() if now_ms is None else now_ms
    alerts = _alerts_of(store, inc)
    base_end = baseline_end(inc, alerts)
    start_ms, end_ms = chart_window(inc, now, base_end)
    step = chart_step(end_ms - start_ms)
    window = Window(start_ms / 1000, end_ms / 1000, step, now / 1000,
                    (base_end - BASELINE_MS) / 1000, base_end / 1000)  # fmt: skip
    notes: list[str] = []
    p99 = _p99_series(store, alerts, window, inc.opened_ms / 1000, notes)
    cause_texts, cause_title = _cause_selectors(inc)
    taken = {s.series for s in p99}
    cause_keys = _expand(store, cause_texts, MAX_CAUSE_SERIES, "cause", notes, taken)
    causes = tuple(cause_view(c) for c in inc.causes)
    return IncidentView(
        incident=inc, alerts=alerts, place=describe(inc.scope), now_ms=now,
        window_start_ms=start_ms, window_end_ms=end_ms, step_s=step,
        baseline_start_ms=base_end - BASELINE_MS, baseline_end_ms=base_end, p99=p99,
        cause_series=tuple(read_series(store, k, tag, window, notes) for k, tag in cause_keys),
        cause_panel_title=cause_title,
        causes=causes[:TOP_CAUSES], other_causes=causes[TOP_CAUSES:],
        evidence=tuple(evidence_line(e) for e in dict.fromkeys(inc.evidence)),  # each once
        timeline=timeline_rows(inc.timeline, alerts, resolved=not inc.open),
        alert_rows=alert_rows(alerts),
        entities=entities_of(alerts), notes=tuple(notes),
        detail_url=f"/api/v1/incidents/{quote(inc.id, safe='')}",
        acknowledge_url=f"/api/v1/incidents/{quote(inc.id, safe='')}/acknowledge",
    )  # fmt: skip


def _alerts_of(store: Store, inc: Incident) -> tuple[Alert, ...]:
    """Its alerts in the order they joined; any the incident does not list come last."""
    found = {a.id: a for a in store.alerts.alerts(incident_id=inc.id)}
    order = {aid: i for i, aid in enumerate(inc.alerts)}
    ranked = sorted(found.values(), key=lambda a: (order.get(a.id, len(order)), a.started_ms))
    return tuple(ranked)


# -- the window ------------------------------------------------------------------------------
def baseline_end(inc: Incident, alerts: Sequence[Alert]) -> int:
    """When the baseline stops: the first of its alerts' starts, or when it opened; never
    more than ``MAX_LOOKBACK_MS`` before it opened (an old alert that joined late)."""
    first = min([inc.opened_ms, *(a.started_ms for a in alerts)])
    return max(first, inc.opened_ms - MAX_LOOKBACK_MS)


def chart_window(inc: Incident, now_ms: int, base_end_ms: int | None = None) -> tuple[int, int]:
    """From 15 min before it opened (earlier if the baseline needs it) to 10 min after it
    ended (or just past now)."""
    start = inc.opened_ms - PAD_BEFORE_MS
    if base_end_ms is not None:
        start = min(start, base_end_ms - BASELINE_MS)
    horizon = now_ms + LEAD_MS
    end = horizon if inc.resolved_ms is None else min(inc.resolved_ms + PAD_AFTER_MS, horizon)
    return start, max(end, inc.opened_ms + LEAD_MS)


# -- which series ----------------------------------------------------------------------------
def _p99_series(
    store: Store, alerts: Sequence[Alert], window: Window, opened_s: float, notes: list[str]
) -> tuple[ChartedSeries, ...]:
    """The p99 the latency alerts name, then the GPUs' tenants whose p99 moved most.

    A tenant that stayed within ``AFFECTED_RATIO`` of its baseline is left out (with a
    note): it would only set the axis for what is not the problem.
    """
    named, tenants = _p99_selectors(alerts)
    keys = _expand(store, named, MAX_P99_SERIES, "p99", notes)
    shown = [read_series(store, k, "", window, notes) for k, _ in keys]
    taken = {k.text for k, _ in keys}
    found = _expand(store, tenants, 4 * MAX_P99_SERIES, "tenant p99", notes, taken,
                    note_missing=False)  # a GPU that runs nothing is no news  # fmt: skip
    moved = []
    for key, _ in found:
        s = read_series(store, key, "", window, notes)
        if s.baseline is not None and s.peak_ratio(opened_s) < AFFECTED_RATIO:
            notes.append(f"not charted: {s.label}: its p99 stayed under "
                         f"{AFFECTED_RATIO:g}x its baseline")  # fmt: skip
        else:
            moved.append(s)
    moved.sort(key=lambda s: -s.peak_ratio(opened_s) if s.baseline else 0.0)
    room = max(MAX_P99_SERIES - len(shown), 0)
    if len(moved) > room:
        notes.append(f"{len(moved) - room} more affected tenant p99 series not charted "
                     f"(at most {MAX_P99_SERIES} p99 series; the most affected are)")  # fmt: skip
    kept = []
    for s in shown + moved[:room]:
        if s.baseline is None and s.points:
            notes.append(f"not charted: {s.series}: {s.baseline_note}")
        else:
            kept.append(s)
    return tuple(kept)


def _p99_selectors(alerts: Sequence[Alert]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(p99 of the workload alerts, p99 of the tenants of the GPUs other alerts name).

    Rack- and target-wide alerts name no workload of their own and add nothing.
    """
    named: list[str] = []
    tenants: list[str] = []
    for a in alerts:
        if not (a.labels.get("service") or a.labels.get("gpu")):
            continue
        keep = {k: a.labels[k] for k in P99_LABELS if a.labels.get(k)}
        text = SeriesKey(P99[0], {**keep, "quantile": P99[1]}).text
        into = named if a.labels.get("service") else tenants
        if text not in named and text not in tenants:
            into.append(text)
    return [(t, "") for t in named], [(t, "") for t in tenants]


def _cause_selectors(inc: Incident) -> tuple[list[tuple[str, str]], str]:
    """(evidence series, its cause) of the top causes; else the findings' evidence."""
    top = [c for c in inc.causes if c.cause != Cause.NONE][:TOP_CAUSES]
    texts = _unique((e.series, str(c.cause)) for c in top for e in c.evidence)
    if texts:
        return texts, "Series behind the top causes"
    return _unique((e.series, "") for e in inc.evidence), "Series behind the findings"


def _unique(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each series text once, with the tag it came with first."""
    seen: dict[str, str] = {}
    for text, tag in pairs:
        seen.setdefault(text, tag)
    return list(seen.items())


def _expand(
    store: Store, texts: Sequence[tuple[str, str]], cap: int, role: str, notes: list[str],
    exclude: Collection[str] = (), *, note_missing: bool = True,
) -> list[tuple[SeriesKey, str]]:  # fmt: skip
    """The stored series each (text, tag) selects, in order, at most ``cap`` in all
    (leaving out the series texts in ``exclude``)."""
    keys: dict[SeriesKey, str] = {}
    for text, tag in texts:
        selector_text = series_in(text)
        if selector_text is None:
            notes.append(f"not charted: {text!r} names no series")
            continue
        try:
            found = store.series(parse_selector(selector_text), limit=cap + 1)
        except InvalidQuery as exc:
            notes.append(f"not charted: {selector_text}: {exc}")
            continue
        if not found and note_missing:
            notes.append(f"not charted: {selector_text}: no such series in the store")
        for k in found:
            if k.text not in exclude:
                keys.setdefault(k, tag)
    if len(keys) > cap:
        notes.append(f"{len(keys) - cap}+ more {role} series not charted (at most {cap})")
    return list(keys.items())[:cap]


# -- the chart -------------------------------------------------------------------------------
def _lines(series: Sequence[ChartedSeries]) -> list[svgchart.Line]:
    out = []
    for s in series:
        label = s.label
        if s.baseline is not None:
            base = svgchart.format_value(s.baseline, s.unit)
            label += f" (baseline {base}" + (f", {s.baseline_note})" if s.baseline_note else ")")
        out.append(svgchart.Line(s.series, label, s.chart_points, s.chart_unit))
    return out


def unit_panel(
    title: str, unit: str, series: Sequence[ChartedSeries], empty: str
) -> svgchart.Panel:
    """One unit's panel: a ratio panel reads against 1x, on a log axis when it spans a lot."""
    lines = _lines(series)
    if unit != "times":
        return svgchart.Panel(title, unit, lines, empty_text=empty)
    values = [v for line in lines for _, v in line.points if v > 0] + [1.0]
    log = max(values) / min(values) > LOG_SPAN
    return svgchart.Panel(title, unit, lines, empty_text=empty, log=log, reference=1.0,
                          reference_label="baseline (1x)")  # fmt: skip


def chart_panels(view: IncidentView) -> list[svgchart.Panel]:
    """p99 as times its baseline on top; below, one panel per unit of the causes' series."""
    panels = [unit_panel(f"p99 latency of the affected workloads, times its baseline "
                     f"({view.baseline_text})", "times", view.p99,
                     "no p99 series for this incident's workloads")]  # fmt: skip
    units = list(dict.fromkeys(s.chart_unit for s in view.cause_series))
    for unit in units:
        members = [s for s in view.cause_series if s.chart_unit == unit]
        words = UNIT_WORDS.get(unit, unit)
        title = f"{view.cause_panel_title}" + (f": {words}" if words else "")
        panels.append(unit_panel(title, unit, members, "no data in this window"))
    if not units:
        panels.append(svgchart.Panel(view.cause_panel_title, "", [],
                                     empty_text="no evidence series to chart"))  # fmt: skip
    return panels


def incident_chart(view: IncidentView) -> str:
    """The SVG: p99 ratios on top, the causes' series below, the incident's window marked."""
    inc = view.incident
    end = inc.resolved_ms
    marks = [svgchart.Mark(inc.opened_ms / 1000, "opened")]
    marks.append(svgchart.Mark(end / 1000, "resolved") if end else
                 svgchart.Mark(view.now_ms / 1000, "now"))  # fmt: skip
    return svgchart.render_chart(
        chart_panels(view), view.window_start_ms / 1000, view.window_end_ms / 1000, marks,
        title=f"{inc.title}: p99 latency and cause series",
    )  # fmt: skip
