"""The frame builder: series routed to rows, counters differenced once, cells reduced."""

from __future__ import annotations

import numpy as np
import pytest

from hbmwatch.detectors.frame import TABLES, Entities, Frame, SeriesIndex
from hbmwatch.detectors.frame_builder import WRAPS, FrameBuilder, _stable_order, counter_deltas
from hbmwatch.detectors.signals import MAX_STACKS, SIGNAL_REDUCTION, SIGNALS
from hbmwatch.records import SeriesKey
from hbmwatch.store.feed import SampleBlock

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


# -- the fast builder against the one it replaced -------------------------------------------
def reference_counter_deltas(prev: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``counter_deltas`` as it was: the wrap arithmetic over every sample."""
    delta = values - prev
    drop = delta < 0
    wrapped = np.full(values.shape, np.nan)
    for span in WRAPS:
        fits = drop & np.isnan(wrapped) & (prev >= span / 2) & (prev < span)
        wrapped = np.where(fits, span - prev + values, wrapped)
    is_wrap = ~np.isnan(wrapped) & (wrapped < 2.0**30)
    reset = drop & ~is_wrap
    delta = np.where(is_wrap, wrapped, np.where(reset, values, delta))
    return delta, reset


class ReferenceBuilder(FrameBuilder):
    """``build`` as it was: counters gathered by series, then every sample sorted by
    signal and each signal reduced on its own (loops over fabric errors in Python)."""

    def build(self, block: SampleBlock, start_ms: int, end_ms: int, step_ms: int) -> Frame:
        steps = max(0, (end_ms - start_ms) // step_ms)
        frame = Frame(
            start_ms, step_ms, steps, Entities(), Entities(), Entities(), {},
            np.zeros((0, MAX_STACKS, steps)), {}, {}, {}, {}, {},
        )  # fmt: skip
        if len(block) == 0 or steps == 0:
            return frame
        frame.series = SeriesIndex(
            {"gpu": frame.gpus, "wl": frame.workloads, "tgt": frame.targets}, {}, self._text
        )
        ts, sids, vals = block.timestamps_ms, block.series_ids, block.values
        frame.late = int((ts < start_ms).sum())
        if len(ts) > 1 and (ts[1:] < ts[:-1]).any():
            order = np.argsort(ts, kind="stable")
            ts, sids, vals = ts[order], sids[order], vals[order]
        slot = self._slots(sids)
        kind = self._cols["kind"][slot]
        gauge = np.flatnonzero((kind == 0) & (ts >= start_ms) & (ts < end_ms))
        counter = np.flatnonzero(kind > 0)
        ct = ts[counter]
        counter = counter[(ct < end_ms) & (ct > self._last_ms[slot[counter]])]
        counter = counter[_stable_order(self._cols["counter_id"][slot[counter]])]
        inc = (
            self._ref_increments(frame, slot[counter], ts[counter], vals[counter])
            if len(counter)
            else np.zeros(0)
        )
        in_frame = ts[counter] >= start_ms
        pick = np.concatenate([gauge, counter[in_frame]])
        values = np.concatenate([vals[gauge], inc[in_frame]]).astype(float, copy=False)
        known = ~np.isnan(values)
        pick, values = pick[known], values[known]
        self._ref_scatter(frame, slot[pick], (ts[pick] - start_ms) // step_ms, values)
        return frame

    def _ref_increments(
        self, frame: Frame, slot: np.ndarray, t: np.ndarray, v: np.ndarray
    ) -> np.ndarray:
        first = np.empty(len(slot), bool)
        first[0], first[1:] = True, slot[1:] != slot[:-1]
        last = np.empty(len(slot), bool)
        last[-1], last[:-1] = True, first[1:]
        prev = np.empty(len(v))
        prev[1:] = v[:-1]
        prev[first] = self._last[slot[first]]
        delta, reset = reference_counter_deltas(prev, v)
        self._last[slot[last]] = v[last]
        self._last_ms[slot[last]] = t[last]
        gpus = self._entities[TABLES.index("gpu")]
        for s in slot[reset].tolist():
            if self._table[s] == 0:
                key = gpus.keys[self._entity[s]]
                frame.resets[key] = frame.resets.get(key, 0) + 1
        fabric = np.flatnonzero(self._cols["fabric"][slot] & (t >= frame.start_ms))
        for i in fabric[delta[fabric] > 0].tolist():
            errs = frame.link_errors.setdefault(gpus.keys[self._entity[slot[i]]], {})
            link = self._link[slot[i]]
            errs[link] = errs.get(link, 0.0) + float(delta[i])
        frac = np.flatnonzero(self._cols["kind"][slot] == 2)
        if len(frac):
            dt = np.where(first[frac], frame.step_ms, t[frac] - t[frac - 1]) / 1000.0
            delta[frac] = np.clip(delta[frac] / np.fmax(dt, 1e-3), 0.0, 1.0)
        return delta

    def _ref_scatter(
        self, frame: Frame, slot: np.ndarray, cols: np.ndarray, values: np.ndarray
    ) -> None:
        present = np.flatnonzero(np.bincount(slot, minlength=len(self._table)))
        codes = self._cols["group"][slot]
        order = np.argsort(codes, kind="stable")
        slot, cols, values = slot[order], cols[order], values[order]
        bounds = np.r_[0, np.cumsum(np.bincount(codes))]
        rows = np.zeros(len(self._table), np.int64)
        tables = (frame.gpus, frame.workloads, frame.targets)
        for table, ents in enumerate(tables):
            mine = present[self._cols["_table"][present] == table]
            seen = np.unique(self._cols["_entity"][mine])
            known = self._entities[table]
            ents.keys = [known.keys[e] for e in seen.tolist()]
            ents.labels = [known.labels[e] for e in seen.tolist()]
            ents.index = {k: i for i, k in enumerate(ents.keys)}
            rows[mine] = np.searchsorted(seen, self._cols["_entity"][mine])
            none = np.iinfo(np.int64).max
            matrix = np.full((len(ents), len(SIGNALS)), none, np.int64)
            np.minimum.at(matrix, (rows[mine], self._cols["_signal"][mine]), mine)
            matrix[matrix == none] = -1
            assert isinstance(frame.series, SeriesIndex)
            frame.series._slots[TABLES[table]] = matrix
        frame.stacks = np.full((len(frame.gpus), MAX_STACKS, frame.steps), np.nan)
        out = (frame.gpu, frame.wl, frame.tgt)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            if a == b:
                continue
            s, c, v = slot[a:b], cols[a:b], values[a:b]
            table, signal = int(self._cols["_table"][s[0]]), SIGNALS[self._signal[s[0]]]
            if signal == "stack":
                frame.stacks[rows[s], self._cols["_stack"][s], c] = v
            else:
                shape = (len(tables[table]), frame.steps)
                out[table][signal] = _ref_reduce(SIGNAL_REDUCTION[signal], shape, rows[s], c, v)


def _ref_reduce(how: str, shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray,
                values: np.ndarray) -> np.ndarray:  # fmt: skip
    if how == "last":
        arr = np.full(shape, np.nan)
        arr[rows, cols] = values
        return arr
    if how == "max":
        arr = np.full(shape, -np.inf)
        np.maximum.at(arr, (rows, cols), values)
        arr[np.isinf(arr)] = np.nan
        return arr
    flat = rows * shape[1] + cols
    size = shape[0] * shape[1]
    total = np.bincount(flat, weights=values, minlength=size).reshape(shape)
    count = np.bincount(flat, minlength=size).reshape(shape)
    with np.errstate(invalid="ignore"):
        return total / count if how == "mean" else np.where(count > 0, total, np.nan)


def random_keys(rng: np.random.Generator) -> dict[int, SeriesKey]:
    """Every kind of series a frame reads (and some it does not), for six GPUs."""
    keys: list[SeriesKey] = []
    for g in range(6):
        lab = {"cluster": "c", "rack": f"r{g // 3}", "host": f"n{g // 2}", "gpu": str(g % 2),
               "sku": "MI300X", "vendor": "amd"}  # fmt: skip
        keys += [
            SeriesKey("gpu_memory_temperature_celsius", lab),
            SeriesKey("gpu_hotspot_temperature_celsius", lab),
            SeriesKey("gpu_power_watts", lab),
            SeriesKey("gpu_power_watts", {**lab, "partition": "1"}),  # ignored
            SeriesKey("gpu_power_limit_watts", lab),
            *(
                SeriesKey("gpu_memory_bandwidth_utilization_ratio", {**lab, "partition": p})
                for p in ("1", "2")
            ),
            *(
                SeriesKey("gpu_hbm_stack_temperature_celsius", {**lab, "stack": str(s)})
                for s in (0, 3, 7)
            ),
            SeriesKey("gpu_clock_hertz", {**lab, "domain": "compute"}),
            SeriesKey("gpu_throttle_active", {**lab, "reason": "hbm_thermal"}),
            SeriesKey("gpu_throttle_seconds_total", {**lab, "reason": "hbm_thermal"}),
            SeriesKey("gpu_throttle_seconds_total", {**lab, "reason": "power"}),
            SeriesKey("gpu_pcie_replays_total", lab),
            *(SeriesKey("gpu_fabric_errors_total", {**lab, "link": str(k)}) for k in (1, 2)),
            SeriesKey("gpu_fabric_errors_total", {**lab, "link": "1", "port": "b"}),  # same link
            SeriesKey("gpu_fabric_errors_total", lab),  # no link: "all"
            SeriesKey("gpu_ecc_errors_total", {**lab, "severity": "uncorrectable"}),
            SeriesKey("gpu_memory_used_bytes", lab),  # no detector reads it
        ]
        svc = {"host": lab["host"], "gpu": lab["gpu"], "service": f"s{g}", "phase": "e2e"}
        keys += [
            SeriesKey("workload_latency_seconds", {**svc, "quantile": "0.99"}),
            SeriesKey("workload_window_requests", svc),
            SeriesKey("workload_requests_total", svc),
        ]
    for h in range(3):
        keys += [SeriesKey("hbmwatch_target_up", {"target": f"n{h}:9400", "host": f"n{h}"}),
                 SeriesKey("hbmwatch_scrape_dropped_total",
                           {"target": f"n{h}:9400", "reason": "sentinel"})]  # fmt: skip
    order = rng.permutation(len(keys))  # series ids in no particular order
    return {int(i) + 1: keys[j] for i, j in enumerate(order)}


def random_blocks(rng: np.random.Generator, keys: dict[int, SeriesKey], seconds: int
                  ) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:  # fmt: skip
    """Scrapes (one a second, jittered), by arrival: (arrival second, ids, times, values).

    Counters climb, reset and wrap, or stand still for minutes (as most error counters
    do); values go missing or NaN; some samples share a cell, some arrive late and out of
    order; series appear part-way through.
    """
    counter = [sid for sid, k in keys.items() if k.metric.endswith("_total")]
    level = {sid: float(rng.choice([0.0, 2.0**32 - 50, 1e6])) for sid in counter}
    out = []
    for sec in range(seconds):
        ids, ts, vs = [], [], []
        for sid in keys:
            if rng.random() < 0.05 or (sid % 7 == 0 and sec < seconds // 3):
                continue  # missing this scrape, or a series that appears later
            if sid in level:
                still = sid % 3 == 0 and (sec // 40) % 2 == 0  # still, then moving
                level[sid] += float(rng.poisson(3)) * (rng.random() < 0.6) * (not still)
                if rng.random() < 0.01 and not still:
                    level[sid] = float(rng.integers(0, 5))  # a reset
                if level[sid] >= 2.0**32:
                    level[sid] -= 2.0**32  # a 32-bit wrap
                value = level[sid]
            else:
                value = float(np.round(rng.normal(60, 5))) if rng.random() > 0.02 else np.nan
            jitter = int(rng.integers(-300, 300))
            ids.append(sid)
            ts.append(sec * 1000 + 500 + jitter)
            vs.append(value)
            if rng.random() < 0.02:  # a second sample in the same cell
                ids.append(sid)
                ts.append(sec * 1000 + 900)
                vs.append(value + (1.0 if sid in level and sid % 3 else 0.5 * (sid not in level)))
                if sid in level and sid % 3:
                    level[sid] += 1.0
        arrival = sec + (2 if rng.random() < 0.03 else 0)  # some scrapes arrive late
        out.append((arrival, np.array(ids), np.array(ts), np.array(vs, dtype=float)))
    out.sort(key=lambda b: b[0])
    return out


def assert_frames_equal(got: Frame, want: Frame) -> None:
    assert (got.start_ms, got.steps, got.late) == (want.start_ms, want.steps, want.late)
    for a, b in ((got.gpus, want.gpus), (got.workloads, want.workloads),
                 (got.targets, want.targets)):  # fmt: skip
        assert (a.keys, a.labels, a.index) == (b.keys, b.labels, b.index)
    for a, b in ((got.gpu, want.gpu), (got.wl, want.wl), (got.tgt, want.tgt)):
        assert list(a) == list(b) or sorted(a) == sorted(b)
        for name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(got.stacks, want.stacks)
    assert got.resets == want.resets and list(got.resets) == list(want.resets)
    assert got.link_errors == want.link_errors
    assert [(k, list(v.items())) for k, v in got.link_errors.items()] == [
        (k, list(v.items())) for k, v in want.link_errors.items()
    ]
    assert {k: got.series[k] for k in got.series} == {k: want.series[k] for k in want.series}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_builder_lays_every_frame_as_the_reference_did(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = random_keys(rng)
    fast, ref = FrameBuilder(keys.get), ReferenceBuilder(keys.get)
    blocks = random_blocks(rng, keys, 240)
    held = [SampleBlock.empty(), SampleBlock.empty()]
    frame_end, settle, k = 0, 2000, 0
    for now in range(20, 260, int(rng.integers(5, 60))):  # cycles of uneven length
        new = []
        while k < len(blocks) and blocks[k][0] <= now:
            _, ids, ts, vs = blocks[k]
            new.append(SampleBlock(ids, ts, vs))
            k += 1
        end = (now * 1000 - settle) // 1000 * 1000
        for j, builder in enumerate((fast, ref)):
            block = SampleBlock.concat([held[j], *new])
            later = block.timestamps_ms >= end
            held[j] = SampleBlock(block.series_ids[later], block.timestamps_ms[later],
                                  block.values[later])  # fmt: skip
            frame = builder.build(block, frame_end, end, 1000)
            if j == 0:
                got = frame
        assert_frames_equal(got, frame)
        np.testing.assert_array_equal(fast._last, ref._last)
        np.testing.assert_array_equal(fast._last_ms, ref._last_ms)
        frame_end = end


def test_counter_deltas_equals_the_reference_on_drops_wraps_and_gaps() -> None:
    rng = np.random.default_rng(5)
    prev = rng.choice([0.0, 10.0, 2.0**31, 2.0**32 - 7, 2.0**63 + 5, 2.0**64 - 4096, np.nan],
                      size=5000)  # fmt: skip
    values = np.where(rng.random(5000) < 0.5, prev + rng.integers(0, 9, 5000),
                      rng.choice([0.0, 3.0, 1e6, np.nan], size=5000))  # fmt: skip
    delta, reset = counter_deltas(prev, values)
    want_delta, want_reset = reference_counter_deltas(prev, values)
    np.testing.assert_array_equal(delta, want_delta)
    np.testing.assert_array_equal(reset, want_reset)
