"""Time-series charts as plain SVG text: no JavaScript, no plotting library, no I/O.

The incident page must be readable from a phone at 3 a.m. with scripts blocked, so the
chart is server-rendered markup: stacked panels sharing one UTC time axis, one
``<polyline>`` per series (its ``data-series`` attribute holds the series text, so tests and
people can tell exactly what is drawn), a legend, and the incident window marked.  Every
piece of text is escaped here: series texts carry quotes, and label values are user data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

#: Distinct on white and for the common colour-vision deficiencies (Okabe-Ito, then Tableau).
PALETTE = (
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
    "#7f3c8d", "#4d4d4d", "#8c564b", "#bcbd22", "#17becf", "#f0027f",
)  # fmt: skip
_TIME_STEPS_S = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
)  # fmt: skip
LEFT, RIGHT, TOP = 72.0, 18.0, 8.0
TITLE_H, AXIS_H, LEGEND_ROW_H, PANEL_GAP = 22.0, 22.0, 17.0, 14.0
LEGEND_CHARS = 118
INSET = 0.04


@dataclass(frozen=True)
class Line:
    """One series to draw: ``series`` is its text (the identity), ``label`` the legend words."""

    series: str
    label: str
    points: Sequence[tuple[float, float]]  # (unix seconds, value)
    unit: str = ""  # when it differs from its panel's (a normalised panel)


@dataclass(frozen=True)
class Panel:
    """A plot area with its own y axis.  ``normalise`` scales each line to its own range,
    for lines of different units (temperature beside throttle residency)."""

    title: str
    unit: str
    lines: Sequence[Line]
    normalise: bool = False
    empty_text: str = "no data in this window"
    log: bool = False  # a log axis: 3x and 50x both readable on one panel
    reference: float | None = None  # a dashed level to read against (1x: the baseline)
    reference_label: str = ""


@dataclass(frozen=True)
class Mark:
    """A labelled instant on the time axis (incident opened, resolved, now)."""

    at_s: float
    label: str


@dataclass
class _Frame:
    """Where one panel's plot area is, and the time range it maps."""

    x0: float
    x1: float
    y0: float
    y1: float
    start_s: float
    end_s: float
    colours: dict[str, str] = field(default_factory=dict)

    def x(self, t: float) -> float:
        return self.x0 + (t - self.start_s) / (self.end_s - self.start_s) * (self.x1 - self.x0)

    def y(self, fraction: float) -> float:
        """``fraction`` 0..1 of the axis; inset a little so lines never sit on the frame."""
        return self.y1 - (INSET + fraction * (1 - 2 * INSET)) * (self.y1 - self.y0)


# -- numbers and times ---------------------------------------------------------------------
def nice_step(raw: float) -> float:
    """The 1-2-2.5-5 x 10^k step at or above ``raw``, so tick labels stay short.

    >>> nice_step(0.013), nice_step(7), nice_step(2.2)
    (0.02, 10.0, 2.5)
    """
    if not math.isfinite(raw) or raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * power >= raw * (1 - 1e-9):
            return round(m * power, 12)
    return 10.0 * power


def value_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (the axis then spans first..last tick).

    >>> value_ticks(0.12, 0.93)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step((hi - lo) / max(count, 1))
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = first
    while v < hi + step * (1 - 1e-9):
        ticks.append(round(v, 12))
        v += step
    return ticks if len(ticks) > 1 else [first, first + step]


def log_ticks(lo: float, hi: float, max_ticks: int = 9) -> list[float]:
    """1-2-5 values covering ``[lo, hi]`` (both > 0) for a log axis; decades when crowded.

    >>> log_ticks(0.8, 60), log_ticks(0.9, 4000)
    ([0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0], [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0])
    """
    lo = max(lo, 1e-12)
    hi = max(hi, lo * 1.01)
    low, high = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in ((1.0, 2.0, 5.0), (1.0,)):
        seq = [round(m * 10.0**e, 12) for e in range(low, high + 1) for m in mantissas]
        first = max([v for v in seq if v <= lo * (1 + 1e-9)] or [seq[0]])
        last = min([v for v in seq if v >= hi * (1 - 1e-9)] or [seq[-1]])
        ticks = [v for v in seq if first <= v <= last]
        if len(ticks) <= max_ticks:
            break
    return ticks


