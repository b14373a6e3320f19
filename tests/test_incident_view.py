"""The incident page's content (api/incident/view.py) and its SVG chart (svgchart.py).

The scenario is what on-call meet most: a GPU's memory heats up, HBM throttling follows,
and the p99 of the workload on that GPU regresses; the alert engine groups the regression
and the thermal alert into one incident, and the view must chart exactly the p99 and the
series behind the ranked causes, over the incident's window.
"""

from __future__ import annotations

import dataclasses
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.incident import svgchart
from hbmwatch.api.incident.view import (
    PAD_AFTER_MS,
    PAD_BEFORE_MS,
    build_incident_view,
    chart_window,
    incident_chart,
)
from hbmwatch.detectors.base import make_finding
from hbmwatch.records import Evidence, Finding, RankedCause, Sample, SeriesKey, Severity
from hbmwatch.settings import AlertSettings
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from hbmwatch.validation import InvalidQuery
from tests.conftest import NOW, Clock

SVG = "{http://www.w3.org/2000/svg}"
NOW_MS = int(NOW * 1000)
OPENED_MS = NOW_MS - 20 * 60_000  # the regression starts 20 min before "now"
GPU = {"cluster": "c0", "rack": "r0", "host": "n1", "gpu": "0"}
WORKLOAD = {**GPU, "service": "chat", "phase": "e2e"}
P99 = SeriesKey("workload_latency_seconds", {**WORKLOAD, "quantile": "0.99"})
P50 = SeriesKey("workload_latency_seconds", {**WORKLOAD, "quantile": "0.5"})
OTHER_P99 = SeriesKey("workload_latency_seconds", {**P99.label_dict, "host": "n2"})
TEMP = SeriesKey("gpu_memory_temperature_celsius", GPU)
THROTTLE = SeriesKey("gpu_throttle_seconds_total", {**GPU, "reason": "hbm_thermal"})
SEL = 'cluster="c0",host="n1",gpu="0"'  # how the root-cause detector names the GPU
MISSING = f'gpu_clock_hertz{{{SEL},domain="compute"}}'  # evidence whose series is not stored


@dataclass
class Scenario:
    store: Store
    clock: Clock
    incident_id: str
    regression: Finding


def write_series(store: Store, start_ms: int, end_ms: int) -> None:
    """Every 5 s: memory warms from 70 C to 92 C over the 10 min around the onset; from a
    minute before it, HBM throttling holds 40% of the time and p99 goes from 0.25 s to 0.8 s."""
    samples, throttled = [], 0.0
    for ts in range(start_ms, end_ms + 1, 5000):
        hot = ts >= OPENED_MS - 60_000
        warming = min(max((ts - OPENED_MS + 300_000) / 600_000, 0.0), 1.0)
        throttled += 2.0 if hot else 0.0
        samples += [
            Sample(P99, ts, 0.8 if hot else 0.25), Sample(P50, ts, 0.1),
            Sample(OTHER_P99, ts, 0.3), Sample(TEMP, ts, 70.0 + 22.0 * warming),
            Sample(THROTTLE, ts, throttled),
        ]  # fmt: skip
    result = store.write(samples)
    assert result.rejected_total == 0, result.errors


def regression_finding() -> Finding:
    window = {"window_start_ms": OPENED_MS - 60_000, "window_end_ms": OPENED_MS + 300_000}
    thermal = RankedCause("cooling", 0.82, (
        Evidence(f"load-adjusted rise of gpu_memory_temperature_celsius{{{SEL}}}",
                 "max change vs the 300 s before", 22.0, 5.0, **window, lag_seconds=10.0,
                 strength=0.84),
        Evidence(f'gpu_throttle_seconds_total{{{SEL},reason="hbm_thermal"}}',
                 "mean change vs the 300 s before", 0.4, 0.2, **window, lag_seconds=5.0,
                 strength=0.77),
        Evidence("GPUs of rack r0", "fraction_of_gpus_rising", 0.9, 0.5),
    ), "rack r0 warms as a whole: its coolant")  # fmt: skip
    clock = RankedCause("clock_drop", 0.12, (Evidence(MISSING, "drop change", 0.1, 0.15),))
    return make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency", entity=WORKLOAD,
        severity=Severity.CRITICAL, summary="p99 of chat/e2e 3.2x its baseline",
        started_ms=OPENED_MS, raised_ms=OPENED_MS, updated_ms=OPENED_MS,
        evidence=[Evidence(P99.text, "p99_seconds", 0.8, 0.375, OPENED_MS, OPENED_MS)],
        causes=[thermal, clock],
    )  # fmt: skip


