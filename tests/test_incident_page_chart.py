"""The incident chart's ratio panel: times-its-baseline, a 1x line, and a log axis when
one regression is 50x and another 3x (both must stay readable)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hbmwatch.api.incident import svgchart
from hbmwatch.api.incident.series import ChartedSeries
from hbmwatch.api.incident.view import unit_panel

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_800_000_000.0


def step_series(name: str, base: float, factor: float) -> ChartedSeries:
    """A p99 at ``base`` seconds for 10 min, then ``factor`` times that for 10 min."""
    points = tuple((T0 + 10 * i, base * (factor if i >= 60 else 1.0)) for i in range(120))
    return ChartedSeries(name, name, "seconds", "avg", points, "", baseline=base)


def spans(svg: str) -> dict[str, float]:
    root = ET.fromstring(svg)
    plot = next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "plot")
    height = float(plot.get("height", "0"))
    out = {}
    for line in root.iter(f"{SVG}polyline"):
        ys = [float(p.split(",")[1]) for p in (line.get("points") or "").split()]
        out[line.get("data-series", "")] = (max(ys) - min(ys)) / height
    return out


def render(panel: svgchart.Panel) -> str:
    return svgchart.render_chart([panel], T0, T0 + 1200)


def test_50x_beside_3x_gets_a_log_axis_and_both_are_readable() -> None:
    panel = unit_panel("p99", "times", [step_series("sharp", 0.0024, 50.0),
                                        step_series("mild", 2.3, 3.0)], "none")  # fmt: skip
    assert panel.log and panel.reference == 1.0
    drawn = spans(render(panel))
    assert drawn["sharp"] > 0.8 and drawn["mild"] > 0.2  # linear would leave mild at 0.04
    ticks = {t.text for t in ET.fromstring(render(panel)).iter(f"{SVG}text")
             if t.get("class") == "tick"}  # fmt: skip
    assert {"1x", "10x", "50x"} <= ticks


def test_a_few_times_stays_linear_with_the_baseline_line_in_view() -> None:
    panel = unit_panel("p99", "times", [step_series("a", 0.0023, 3.3),
                                        step_series("b", 2.0, 3.2)], "none")  # fmt: skip
    assert not panel.log
    root = ET.fromstring(render(panel))
    (ref,) = [el for el in root.iter(f"{SVG}line") if el.get("class") == "ref"]
    plot = next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "plot")
    y0, h = float(plot.get("y", "0")), float(plot.get("height", "0"))
    assert y0 < float(ref.get("y1", "0")) < y0 + h
    assert "baseline (1x)" in "".join(root.itertext())
    assert min(spans(render(panel)).values()) > 0.5


def test_a_units_own_panel_has_no_baseline_line() -> None:
    temp = ChartedSeries("t", "t", "celsius", "avg", ((T0, 60.0), (T0 + 60, 90.0)), "")
    panel = unit_panel("causes", "celsius", [temp], "none")
    assert panel.reference is None and not panel.log
    assert 'class="ref"' not in render(panel)