def time_ticks(start_s: float, end_s: float, max_ticks: int = 9) -> list[float]:
    """Instants on whole UTC minutes/hours inside the range, at most ``max_ticks`` of them.

    >>> [int(t) for t in time_ticks(1_800_000_000, 1_800_001_800)]
    [1800000000, 1800000300, 1800000600, 1800000900, 1800001200, 1800001500, 1800001800]
    """
    span = max(end_s - start_s, 1e-9)
    step = next((s for s in _TIME_STEPS_S if span / s <= max_ticks), _TIME_STEPS_S[-1])
    t = math.ceil(start_s / step) * step
    ticks = []
    while t <= end_s + 1e-9:
        ticks.append(float(t))
        t += step
    return ticks


def format_time(t: float, span_s: float) -> str:
    """``08:15`` (``08:15:30`` when ticks are seconds apart), UTC."""
    fmt = "%H:%M:%S" if span_s < 300 else "%H:%M"
    return datetime.fromtimestamp(t, UTC).strftime(fmt)


def format_value(v: float, unit: str) -> str:
    """A value with its unit, short enough for an axis: ``250 ms``, ``85 °C``, ``35%``.

    >>> format_value(0.25, "seconds"), format_value(85.0, "celsius"), format_value(0.35, "ratio")
    ('250 ms', '85 °C', '35%')
    >>> format_value(2.4, "times"), format_value(1.95e9, "hertz"), format_value(3e6, "errors/s")
    ('2.4x', '1.95 GHz', '3M errors/s')
    """
    if not math.isfinite(v):
        return str(v)
    if unit == "seconds":
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if unit == "celsius":
        return f"{v:.3g} °C"
    if unit in ("ratio", "percent_of_range"):
        return f"{v * 100:.3g}%"
    if unit == "times":
        return f"{v:.3g}x"
    if unit == "boolean":
        return f"{v:.3g}"
    base = unit if unit in _SI_UNITS else unit.removesuffix("/s")
    factor, prefix = next(((f, p) for f, p in _SI_PREFIXES if abs(v) >= f), (1.0, ""))
    if base in _SI_UNITS:  # the prefix joins the symbol: 1.95 GHz, 2 MB/s
        return f"{v / factor:.3g} {prefix}{_SI_UNITS[base]}" + unit.removeprefix(base)
    return f"{v / factor:.3g}{prefix} {unit}".rstrip()  # it joins the number: 3M errors/s


#: Unit names as a reader writes them, scaled with SI prefixes (2.1 GHz, not 2.1e+09 Hz).
_SI_UNITS = {"watts": "W", "hertz": "Hz", "bytes": "B", "bytes_per_second": "B/s",
             "transfers_per_second": "T/s", "joules": "J"}  # fmt: skip
_SI_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _finite(points: Sequence[tuple[float, float]], start_s: float, end_s: float) -> list:
    return [
        (t, v) for t, v in points if math.isfinite(t) and math.isfinite(v) and start_s <= t <= end_s
    ]


# -- drawing -------------------------------------------------------------------------------
def _text(x: float, y: float, body: str, cls: str, anchor: str = "start") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}">{escape(body)}</text>'
    )


