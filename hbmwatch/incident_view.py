"""Everything the incident page shows, gathered from the store's public methods (no SQL).

On-call land on ``/incidents/{id}`` from an alert's ``incident_url``.  The first question is
"what is slow and why", so the view brings together the incident (header, timeline,
ranked causes with their evidence), its alerts and the entities they name, and the series
that show it: the p99 latency of the affected workloads and the series behind the top
causes' evidence, over the incident's window with some context before it.

Series that are gone from the store, or evidence texts that are not series selectors (a
rack mean, "GPUs of rack r0"), are skipped with a note rather than failing the page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from alerts.engine import describe
from hbmwatch import metrics, svgchart
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Alert, Evidence, Incident, RankedCause, SeriesKey
from hbmwatch.taxonomy import Cause
from hbmwatch.validation import InvalidQuery
from store.store import Store

PAD_BEFORE_MS = 15 * 60_000  # context before the incident opened
PAD_AFTER_MS = 10 * 60_000  # after a resolved incident ended (never past now)
LEAD_MS = 60_000  # past now, so the newest point is not on the edge
TARGET_POINTS = 400
STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TOP_CAUSES = 3
MAX_P99_SERIES = 6
MAX_CAUSE_SERIES = 6
P99 = ("workload_latency_seconds", "0.99")
#: Alert labels that narrow "the workloads of this alert" down to latency series.
P99_LABELS = ("cluster", "host", "gpu", "partition", "service", "model", "phase")
#: Labels worth a word in a legend (the rest stay in the series text).
LEGEND_LABELS = ("host", "gpu", "partition", "reason", "stack", "domain", "link", "direction")
ENTITY_LABELS = ("cluster", "rack", "host", "gpu", "partition", "service", "model", "phase",
                 "target", "reason", "link", "check")  # fmt: skip
_SERIES_IN_TEXT = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')


@dataclass(frozen=True)
class ChartedSeries:
    """One series on the chart: its text, legend words, unit, how it was read, points."""

    series: str
    label: str
    unit: str
    how: str  # "avg" (mean per step) or "rate" (a counter's per-second rate)
    points: tuple[tuple[float, float], ...]
    query_url: str


@dataclass(frozen=True)
class _Window:
    """The chart's span and step, and now (unix seconds)."""

    start: float
    end: float
    step: float
    now: float


@dataclass(frozen=True)
class EvidenceLine:
    """A piece of evidence and the sentence that says it."""

    evidence: Evidence
    sentence: str


@dataclass(frozen=True)
class CauseView:
    cause: str
    confidence: float
    summary: str
    evidence: tuple[EvidenceLine, ...]


@dataclass(frozen=True)
class Entity:
    """Something the incident's alerts name (a GPU, a rack, a workload), with their names."""

    labels: tuple[tuple[str, str], ...]
    alertnames: tuple[str, ...]

    @property
    def text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels)


@dataclass(frozen=True)
class IncidentView:
    incident: Incident
    alerts: tuple[Alert, ...]
    place: str
    now_ms: int
    window_start_ms: int
    window_end_ms: int
    step_s: float
    p99: tuple[ChartedSeries, ...]
    cause_series: tuple[ChartedSeries, ...]
    cause_panel_title: str
    causes: tuple[CauseView, ...]
    evidence: tuple[EvidenceLine, ...]
    entities: tuple[Entity, ...]
    notes: tuple[str, ...]
    detail_url: str
    acknowledge_url: str

    @property
    def charted(self) -> tuple[ChartedSeries, ...]:
        return self.p99 + self.cause_series