def thermal_finding(entity: dict[str, str], started_ms: int) -> Finding:
    text = SeriesKey("gpu_memory_temperature_celsius", entity).text
    return make_finding(
        kind=FindingKind.THERMAL_EXCURSION, detector="thermal", entity=entity,
        severity=Severity.WARNING, summary=f"HBM of {entity['host']} gpu {entity['gpu']} hot",
        started_ms=started_ms, raised_ms=started_ms, updated_ms=started_ms,
        evidence=[Evidence(text, "temperature_c", 92.0, None, started_ms, started_ms)],
    )  # fmt: skip


def scenario(store: Store, clock: Clock) -> Scenario:
    """An open incident on rack r0: a p99 regression plus its GPU's thermal alert."""
    write_series(store, NOW_MS - 40 * 60_000, NOW_MS)
    alerting = Alerting(store, AlertSettings(external_url="http://hbmwatch.test"))
    alerting.start()
    reg = regression_finding()
    hot = thermal_finding(GPU, OPENED_MS + 30_000)
    store.findings.save([reg, hot])
    alerting.process([reg], now_ms=OPENED_MS)
    alerting.process([hot], now_ms=OPENED_MS + 30_000)
    (inc,) = store.alerts.incidents()
    return Scenario(store, clock, inc.id, reg)


@pytest.fixture
def world(store: Store, clock: Clock) -> Scenario:
    return scenario(store, clock)


# -- the view --------------------------------------------------------------------------------
def test_the_view_charts_the_workloads_p99_and_the_top_causes_series(world: Scenario) -> None:
    view = build_incident_view(world.store, world.incident_id)
    assert view is not None
    assert view.incident.title.startswith("rack r0 (c0)")  # the words are the engine's
    assert [s.series for s in view.p99] == [P99.text]  # not the p50, not host n2's workload
    assert [s.series for s in view.cause_series] == [TEMP.text, THROTTLE.text]
    assert view.cause_panel_title == "Series behind the top causes"
    label = "cooling: throttle residency host=n1 gpu=0 reason=hbm_thermal"
    assert view.cause_series[1].label == label
    assert (view.window_start_ms, view.window_end_ms) == (OPENED_MS - PAD_BEFORE_MS,
                                                          NOW_MS + 60_000)  # fmt: skip
    p99 = dict(view.p99[0].points)
    assert 200 <= len(p99) <= 400 and view.step_s == 10
    assert p99[(OPENED_MS - 10 * 60_000) / 1000] == pytest.approx(0.25)
    assert p99[(OPENED_MS + 5 * 60_000) / 1000] == pytest.approx(0.8)
    throttle = view.cause_series[1]
    assert throttle.how == "rate" and throttle.unit == "ratio"
    assert dict(throttle.points)[(OPENED_MS + 5 * 60_000) / 1000] == pytest.approx(0.4)
    assert throttle.points[-1][0] + view.step_s <= NOW  # no bucket that is still filling
    temp = view.cause_series[0]
    assert temp.how == "avg" and temp.unit == "celsius"
    assert dict(temp.points)[(OPENED_MS + 10 * 60_000) / 1000] == pytest.approx(92.0)


def test_the_view_says_the_evidence_in_words_and_notes_what_it_could_not_chart(
    world: Scenario,
) -> None:
    view = build_incident_view(world.store, world.incident_id)
    assert view is not None
    cause = view.causes[0]
    assert (cause.cause, cause.confidence) == ("cooling", 0.82)
    rise = cause.evidence[0].sentence
    assert rise.startswith("max change vs the 300 s before was 22, above its threshold of 5")
    assert "leads the latency by 10 s (correlation 0.84)" in rise
    assert any("GPUs of rack r0" in n and "names no series" in n for n in view.notes)
    assert any(MISSING in n and "no such series" in n for n in view.notes)
    assert [e.evidence.statistic for e in view.evidence][:1] == ["p99_seconds"]


def test_alerts_entities_and_links(world: Scenario) -> None:
    view = build_incident_view(world.store, world.incident_id)
    assert view is not None
    names = [a.labels["alertname"] for a in view.alerts]
    assert names == ["P99LatencyRegression", "HBMThermalExcursion"]  # the order they joined
    entities = {e.text: e.alertnames for e in view.entities}
    assert entities == {
        "cluster=c0, rack=r0, host=n1, gpu=0, service=chat, phase=e2e": ("P99LatencyRegression",),
        "cluster=c0, rack=r0, host=n1, gpu=0": ("HBMThermalExcursion",),
    }
    assert view.detail_url == f"/api/v1/incidents/{world.incident_id}"
    assert view.acknowledge_url.endswith("/acknowledge")
    url = view.p99[0].query_url
    assert url.startswith("/api/v1/query_range?query=workload_latency_seconds%7B")
    assert url.endswith(f"&start={(OPENED_MS - PAD_BEFORE_MS) // 1000}"
                        f"&end={NOW_MS // 1000 + 60}&step=10")  # fmt: skip