def _clip(label: str, limit: int = LEGEND_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _y_axis(f: _Frame, ticks: list[float], unit: str, log: bool) -> list[str]:
    """Grid lines and labels; on a log axis ``ticks`` are log10 positions."""
    out = []
    lo, hi = ticks[0], ticks[-1]
    for v in ticks:
        y = f.y((v - lo) / (hi - lo))
        out.append(f'<line x1="{f.x0:.1f}" y1="{y:.1f}" x2="{f.x1:.1f}" y2="{y:.1f}" '
                   'class="grid"/>')  # fmt: skip
        label = format_value(10.0**v if log else v, unit)
        out.append(_text(f.x0 - 6, y + 4, label, "tick", "end"))
    return out


def _reference(f: _Frame, panel: Panel, lo: float, hi: float) -> list[str]:
    """A dashed level (the baseline, 1x) across the plot, labelled at its right end."""
    if panel.reference is None or panel.normalise:
        return []
    level = _scaled(panel.reference, panel.log)
    if level is None or not lo <= level <= hi:
        return []
    y = f.y((level - lo) / (hi - lo))
    label = panel.reference_label or format_value(panel.reference, panel.unit)
    return [
        f'<line x1="{f.x0:.1f}" y1="{y:.1f}" x2="{f.x1:.1f}" y2="{y:.1f}" class="ref"/>',
        _text(f.x1 - 4, y - 4, label, "ref-label", "end"),
    ]


def _scaled(v: float, log: bool) -> float | None:
    """A value where the axis puts it: log10 on a log axis (None for v <= 0 there)."""
    if not log:
        return v
    return math.log10(v) if v > 0 else None


def _x_axis(f: _Frame) -> list[str]:
    out = []
    span = f.end_s - f.start_s
    for t in time_ticks(f.start_s, f.end_s):
        x = f.x(t)
        out.append(f'<line x1="{x:.1f}" y1="{f.y0:.1f}" x2="{x:.1f}" y2="{f.y1:.1f}" '
                   'class="grid vgrid"/>')  # fmt: skip
        out.append(_text(x, f.y1 + 15, format_time(t, span), "tick", "middle"))
    return out


def _marks(f: _Frame, marks: Sequence[Mark], label_them: bool) -> list[str]:
    """The incident window shaded, its edges as dashed lines (labelled on the top panel)."""
    inside = sorted(m.at_s for m in marks if f.start_s <= m.at_s <= f.end_s)
    out = []
    if len(inside) >= 2:
        x0, x1 = f.x(inside[0]), f.x(inside[-1])
        out.append(f'<rect x="{x0:.1f}" y="{f.y0:.1f}" width="{x1 - x0:.1f}" '
                   f'height="{f.y1 - f.y0:.1f}" class="window"/>')  # fmt: skip
    for m in marks:
        if not f.start_s <= m.at_s <= f.end_s:
            continue
        x = f.x(m.at_s)
        out.append(f'<line x1="{x:.1f}" y1="{f.y0:.1f}" x2="{x:.1f}" y2="{f.y1:.1f}" '
                   f'class="mark"><title>{escape(m.label)}</title></line>')  # fmt: skip
        if label_them:  # right of its line, or left of it near the plot's right edge
            right = x + 7 * len(m.label) + 6 < f.x1
            out.append(_text(x + 3 if right else x - 3, f.y0 + 12, m.label, "mark-label",
                             "start" if right else "end"))  # fmt: skip
    return out


def _polyline(f: _Frame, line: Line, pts: list, lo: float, hi: float, colour: str) -> str:
    coords = " ".join(f"{f.x(t):.1f},{f.y((v - lo) / (hi - lo)):.1f}" for t, v in pts)
    if len(pts) == 1:  # one point draws nothing as a line: repeat it with a round cap
        coords = f"{coords} {coords}"
    return (
        f'<polyline data-series="{escape(line.series)}" points="{coords}" fill="none" '
        f'stroke="{colour}" class="series"><title>{escape(line.label)}\n'
        f"{escape(line.series)}</title></polyline>"
    )


def _ranges(panel: Panel, data: list[list]) -> tuple[list[float], list[tuple[float, float]]]:
    """The axis ticks, and the (lo, hi) each line is mapped from (log10 on a log axis)."""
    if panel.normalise:
        spans = []
        for pts in data:
            vs = [v for _, v in pts] or [0.0]
            lo, hi = min(vs), max(vs)
            spans.append((lo, hi) if hi > lo else (lo - 0.5, hi + 0.5))
        return [0.0, 0.25, 0.5, 0.75, 1.0], spans
    values = [v for pts in data for _, v in pts]
    if panel.reference is not None:
        level = _scaled(panel.reference, panel.log)
        values += [] if level is None else [level]
    values = values or [0.0, 1.0]
    if panel.log:
        real = log_ticks(10.0 ** min(values), 10.0 ** max(values))
        ticks = [math.log10(t) for t in real]
    else:
        ticks = value_ticks(min(values), max(values))
    return ticks, [(ticks[0], ticks[-1])] * len(data)


def _legend(f: _Frame, panel: Panel, data: list[list], spans: list, y: float) -> list[str]:
    out = []
    for line, pts, (lo, hi) in zip(panel.lines, data, spans, strict=True):
        colour = f.colours[line.series]
        label = line.label
        if not pts:
            label += " (no data in this window)"
        elif panel.normalise:
            unit = line.unit or panel.unit
            label += f" [{format_value(lo, unit)} to {format_value(hi, unit)}]"
        out.append(f'<g class="legend-item" data-series="{escape(line.series)}">'
                   f'<title>{escape(line.series)}</title>'
                   f'<line x1="{f.x0:.1f}" y1="{y - 4:.1f}" x2="{f.x0 + 22:.1f}" '
                   f'y2="{y - 4:.1f}" stroke="{colour}" class="swatch"/>'
                   f"{_text(f.x0 + 30, y, _clip(label), 'legend')}</g>")  # fmt: skip
        y += LEGEND_ROW_H
    return out


def panel_height(panel: Panel, plot_h: float) -> float:
    return TITLE_H + plot_h + AXIS_H + LEGEND_ROW_H * max(len(panel.lines), 1) + 4


def _panel(panel: Panel, f: _Frame, marks: Sequence[Mark], first: bool) -> list[str]:
    data = [_finite(line.points, f.start_s, f.end_s) for line in panel.lines]
    if panel.log:  # a log axis draws log10 of what is above zero
        data = [[(t, math.log10(v)) for t, v in pts if v > 0] for pts in data]
    unit = "percent_of_range" if panel.normalise else panel.unit
    title = panel.title + (" (each series scaled to its own range)" if panel.normalise else "")
    title += " (log scale)" if panel.log else ""
    out = [_text(LEFT - 64, f.y0 - 8, title, "panel-title")]
    out.append(f'<rect x="{f.x0:.1f}" y="{f.y0:.1f}" width="{f.x1 - f.x0:.1f}" '
               f'height="{f.y1 - f.y0:.1f}" class="plot"/>')  # fmt: skip
    ticks, spans = _ranges(panel, data)
    out += _y_axis(f, ticks, unit, panel.log and not panel.normalise) + _x_axis(f)
    out += _marks(f, marks, first) + _reference(f, panel, ticks[0], ticks[-1])
    for line, pts, (lo, hi) in zip(panel.lines, data, spans, strict=True):
        if pts:
            out.append(_polyline(f, line, pts, lo, hi, f.colours[line.series]))
    if not any(data):
        mid = (f.x0 + f.x1) / 2
        out.append(_text(mid, (f.y0 + f.y1) / 2, panel.empty_text, "empty", "middle"))
    return out + _legend(f, panel, data, spans, f.y1 + AXIS_H + 14)


_STYLE = (
    "text{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;fill:#333}"
    ".tick{font-size:11px;fill:#666}.legend{font-size:12px}"
    ".panel-title{font-size:13px;font-weight:600}.empty{font-size:13px;fill:#888}"
    ".plot{fill:#fff;stroke:#ccc}.grid{stroke:#eee}.vgrid{stroke:#f2f2f2}"
    ".window{fill:#fbe3e3;opacity:.55}.mark{stroke:#b00020;stroke-dasharray:4 3}"
    ".mark-label{font-size:11px;fill:#b00020;paint-order:stroke;stroke:#fff;stroke-width:3px}"
    ".series{stroke-width:1.8;stroke-linejoin:round;stroke-linecap:round}"
    ".swatch{stroke-width:3}"
    ".ref{stroke:#555;stroke-width:1.2;stroke-dasharray:6 4}"
    ".ref-label{font-size:11px;fill:#555;paint-order:stroke;stroke:#fff;stroke-width:3px}"
)


def render_chart(
    panels: Sequence[Panel],
    start_s: float,
    end_s: float,
    marks: Sequence[Mark] = (),
    *,
    width: float = 960.0,
    plot_height: float = 170.0,
    title: str = "",
) -> str:
    """The panels stacked over one time axis, as one ``<svg>`` element (a string).

    Colours are assigned across all panels in order, so no two series share one.
    """
    if not end_s > start_s:
        end_s = start_s + 1.0
    colours: dict[str, str] = {}
    for panel in panels:
        for line in panel.lines:
            colours.setdefault(line.series, PALETTE[len(colours) % len(PALETTE)])
    body: list[str] = []
    y = TOP
    for i, panel in enumerate(panels):
        y0 = y + TITLE_H
        f = _Frame(LEFT, width - RIGHT, y0, y0 + plot_height, start_s, end_s, colours)
        body += [f'<g class="panel" data-panel="{i}">', *_panel(panel, f, marks, i == 0), "</g>"]
        y += panel_height(panel, plot_height) + PANEL_GAP
    height = max(y, TOP + 40)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="100%" role="img" class="chart" preserveAspectRatio="xMidYMin meet">'
        f"<title>{escape(title or 'chart')}</title><style>{_STYLE}</style>"
        + "".join(body)
        + "</svg>"
    )