def build_incident_view(
    store: Store, incident_id: str, now_ms: int | None = None
) -> IncidentView | None:
    """The page's content for one incident, or None when the store has no such incident."""
    inc = store.alerts.incident(incident_id)
    if inc is None:
        return None
    now = store.now_ms() if now_ms is None else now_ms
    alerts = _alerts_of(store, inc)
    start_ms, end_ms = chart_window(inc, now)
    step = chart_step(end_ms - start_ms)
    window = _Window(start_ms / 1000, end_ms / 1000, step, now / 1000)
    notes: list[str] = []
    p99_keys = _expand(store, _p99_selectors(alerts), MAX_P99_SERIES, "p99", notes)
    cause_texts, cause_title = _cause_selectors(inc)
    taken = [k for k, _ in p99_keys]
    cause_keys = _expand(store, cause_texts, MAX_CAUSE_SERIES, "cause", notes, taken)
    return IncidentView(
        incident=inc, alerts=alerts, place=describe(inc.scope), now_ms=now,
        window_start_ms=start_ms, window_end_ms=end_ms, step_s=step,
        p99=tuple(_charted(store, k, tag, window, notes) for k, tag in p99_keys),
        cause_series=tuple(_charted(store, k, tag, window, notes) for k, tag in cause_keys),
        cause_panel_title=cause_title,
        causes=tuple(_cause_view(c) for c in inc.causes),
        evidence=tuple(EvidenceLine(e, evidence_sentence(e)) for e in inc.evidence),
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
def chart_window(inc: Incident, now_ms: int) -> tuple[int, int]:
    """From 15 min before it opened to 10 min after it ended (or just past now)."""
    start = inc.opened_ms - PAD_BEFORE_MS
    horizon = now_ms + LEAD_MS
    end = horizon if inc.resolved_ms is None else min(inc.resolved_ms + PAD_AFTER_MS, horizon)
    return start, max(end, inc.opened_ms + LEAD_MS)


def chart_step(span_ms: int) -> float:
    """The smallest round step giving at most ~400 points (200-400 for common spans).

    >>> chart_step(40 * 60_000), chart_step(3 * 3_600_000)
    (10, 30)
    """
    span_s = span_ms / 1000
    return next((s for s in STEPS_S if span_s / s <= TARGET_POINTS), STEPS_S[-1])


# -- which series ----------------------------------------------------------------------------
def _p99_selectors(alerts: Sequence[Alert]) -> list[tuple[str, str]]:
    """p99 selectors for the alerts' workloads: workload alerts first, then GPUs' tenants.

    Rack- and target-wide alerts name no workload of their own and add nothing.
    """
    texts: list[str] = []
    ranked = sorted(alerts, key=lambda a: not a.labels.get("service"))
    for a in ranked:
        if not (a.labels.get("service") or a.labels.get("gpu")):
            continue
        keep = {k: a.labels[k] for k in P99_LABELS if a.labels.get(k)}
        text = SeriesKey(P99[0], {**keep, "quantile": P99[1]}).text
        if text not in texts:
            texts.append(text)
    return [(t, "") for t in texts]


def series_in(text: str) -> str | None:
    """The ``metric{...}`` selector inside an evidence series text, if there is one.

    >>> series_in('load-adjusted rise of gpu_memory_temperature_celsius{host="n1",gpu="0"}')
    'gpu_memory_temperature_celsius{host="n1",gpu="0"}'
    >>> series_in("GPUs of rack r0") is None
    True
    """
    m = _SERIES_IN_TEXT.search(text)
    return m.group(0) if m else None


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
    exclude: Sequence[SeriesKey] = (),
) -> list[tuple[SeriesKey, str]]:  # fmt: skip
    """The stored series each (text, tag) selects, in order, at most ``cap`` in all."""
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
        if not found:
            notes.append(f"not charted: {selector_text}: no such series in the store")
        for k in found:
            if k not in exclude:
                keys.setdefault(k, tag)
    if len(keys) > cap:
        notes.append(f"{len(keys) - cap}+ more {role} series not charted (at most {cap})")
    return list(keys.items())[:cap]


# -- reading them ----------------------------------------------------------------------------
def _charted(
    store: Store, key: SeriesKey, tag: str, window: _Window, notes: list[str]
) -> ChartedSeries:
    """One series over the window: gauges as the mean per step, counters as a rate."""
    definition = metrics.get(key.metric)
    is_counter = definition is not None and definition.is_counter
    unit = definition.unit if definition else ""
    if is_counter:
        unit = "ratio" if unit == "seconds" else f"{unit}/s"
    how = "rate" if is_counter else "avg"
    label = legend_label(key, is_counter)
    return ChartedSeries(
        key.text, f"{tag}: {label}" if tag else label, unit, how,
        _read(store, key, is_counter, window, notes),
        query_url(key.text, window.start, window.end, window.step, "rate" if is_counter else ""),
    )  # fmt: skip


def _read(
    store: Store, key: SeriesKey, is_counter: bool, window: _Window, notes: list[str]
) -> tuple[tuple[float, float], ...]:
    """The points of exactly ``key`` (a selector also matches series with more labels).

    A counter's step still filling would read as a drop in its rate: it is left out.
    """
    start, end, step = window.start, window.end, window.step
    try:
        selector = parse_selector(key.text)
        if is_counter:
            result = store.counter_query(selector, start, end, step, fn="rate")
        else:
            result = store.range_query(selector, start, end, step, Aggregation.AVG)
    except InvalidQuery as exc:
        notes.append(f"not charted: {key.text}: {exc}")
        return ()
    notes += [f"{key.text}: {w}" for w in result.warnings]
    match = [s for s in result.series if s.series == key]
    return tuple(
        (p.timestamp, p.value) for p in (match[0].points if match else ())
        if not is_counter or p.timestamp + step <= window.now
    )  # fmt: skip


def legend_label(key: SeriesKey, is_counter: bool = False) -> str:
    """Short legend words: ``p99 chat/e2e on n1 gpu 0``, ``gpu_power_watts host=n1 gpu=0``."""
    lab = key.label_dict
    if key.metric == P99[0]:
        where = " ".join(f"{k} {lab[k]}" for k in ("host", "gpu") if lab.get(k))
        name = f"p{float(lab.get('quantile', '0')) * 100:g} {lab.get('service')}/"
        return name + f"{lab.get('phase')}" + (f" on {where}" if where else "")
    words = " ".join(f"{k}={lab[k]}" for k in LEGEND_LABELS if lab.get(k))
    if is_counter and key.metric == "gpu_throttle_seconds_total":
        return f"throttle residency {words}"
    name = f"rate of {key.metric}" if is_counter else key.metric
    return f"{name} {words}".strip()


