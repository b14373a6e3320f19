"""The GPU-error detector: fatal and reset codes page, benign storms warn, broken stays open."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.frame_builder import FrameBuilder
from hbmwatch.detectors.gpu_errors import GpuErrors
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.gpu_errors import lookup
from hbmwatch.records import SeriesKey, Severity
from hbmwatch.store.feed import SampleBlock
from hbmwatch.taxonomy import Cause, FindingKind

GPU = {"cluster": "c", "rack": "r0", "host": "r0-node1", "gpu": "3", "sku": "H200"}
KEY = "c/r0-node1/3"
STEP = 60  # seconds per hand-built frame


def frame(t0_s: int, **signals: list[float]) -> Frame:
    """One GPU's frame of ``STEP`` one-second steps; ``signals`` set at the frame's steps."""
    gpus = Entities()
    gpus.add(KEY, GPU)
    f = Frame(t0_s * 1000, 1000, STEP, gpus, Entities(), Entities(), {},
              np.full((1, MAX_STACKS, STEP), np.nan), {}, {}, {}, {}, {})  # fmt: skip
    for name, values in signals.items():
        row = np.full(STEP, np.nan if name in ("health", "remap_failed") else 0.0)
        row[: len(values)] = values
        f.gpu[name] = row[None, :]
    return f


def with_codes(f: Frame, **codes: float) -> Frame:
    f.gpu_errors = {KEY: {c.replace("_", ":"): n for c, n in codes.items()}}
    return f


def run(det: GpuErrors, frames: list[Frame]) -> list[list[object]]:
    return [det.update(f) for f in frames]


def quiet(t0_s: int, minutes: int) -> list[Frame]:
    return [frame(t0_s + i * STEP, err_benign=[0.0]) for i in range(minutes)]


def test_fatal_code_pages_names_the_code_and_holds_while_the_gpu_stays_silent() -> None:
    det = GpuErrors()
    out = det.update(with_codes(frame(0, err_fatal=[0, 0, 1]), xid_79=1))
    assert len(out) == 1
    f = out[0]
    assert f.kind == FindingKind.GPU_ERRORS and f.severity is Severity.CRITICAL
    assert f.summary == f"XID 79 on r0-node1 GPU 3: {lookup('xid', 79).meaning} (fatal)"
    assert f.started_ms == 2000 and f.top_cause == Cause.GPU_ERROR
    assert f.entity == {"cluster": "c", "rack": "r0", "host": "r0-node1", "gpu": "3"}
    ev = f.evidence[0]
    assert 'code="79"' in ev.series and lookup("xid", 79).meaning in ev.note
    assert "action: fatal" in ev.note
    # A GPU off the bus reports nothing more: the finding holds for the fatal hold (30 min).
    held = run(det, [frame(60 * m) for m in range(1, 29)])
    assert all(len(x) == 1 and x[0].ended_ms is None for x in held)
    ended = run(det, [frame(60 * m) for m in range(29, 32)])
    closing = [x for xs in ended for x in xs if x.ended_ms is not None]
    assert len(closing) == 1 and closing[0].id == f.id and "XID 79" in closing[0].summary


def test_fatal_holds_past_its_hold_while_the_gpu_sends_none_of_its_gauges() -> None:
    """A GPU off the bus for 45 minutes is one finding, not one that closes at 30 minutes
    while the GPU is still gone; it closes once the GPU reports again and the hold is over."""
    det = GpuErrors()
    assert det.update(frame(0, power=[300.0] * STEP)) == []
    (opened,) = det.update(with_codes(frame(60, power=[300.0] * 10, err_fatal=[0, 0, 1]),
                                      xid_79=1))  # fmt: skip
    gone = run(det, [frame(60 * m) for m in range(2, 47)])
    assert all(len(x) == 1 and x[0].ended_ms is None for x in gone)
    back = run(det, [frame(60 * m, power=[250.0] * STEP) for m in range(47, 49)])
    closing = [x for xs in back for x in xs if x.ended_ms is not None]
    assert len(closing) == 1 and closing[0].id == opened.id


def test_fatal_closes_early_once_health_passes_after_the_event() -> None:
    det = GpuErrors(recover_s=120)
    # Health read pass before the event: that does not count as recovered.
    det.update(with_codes(frame(0, err_fatal=[0, 0, 1], health=[0, 0, 0]), xid_79=1))
    assert det.update(frame(60))[0].ended_ms is None
    assert det.update(frame(120))[0].ended_ms is None
    passing = [frame(180 + 60 * i, health=[0.0] * STEP) for i in range(3)]
    out = run(det, passing)
    assert out[0][0].ended_ms is None and out[2][0].ended_ms is not None


def test_needs_reset_code_pages_and_resolves_after_the_hold_without_events() -> None:
    det = GpuErrors(hold_s=600)
    f = det.update(with_codes(frame(0, err_reset=[1]), xid_48=1))[0]
    assert f.severity is Severity.CRITICAL
    assert f.summary == f"XID 48 on r0-node1 GPU 3: {lookup('xid', 48).meaning} (needs a GPU reset)"
    out = run(det, [frame(60 * m) for m in range(1, 12)])
    ends = [x.ended_ms for xs in out for x in xs if x.ended_ms is not None]
    assert ends == [600_000 + 59_000]  # the first cycle 600 s after the event
    assert run(det, [frame(720)]) == [[]]


def test_benign_storm_warns_at_its_threshold_and_not_below() -> None:
    # Nine XID 13s in five minutes: one crash-looping job, no finding.
    det = GpuErrors()
    nine = [with_codes(frame(60 * m, err_benign=[1, 0, 1]), xid_13=2) for m in range(4)]
    nine.append(with_codes(frame(240, err_benign=[1]), xid_13=1))
    assert all(x == [] for x in run(det, nine))
    # The tenth within the window (the last 5 min) opens a warning naming the code and rate;
    # the first two events (at 0 s and 2 s) have left the window by then.
    f = det.update(with_codes(frame(290, err_benign=[1, 1, 1]), xid_13=3))
    assert len(f) == 1 and f[0].severity is Severity.WARNING
    assert f[0].summary.startswith("XID 13 storm on r0-node1 GPU 3: 10 events in 5 min")
    assert f[0].evidence[0].value >= 10 and f[0].evidence[0].threshold == 10
    # No new events for the hold (10 min): resolved; the storm is told by its peak.
    out = run(det, quiet(360, 11))
    assert [x.ended_ms is not None for xs in out for x in xs].count(True) == 1
    assert all("10 events in 5 min" in x.summary for xs in out for x in xs)


def test_unknown_codes_count_toward_a_storm_and_never_page_alone() -> None:
    det = GpuErrors(storm_events=3)
    out = det.update(with_codes(frame(0, err_benign=[1, 1, 1]), xid_9999=3))
    assert out[0].severity is Severity.WARNING
    assert "XID 9999" in out[0].summary and "not in the code table" in out[0].summary


def test_failed_row_remap_is_critical_while_it_reads_so() -> None:
    det = GpuErrors()
    out = det.update(frame(0, remap_failed=[0, 0, 1]))
    assert out[0].severity is Severity.CRITICAL
    assert out[0].summary.startswith("row remap failed on r0-node1 GPU 3")
    assert any(e.statistic == "row_remap_failed" for e in out[0].evidence)
    # Unknown (the GPU silent) keeps it; a replaced GPU reading 0 closes it.
    assert det.update(frame(60))[0].ended_ms is None
    assert det.update(frame(120, remap_failed=[0.0]))[0].ended_ms == 179_000


def test_xid_64_with_failed_remap_names_both() -> None:
    det = GpuErrors()
    f = with_codes(frame(0, err_fatal=[1], remap_failed=[1]), xid_64=1)
    out = det.update(f)[0]
    meaning = lookup("xid", 64).meaning
    assert out.summary == f"XID 64 on r0-node1 GPU 3: {meaning} (fatal); row remap failed"


def test_health_verdict_fail_is_critical_warn_is_not_a_finding() -> None:
    det = GpuErrors()
    assert det.update(frame(0, health=[1, 1, 1])) == []
    out = det.update(frame(60, health=[1, 2]))
    assert out[0].severity is Severity.CRITICAL and "health verdict fail" in out[0].summary


def test_no_error_series_no_finding_and_no_state() -> None:
    gpus = Entities()
    for g in range(8):
        gpus.add(f"c/n/{g}", {"cluster": "c", "host": "n", "gpu": str(g)})
    f = Frame(0, 1000, 60, gpus, Entities(), Entities(),
              {"mem_temp": np.full((8, 60), 50.0)}, np.full((8, MAX_STACKS, 60), np.nan),
              {}, {}, {}, {}, {})  # fmt: skip
    det = GpuErrors()
    assert det.update(f) == []
    assert det.open_ == {} and det.benign_ == {} and det.codes_ == {}


def test_state_round_trips_mid_episode() -> None:
    """A restart (state through JSON) gives the same findings as running on."""
    frames = [
        with_codes(frame(0, err_fatal=[1]), xid_79=1),
        *(with_codes(frame(60 * m, err_benign=[1, 1, 1]), xid_31=3) for m in range(1, 5)),
        *(frame(60 * m) for m in range(5, 40)),
    ]
    a, b = GpuErrors(), GpuErrors()
    want = run(a, frames)
    got = run(b, frames[:3])
    c = GpuErrors()
    c.load_state_dict(json.loads(json.dumps(b.state_dict(), allow_nan=False)))
    got += run(c, frames[3:])
    assert got == want
    assert any(x.ended_ms is not None for xs in want for x in xs)


def test_in_the_default_list_before_quality_and_root_cause() -> None:
    names = [d.name for d in default_detectors()]
    assert names.index("gpu_errors") < names.index("quality") < names.index("rootcause")


@pytest.mark.parametrize("bad", [{"storm_events": 0}, {"hold_s": 0}])
def test_bad_settings_are_one_clear_error(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        GpuErrors(**bad).update(frame(0))


# -- frames: error series become signals and codes ----------------------------------------
DEV = {"cluster": "c", "rack": "r0", "host": "r0-node1", "gpu": "3", "sku": "H200"}
SERIES = {
    1: SeriesKey("gpu_memory_temperature_celsius", DEV),
    2: SeriesKey("gpu_error_events_total", {**DEV, "scheme": "xid", "code": "13"}),
    3: SeriesKey("gpu_error_events_total", {**DEV, "scheme": "xid", "code": "79"}),
    4: SeriesKey("gpu_row_remap_failed", DEV),
    5: SeriesKey("gpu_health_status", {**DEV, "check": "pcie"}),
    6: SeriesKey("gpu_health_status", {**DEV, "check": "memory"}),
    7: SeriesKey("gpu_error_events_total", {**DEV, "scheme": "afid", "code": "x"}),
}


def block(rows: list[tuple[int, int, float]]) -> SampleBlock:
    sid, ts, val = zip(*rows, strict=True)
    return SampleBlock(np.array(sid), np.array(ts), np.array(val, dtype=float))


def test_error_counters_become_action_signals_and_codes() -> None:
    """As the collector writes them: a 0 one millisecond before a code's first event."""
    b = FrameBuilder(SERIES.get)
    first = b.build(block([(1, 0, 50.0), (2, 0, 5.0), (2, 1000, 5.0)]), 0, 2000, 1000)
    assert np.nansum(first.g("err_benign")) == 0 and first.gpu_errors == {}
    rows = [(1, 2000, 50.0), (3, 2999, 0.0), (3, 3000, 1.0), (2, 3000, 6.0)]
    later = b.build(block(rows), 2000, 4000, 1000)
    assert np.nan_to_num(later.g("err_fatal")).tolist() == [[0.0, 1.0]]
    assert np.nansum(later.g("err_benign")) == 1
    assert later.gpu_errors == {"c/r0-node1/3": {"xid:79": 1.0, "xid:13": 1.0}}
    # And only once.
    again = b.build(block([(3, 4000, 1.0), (3, 5000, 1.0)]), 4000, 6000, 1000)
    assert np.nansum(again.g("err_fatal")) == 0 and again.gpu_errors == {}


