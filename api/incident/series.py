"""Reading the incident page's series from the store, and scaling latency to its baseline.

A p99 in milliseconds drawn beside a p99 in seconds sits flat at zero: what on-call need
from a latency series is "how many times slower than it was", not its raw value.  So every
latency (a gauge in seconds) is charted as a ratio to its own baseline: the median of its
points over the ``BASELINE_MS`` before the incident's first alert began (or before it
opened, if earlier).  A series with no points there (a workload seen for the first time)
takes the median of its first points instead, and says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from urllib.parse import urlencode

from hbmwatch import metrics
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import SeriesKey
from hbmwatch.store.store import Store
from hbmwatch.validation import InvalidQuery

STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TARGET_POINTS = 400
BASELINE_MS = 10 * 60_000  # the baseline is the median over this span before the incident
FIRST_POINTS = 3  # a series with nothing before the incident: the median of its first points
P99 = ("workload_latency_seconds", "0.99")
#: Labels worth a word in a legend (the rest stay in the series text).
LEGEND_LABELS = ("host", "gpu", "partition", "reason", "stack", "domain", "link", "direction")

Points = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Window:
    """The chart's span and step, now, and the baseline's span (unix seconds)."""

    start: float
    end: float
    step: float
    now: float
    baseline_start: float
    baseline_end: float


@dataclass(frozen=True)
class ChartedSeries:
    """One series on the chart: its text, legend words, unit, how it was read, points.

    ``points`` are the stored values (per step); a latency also has a ``baseline`` and is
    drawn as ``ratio_points`` (value over baseline), on an axis in "times its baseline".
    """

    series: str
    label: str
    unit: str
    how: str  # "avg" (mean per step) or "rate" (a counter's per-second rate)
    points: Points
    query_url: str
    baseline: float | None = None
    baseline_note: str = ""  # how the baseline was taken, when not the usual window

    @property
    def chart_unit(self) -> str:
        return "times" if self.baseline is not None else self.unit

    @property
    def chart_points(self) -> Points:
        """What is drawn: the ratio to the baseline for a latency, else the values."""
        if self.baseline is None:
            return self.points
        return tuple((t, v / self.baseline) for t, v in self.points)

    def peak_ratio(self, since: float) -> float:
        """The highest 3-step median ratio from ``since`` on: one noisy step is no effect."""
        values = [v for t, v in self.chart_points if t >= since and math.isfinite(v)]
        if len(values) < 3:
            return max(values, default=0.0)
        return max(statistics.median(values[i : i + 3]) for i in range(len(values) - 2))


def chart_step(span_ms: int) -> float:
    """The smallest round step giving at most ~400 points (200-400 for common spans).

    >>> chart_step(40 * 60_000), chart_step(3 * 3_600_000)
    (10, 30)
    """
    span_s = span_ms / 1000
    return next((s for s in STEPS_S if span_s / s <= TARGET_POINTS), STEPS_S[-1])


def read_series(
    store: Store, key: SeriesKey, tag: str, window: Window, notes: list[str]
) -> ChartedSeries:
    """One series over the window: gauges as the mean per step, counters as a rate, and a
    latency with its baseline."""
    definition = metrics.get(key.metric)
    is_counter = definition is not None and definition.is_counter
    unit = definition.unit if definition else ""
    if is_counter:
        unit = "ratio" if unit == "seconds" else f"{unit}/s"
    how = "rate" if is_counter else "avg"
    label = legend_label(key, is_counter)
    points = _read(store, key, is_counter, window, notes)
    url = query_url(key.text, window.start, window.end, window.step, how if is_counter else "")
    charted = ChartedSeries(key.text, f"{tag}: {label}" if tag else label, unit, how, points, url)
    if unit != "seconds" or is_counter:
        return charted
    baseline, how_taken = baseline_of(points, window)
    return ChartedSeries(charted.series, charted.label, unit, how, points, url, baseline,
                         how_taken)  # fmt: skip


def baseline_of(points: Points, window: Window) -> tuple[float | None, str]:
    """(baseline, note): the median over the baseline span, else of its first points.

    None (with the reason) when there is nothing above zero to divide by.
    """
    before = [v for t, v in points if window.baseline_start <= t < window.baseline_end]
    note = ""
    if not before:
        before = [v for _, v in points[:FIRST_POINTS]]
        note = "from its first points: none before the incident"
    usable = [v for v in before if math.isfinite(v)]
    if not usable:
        return None, "no points to take a baseline from"
    base = statistics.median(usable)
    if base <= 0:
        return None, "its baseline is 0"
    return base, note


def _read(
    store: Store, key: SeriesKey, is_counter: bool, window: Window, notes: list[str]
) -> Points:
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