def test_an_unknown_incident_is_none(store: Store) -> None:
    assert build_incident_view(store, "inc-nope") is None


def test_a_series_the_store_refuses_is_skipped_with_a_note(
    world: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = world.store.range_query

    def refuse(selector, *args, **kw):  # type: ignore[no-untyped-def]
        if selector.metric == TEMP.metric:
            raise InvalidQuery("the query would return too many points")
        return real(selector, *args, **kw)

    monkeypatch.setattr(world.store, "range_query", refuse)
    view = build_incident_view(world.store, world.incident_id)
    assert view is not None
    temp = next(s for s in view.cause_series if s.series == TEMP.text)
    assert temp.points == () and view.p99[0].points
    assert any(TEMP.text in n and "too many points" in n for n in view.notes)


def test_an_incident_without_cause_evidence_charts_its_findings_evidence(
    store: Store, clock: Clock
) -> None:
    other = {"cluster": "c0", "rack": "r9", "host": "n9", "gpu": "3"}
    key = SeriesKey("gpu_memory_temperature_celsius", other)
    store.write([Sample(key, NOW_MS - 60_000 * i, 80.0 + i) for i in range(30)])
    alerting = Alerting(store, AlertSettings())
    alerting.start()
    alerting.process([thermal_finding(other, NOW_MS - 600_000)], now_ms=NOW_MS - 600_000)
    (inc,) = store.alerts.incidents()
    store.alerts.save(incidents=[dataclasses.replace(inc, causes=())])  # whatever the engine ranks
    view = build_incident_view(store, inc.id)
    assert view is not None and view.causes == ()
    assert view.cause_panel_title == "Series behind the findings"
    assert [s.series for s in view.cause_series] == [key.text]
    assert view.p99 == ()  # nothing runs on that GPU
    svg = incident_chart(view)
    assert "no p99 series for this incident" in svg


def test_a_resolved_incident_is_charted_to_a_little_after_it_ended(world: Scenario) -> None:
    inc = world.store.alerts.incident(world.incident_id)
    assert inc is not None
    done = dataclasses.replace(inc, resolved_ms=OPENED_MS + 300_000)
    assert chart_window(done, NOW_MS) == (OPENED_MS - PAD_BEFORE_MS,
                                          OPENED_MS + 300_000 + PAD_AFTER_MS)  # fmt: skip
    just_now = dataclasses.replace(inc, resolved_ms=NOW_MS - 1000)
    assert chart_window(just_now, NOW_MS)[1] == NOW_MS + 60_000  # never far past now


def test_the_incident_chart_has_one_polyline_per_charted_series(world: Scenario) -> None:
    view = build_incident_view(world.store, world.incident_id)
    assert view is not None
    root = ET.fromstring(incident_chart(view))
    drawn = [p.get("data-series") for p in root.iter(f"{SVG}polyline")]
    assert drawn == [P99.text, TEMP.text, THROTTLE.text]
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert "opened" in titles and "now" in titles
    panels = [g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]
    assert [[p.get("data-series") for p in g.iter(f"{SVG}polyline")] for g in panels] == [
        [P99.text],
        [TEMP.text],
        [THROTTLE.text],
    ]  # one panel per unit: °C apart from a fraction
    assert "scaled to its own range" not in ET.tostring(root, encoding="unicode")


# -- the chart -------------------------------------------------------------------------------
T0 = NOW  # 08:00:00 UTC


def ramp(n: int = 50, lo: float = 0.0, hi: float = 1.0, t0: float = T0) -> list:
    return [(t0 + i * 30, lo + (hi - lo) * i / (n - 1)) for i in range(n)]


def chart(*panels: svgchart.Panel, marks: tuple = ()) -> ET.Element:
    svg = svgchart.render_chart(panels, T0, T0 + 1800, marks, title="t")
    return ET.fromstring(svg)  # raises on anything that is not well-formed XML


def coords(el: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in (el.get("points") or "").split()]


def test_every_point_lies_inside_the_view_box_and_the_plot() -> None:
    lines = [svgchart.Line("a", "a", ramp(lo=-5, hi=300)), svgchart.Line("b", "b", ramp(hi=1e-3))]
    root = chart(svgchart.Panel("p", "celsius", lines))
    _, _, width, height = map(float, root.get("viewBox", "").split())
    plot = next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "plot")
    x0, y0 = float(plot.get("x", "")), float(plot.get("y", ""))
    x1, y1 = x0 + float(plot.get("width", "")), y0 + float(plot.get("height", ""))
    polylines = list(root.iter(f"{SVG}polyline"))
    assert len(polylines) == 2
    for p in polylines:
        for x, y in coords(p):
            assert 0 <= x <= width and 0 <= y <= height
            assert x0 - 0.05 <= x <= x1 + 0.05 and y0 - 0.05 <= y <= y1 + 0.05


