"""The frame builder: series routed to rows, counters differenced once, cells reduced."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.frame import FrameBuilder, counter_deltas
from hbmwatch.records import SeriesKey
from store.feed import SampleBlock

GPU = {"cluster": "c", "rack": "r0", "host": "n1", "gpu": "0", "sku": "H200", "vendor": "nvidia"}
OTHER = {**GPU, "gpu": "1"}
KEYS = {
    1: SeriesKey("gpu_memory_temperature_celsius", GPU),
    2: SeriesKey("gpu_pcie_replays_total", GPU),
    3: SeriesKey("gpu_fabric_errors_total", {**GPU, "link": "3"}),
    4: SeriesKey("gpu_throttle_seconds_total", {**GPU, "reason": "hbm_thermal"}),
    5: SeriesKey("gpu_memory_bandwidth_utilization_ratio", {**GPU, "partition": "1"}),
    6: SeriesKey("gpu_memory_bandwidth_utilization_ratio", {**GPU, "partition": "2"}),
    7: SeriesKey("gpu_hbm_stack_temperature_celsius", {**OTHER, "stack": "2"}),
    8: SeriesKey("gpu_power_watts", {**GPU, "partition": "1"}),  # not partition 0: ignored
    9: SeriesKey("gpu_fabric_errors_total", {**GPU, "link": "5"}),
    10: SeriesKey("hbmwatch_target_up", {"target": "n1:9400", "host": "n1"}),
    11: SeriesKey("process_cpu_seconds_total", {}),  # no detector reads it
}


def block(rows: list[tuple[int, int, float]]) -> SampleBlock:
    sid, ts, val = zip(*rows, strict=True)
    return SampleBlock(np.array(sid), np.array(ts), np.array(val, dtype=float))


def test_counters_are_differenced_once_across_frames_resets_and_wraps() -> None:
    b = FrameBuilder(KEYS.get)
    first = b.build(block([(2, 0, 10.0), (2, 1000, 12.0), (2, 2000, 15.0)]), 0, 3000, 1000)
    # The first sample has no predecessor: its increment is unknown, not its raw value.
    assert first.g("pcie_replays").tolist() == [[pytest.approx(np.nan, nan_ok=True), 2.0, 3.0]]
    # The next frame hands back an already used sample and a later one: only 3000 counts.
    again = b.build(block([(2, 2000, 15.0), (2, 3000, 16.0), (2, 6000, 99.0)]), 3000, 6000, 1000)
    assert np.nan_to_num(again.g("pcie_replays")).tolist() == [[1.0, 0.0, 0.0]]
    # 6000 was past the frame's end: it waits and is used by the frame it falls in.
    later = b.build(block([(2, 6000, 99.0), (2, 7000, 4.0)]), 6000, 8000, 1000)
    assert later.g("pcie_replays").tolist() == [[83.0, 4.0]]  # then a reset: 4 counts
    assert later.resets == {"c/n1/0": 1}
    wrap = b.build(block([(2, 8000, 2.0**32 - 6), (2, 9000, 4.0)]), 8000, 10000, 1000)
    assert wrap.resets == {} and wrap.g("pcie_replays")[0, 1] == 10.0


def test_rows_signals_and_cells() -> None:
    b = FrameBuilder(KEYS.get)
    rows = [
        (7, 1000, 71.0),
        (1, 0, 50.0), (1, 1000, 51.0), (1, 1500, 52.0),  # two in one cell: the last
        (5, 0, 0.2), (6, 0, 0.6), (5, 1000, 0.4),  # partitions: the mean
        (4, 0, 0.0), (4, 1000, 0.5), (4, 2000, 2.0),  # seconds of throttling per step
        (3, 0, 1.0), (3, 1000, 4.0), (9, 0, 0.0), (9, 2000, 2.0),
        (8, 0, 300.0), (10, 0, 1.0), (10, 2000, 0.0), (11, 0, 5.0),
        (1, -1000, 49.0),  # before the frame: late
    ]  # fmt: skip
    f = b.build(block(rows), 0, 3000, 1000)
    # Rows in the order the builder first met each entity (series ids ascending).
    assert f.gpus.keys == ["c/n1/0", "c/n1/1"] and f.gpus.labels[1]["gpu"] == "1"
    assert f.targets.keys == ["n1:9400"] and len(f.workloads) == 0
    assert f.late == 1
    np.testing.assert_equal(f.g("mem_temp")[0], [50.0, 52.0, np.nan])
    np.testing.assert_allclose(f.g("bw")[0, :2], [0.4, 0.4])
    np.testing.assert_equal(f.g("thr_hbm")[0], [np.nan, 0.5, 1.0])  # clipped to the step
    assert np.isnan(f.g("power")).all()
    assert f.stacks[1, 2, 1] == 71.0 and np.isnan(f.stacks[0]).all()
    assert f.link_errors == {"c/n1/0": {"3": 3.0, "5": 2.0}}
    assert f.t("up").tolist()[0][::2] == [1.0, 0.0]
    assert f.series[("gpu", "c/n1/0", "mem_temp")] == KEYS[1].text
    assert f.series[("gpu", "c/n1/0", "fabric_errors")] == KEYS[3].text  # the first link


def test_empty_and_zero_width_frames() -> None:
    b = FrameBuilder(KEYS.get)
    assert len(b.build(SampleBlock.empty(), 0, 1000, 1000).gpus) == 0
    assert b.build(block([(1, 0, 50.0)]), 0, 0, 1000).steps == 0


def test_counter_deltas_matches_prometheus_counting() -> None:
    # (float64 near 2**64 steps by 2048: a 64-bit wrap is counted to that precision)
    prev = np.array([10.0, 2.0**32 - 1, 2.0**64 - 4096, 100.0, np.nan])
    now = np.array([15.0, 3.0, 5.0, 7.0, 1.0])
    delta, reset = counter_deltas(prev, now)
    np.testing.assert_equal(delta, [5.0, 4.0, 4101.0, 7.0, np.nan])
    assert reset.tolist() == [False, False, False, True, False]