def query_url(series: str, start: float, end: float, step: float, fn: str = "") -> str:
    """The API's range query for a charted series, over the chart's window and step
    (``fn=rate`` for a counter, as charted)."""
    args = {"query": series, "start": _arg(start), "end": _arg(end), "step": _arg(step)}
    return "/api/v1/query_range?" + urlencode(args | ({"fn": fn} if fn else {}))


def _arg(x: float) -> str:
    """Unix seconds as an API argument: ``1800000000``, ``0.5`` (never ``1.8e+09``)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.3f}".rstrip("0").rstrip(".")


# -- words -----------------------------------------------------------------------------------
def _cause_view(c: RankedCause) -> CauseView:
    lines = tuple(EvidenceLine(e, evidence_sentence(e)) for e in c.evidence)
    return CauseView(str(c.cause), c.confidence, c.summary, lines)


def _num(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.4g}"


def evidence_sentence(e: Evidence) -> str:
    """One piece of evidence in words: statistic, value against threshold, window, lag.

    >>> evidence_sentence(Evidence("s", "max_rise_c", 7.5, 5, lag_seconds=10, strength=0.9))
    'max_rise_c was 7.5, above its threshold of 5; it leads the latency by 10 s (correlation 0.9)'
    """
    text = f"{e.statistic} was {_num(e.value)}"
    if e.threshold is not None and math.isfinite(e.threshold) and math.isfinite(e.value):
        side = "above" if e.value > e.threshold else "at" if e.value == e.threshold else "below"
        text += f", {side} its threshold of {_num(e.threshold)}"
    if e.window_start_ms is not None and e.window_end_ms is not None:
        text += f", over {utc_time(e.window_start_ms)} to {utc_time(e.window_end_ms)} UTC"
    lead = []
    if e.lag_seconds is not None:
        lead.append(f"it leads the latency by {_num(e.lag_seconds)} s")
    if e.strength is not None:
        lead.append(f"correlation {_num(e.strength)}")
    if lead:
        text += "; " + (lead[0] + (f" ({lead[1]})" if len(lead) > 1 else ""))
    return text + (f"; {e.note}" if e.note else "")


def entities_of(alerts: Sequence[Alert]) -> tuple[Entity, ...]:
    """The distinct entities the alerts name, each with the alert names raised on it."""
    found: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for a in alerts:
        key = tuple((k, a.labels[k]) for k in ENTITY_LABELS if a.labels.get(k))
        names = found.setdefault(key, [])
        name = a.labels.get("alertname", "")
        if name and name not in names:
            names.append(name)
    return tuple(Entity(k, tuple(v)) for k, v in found.items())


def utc(ms: int | None) -> str:
    """``2027-01-15 08:00:00 UTC``."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def duration(ms: int) -> str:
    """``1 h 5 min``, ``12 min``, ``40 s``: spans as people say them.

    >>> duration(3_900_000), duration(720_000), duration(40_000), duration(90_061_000)
    ('1 h 5 min', '12 min', '40 s', '1 d 1 h')
    """
    s = max(int(ms // 1000), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def relative(ms: int | None, now_ms: int) -> str:
    """``12 min ago`` or ``in 3 min``, from the store's clock."""
    if ms is None:
        return ""
    delta = now_ms - ms
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


# -- the chart -------------------------------------------------------------------------------
def _lines(series: Sequence[ChartedSeries]) -> list[svgchart.Line]:
    return [svgchart.Line(s.series, s.label, s.points, s.unit) for s in series]


def incident_chart(view: IncidentView) -> str:
    """The SVG: p99 on top, the causes' series below (each scaled to its own range when
    their units differ), the incident's window marked."""
    inc = view.incident
    units = sorted({s.unit for s in view.cause_series})
    panels = [
        svgchart.Panel("p99 latency of the affected workloads", "seconds", _lines(view.p99),
                       empty_text="no p99 series for this incident's workloads"),
        svgchart.Panel(view.cause_panel_title, units[0] if len(units) == 1 else "",
                       _lines(view.cause_series), normalise=len(units) > 1,
                       empty_text="no evidence series to chart"),
    ]  # fmt: skip
    end = inc.resolved_ms
    marks = [svgchart.Mark(inc.opened_ms / 1000, "opened")]
    marks.append(svgchart.Mark(end / 1000, "resolved") if end else
                 svgchart.Mark(view.now_ms / 1000, "now"))  # fmt: skip
    return svgchart.render_chart(
        panels, view.window_start_ms / 1000, view.window_end_ms / 1000, marks,
        title=f"{inc.title}: p99 latency and cause series",
    )  # fmt: skip