def test_remap_and_health_take_the_worst_check_and_bad_codes_are_ignored() -> None:
    b = FrameBuilder(SERIES.get)
    f = b.build(block([(4, 0, 0.0), (5, 0, 0.0), (6, 0, 2.0), (7, 0, 1.0), (1, 0, 50.0)]),
                0, 1000, 1000)  # fmt: skip
    assert f.g("health").tolist() == [[2.0]] and f.g("remap_failed").tolist() == [[0.0]]
    assert "err_benign" not in f.gpu and "err_fatal" not in f.gpu


def test_from_series_to_finding_through_the_builder() -> None:
    """The collector's counter, born at the event, through a real frame builder."""
    b, det = FrameBuilder(SERIES.get), GpuErrors()
    assert det.update(b.build(block([(1, 0, 50.0), (5, 0, 0.0)]), 0, 5000, 1000)) == []
    rows = [(1, 5000, 50.0), (3, 5999, 0.0), (3, 6000, 1.0), (6, 6000, 2.0)]
    f = b.build(block(rows), 5000, 10000, 1000)
    (found,) = det.update(f)
    assert found.summary.startswith("XID 79 on r0-node1 GPU 3: ")
    assert found.started_ms == 6000 and {e.statistic for e in found.evidence} == {
        "error_events", "health_status"
    }  # fmt: skip