def test_text_is_escaped() -> None:
    series = 'm{a="<&\\">"}'
    label = 'a<b & "c"'
    svg = svgchart.render_chart(
        [svgchart.Panel('t<&"', "s", [svgchart.Line(series, label, ramp())])],
        T0, T0 + 1800, [svgchart.Mark(T0 + 60, "<opened>")], title="<x>",
    )  # fmt: skip
    assert "<b" not in svg and "<opened>" not in svg and "<&" not in svg
    root = ET.fromstring(svg)
    (p,) = root.iter(f"{SVG}polyline")
    assert p.get("data-series") == series
    texts = "".join(root.itertext())
    assert label in texts and "<opened>" in texts and 't<&"' in texts


def test_empty_series_draw_no_line_but_stay_in_the_legend() -> None:
    panel = svgchart.Panel("p", "seconds", [
        svgchart.Line("a", "has data", ramp()), svgchart.Line("b", "empty", []),
        svgchart.Line("c", "all NaN or outside", [(T0, math.nan), (T0 - 99, 1.0)]),
    ])  # fmt: skip
    root = chart(panel)
    assert [p.get("data-series") for p in root.iter(f"{SVG}polyline")] == ["a"]
    legend = [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend-item"]
    assert [g.get("data-series") for g in legend] == ["a", "b", "c"]
    assert "empty (no data in this window)" in "".join(root.itertext())


def test_a_chart_with_nothing_to_draw_says_so() -> None:
    root = chart(svgchart.Panel("p", "seconds", [], empty_text="nothing here"),
                 svgchart.Panel("q", "ratio", [svgchart.Line("a", "a", [])]))  # fmt: skip
    assert list(root.iter(f"{SVG}polyline")) == []
    text = "".join(root.itertext())
    assert "nothing here" in text and "no data in this window" in text


def test_time_axis_is_utc_and_the_incident_window_is_marked() -> None:
    marks = (svgchart.Mark(T0 + 300, "opened"), svgchart.Mark(T0 + 1500, "now"))
    root = chart(svgchart.Panel("p", "seconds", [svgchart.Line("a", "a", ramp())]), marks=marks)
    ticks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "tick"]
    assert {"08:00", "08:05", "08:30"} <= set(ticks)
    assert [m.findtext(f"{SVG}title") for m in root.iter(f"{SVG}line")
            if m.get("class") == "mark"] == ["opened", "now"]  # fmt: skip
    (window,) = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "window"]
    assert float(window.get("width", "0")) > 0


def test_series_get_distinct_colours_across_panels() -> None:
    panels = [svgchart.Panel(f"p{i}", "ratio", [svgchart.Line(f"s{i}{j}", "x", ramp())
                                                for j in range(3)]) for i in range(2)]  # fmt: skip
    root = chart(*panels)
    colours = [p.get("stroke") for p in root.iter(f"{SVG}polyline")]
    assert len(colours) == 6 and len(set(colours)) == 6


def test_a_normalised_panel_gives_each_series_the_full_height() -> None:
    lines = [svgchart.Line("t", "temp", ramp(lo=70, hi=92), "celsius"),
             svgchart.Line("r", "throttle", ramp(lo=0, hi=0.4), "ratio")]  # fmt: skip
    root = chart(svgchart.Panel("causes", "", lines, normalise=True))
    spans = []
    for p in root.iter(f"{SVG}polyline"):
        ys = [y for _, y in coords(p)]
        spans.append((min(ys), max(ys)))
    assert spans[0] == spans[1] and spans[0][1] - spans[0][0] > 100
    text = "".join(root.itertext())
    assert "[70 °C to 92 °C]" in text and "[0% to 40%]" in text


def test_a_single_point_still_draws() -> None:
    root = chart(svgchart.Panel("p", "seconds", [svgchart.Line("a", "a", [(T0 + 60, 0.2)])]))
    (p,) = root.iter(f"{SVG}polyline")
    assert len(coords(p)) == 2 and re.fullmatch(r"[\d.]+,[\d.]+ [\d.]+,[\d.]+", p.get("points"))