def test_a_gpu_gone_from_the_frames_still_closes_after_its_hold() -> None:
    det = GpuErrors(hold_s=120)
    det.update(with_codes(frame(0, err_reset=[1]), xid_119=1))
    other = Entities()
    other.add("c/r0-node2/0", {**GPU, "host": "r0-node2", "gpu": "0"})
    empty = Frame(180_000, 1000, 60, other, Entities(), Entities(), {},
                  np.full((1, MAX_STACKS, 60), np.nan), {}, {}, {}, {}, {})  # fmt: skip
    (closed,) = det.update(empty)
    assert closed.ended_ms == 239_000 and closed.entity["host"] == "r0-node1"
    assert "XID 119" in closed.summary and det.open_ == {}


def test_health_fail_names_the_unknown_codes_that_came_with_it() -> None:
    """DME: a fatal RAS event's AFIDs (not in the table) and gpu_health 0 (fail)."""
    det = GpuErrors()
    f = with_codes(frame(0, err_benign=[1, 1], health=[0, 2]), afid_30=1, afid_25=1)
    (out,) = det.update(f)
    assert out.severity is Severity.CRITICAL
    assert out.summary == (
        "exporter health verdict fail on r0-node1 GPU 3; with AFID 30, AFID 25 "
        "(not in the code table)"
    )
