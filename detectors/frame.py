"""A frame: new samples laid out on a time grid, one row per GPU, workload and target.

Detectors never see series ids or label sets: ``FrameBuilder`` routes each canonical series
to an entity row and a signal once (cached by series id), turns counters into increments
per step (across resets and 32/64-bit wraps, remembering each counter's last value between
frames), and scatters everything onto a grid of ``step_ms``.  A missing value is NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from hbmwatch.metrics import THERMAL_THROTTLE_REASONS
from hbmwatch.records import Finding, SeriesKey
from store.feed import SampleBlock

POWER_THROTTLE_REASONS = ("power", "power_brake", "board_limit")
MAX_STACKS = 8
WRAPS = (2.0**32, 2.0**64)

GPU_LABELS = ("cluster", "rack", "host", "gpu", "sku", "vendor")
WORKLOAD_LABELS = ("cluster", "rack", "host", "gpu", "partition", "service", "model", "phase")
TARGET_LABELS = ("cluster", "rack", "host", "target", "source")
TABLES = ("gpu", "wl", "tgt")
TABLE_LABELS = (GPU_LABELS, WORKLOAD_LABELS, TARGET_LABELS)


class Route(NamedTuple):
    table: str  # gpu | wl | tgt
    key: str
    signal: str
    how: str  # last | mean | max | sum | frac
    slot: int = -1  # stack index for "stack"


@dataclass
class Entities:
    keys: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, labels: Mapping[str, str]) -> int:
        row = self.index.get(key)
        if row is None:
            row = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.labels.append(dict(labels))
        return row

    def __len__(self) -> int:
        return len(self.keys)


class SeriesIndex(MutableMapping[tuple[str, str, str], str]):
    """``(table, key, signal) -> series text``, looked up when asked.

    A frame has ~70k of them and evidence needs a handful, so the builder hands over each
    table's (row, signal) -> slot matrix instead of building a dict of strings every cycle.
    Entries set by hand (tests, other builders) sit in front of it.
    """

    def __init__(self, entities: Mapping[str, Entities], slots: Mapping[str, np.ndarray],
                 texts: list[str]) -> None:  # fmt: skip
        self._entities, self._slots, self._texts = entities, slots, texts
        self._extra: dict[tuple[str, str, str], str] = {}

    def __getitem__(self, key: tuple[str, str, str]) -> str:
        if key in self._extra:
            return self._extra[key]
        table, entity, signal = key
        ents, slots = self._entities.get(table), self._slots.get(table)
        row = ents.index.get(entity) if ents is not None else None
        code = SIGNAL_CODE.get(signal)
        if row is None or code is None or slots is None or slots[row, code] < 0:
            raise KeyError(key)
        return self._texts[int(slots[row, code])]

    def __setitem__(self, key: tuple[str, str, str], value: str) -> None:
        self._extra[key] = value

    def __delitem__(self, key: tuple[str, str, str]) -> None:
        del self._extra[key]

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        yield from self._extra
        for table, slots in self._slots.items():
            keys = self._entities[table].keys
            for row, code in zip(*np.nonzero(slots >= 0), strict=True):
                key = (table, keys[row], SIGNALS[code])
                if key not in self._extra:
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class Frame:
    """Signals on a grid: ``times_ms[i]`` is the start of step i, ``[t, t + step)``."""

    start_ms: int
    step_ms: int
    steps: int
    gpus: Entities
    workloads: Entities
    targets: Entities
    gpu: dict[str, np.ndarray]  # (G, T)
    stacks: np.ndarray  # (G, MAX_STACKS, T)
    wl: dict[str, np.ndarray]  # (W, T)
    tgt: dict[str, np.ndarray]  # (N, T)
    series: MutableMapping[tuple[str, str, str], str]  # (table, key, signal) -> series text
    resets: dict[str, int]  # GPU key -> counter resets seen in this frame
    link_errors: dict[str, dict[str, float]]  # GPU key -> link -> errors in this frame
    late: int = 0
    #: What earlier detectors computed for later ones (per GPU, (G, T)), this cycle only.
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    #: Findings open after the detectors that ran before, for correlation.
    open_findings: list[Finding] = field(default_factory=list)
    context: Any = None  # detectors.context.Context, set by the runner
    #: Each detector's score per entity and step (1.0 = at its threshold), for score-file.
    scores: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def times_ms(self) -> np.ndarray:
        return self.start_ms + self.step_ms * np.arange(self.steps, dtype=np.int64)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.step_ms * self.steps

    def g(self, name: str) -> np.ndarray:
        """A GPU signal, all NaN if no GPU reported it in this frame."""
        return self.gpu.get(name, np.full((len(self.gpus), self.steps), np.nan))

    def w(self, name: str) -> np.ndarray:
        return self.wl.get(name, np.full((len(self.workloads), self.steps), np.nan))

    def t(self, name: str) -> np.ndarray:
        return self.tgt.get(name, np.full((len(self.targets), self.steps), np.nan))

    def series_of(self, table: str, key: str, signal: str) -> str:
        """The text of the series behind a signal (rebuilt if this frame did not see it)."""
        found = self.series.get((table, key, signal))
        if found is not None:
            return found
        metric = SIGNAL_METRIC.get(signal, signal)
        if table == "gpu" and key.count("/") == 2:
            cluster, host, gpu = key.split("/")
            return f'{metric}{{cluster="{cluster}",host="{host}",gpu="{gpu}"}}'
        return f"{metric}{{{key}}}"


def gpu_key(labels: Mapping[str, str]) -> str:
    return f"{labels.get('cluster', '')}/{labels.get('host', '')}/{labels.get('gpu', '')}"


def route(key: SeriesKey) -> Route | None:
    """Where a canonical series goes in a frame, or None if no detector reads it."""
    m, label = key.metric, key.label
    if m.startswith("gpu_"):
        return _device_route(key, gpu_key(dict(key.labels)))
    if m.startswith("workload_"):
        wkey = f"{label('service')}/{label('phase')}"
        q = label("quantile")
        if m == "workload_latency_seconds" and q in _QUANTILE_SIGNAL:
            return Route("wl", wkey, _QUANTILE_SIGNAL[q], "last")
        if m == "workload_latency_resolution_seconds" and q in _QUANTILE_SIGNAL:
            return Route("wl", wkey, "res" + _QUANTILE_SIGNAL[q][1:], "last")
        if m == "workload_window_requests":
            return Route("wl", wkey, "window_requests", "last")
        if m == "workload_requests_total":
            return Route("wl", wkey, "requests", "sum")
        return None
    target = label("target")
    if m == "hbmwatch_target_up" and target:
        return Route("tgt", target, "up", "last")
    if m == "hbmwatch_scrape_dropped_total" and target and label("reason") == "sentinel":
        return Route("tgt", target, "sentinel", "sum")
    return None


_QUANTILE_SIGNAL = {"0.5": "p50", "0.95": "p95", "0.99": "p99"}
_GAUGES = {
    "gpu_memory_temperature_celsius": ("mem_temp", "last"),
    "gpu_hotspot_temperature_celsius": ("hot_temp", "last"),
    "gpu_power_watts": ("power", "last"),
    "gpu_power_limit_watts": ("power_limit", "last"),
    "gpu_memory_bandwidth_utilization_ratio": ("bw", "mean"),
    "gpu_utilization_ratio": ("util", "mean"),
}
_COUNTERS = {
    "gpu_pcie_replays_total": "pcie_replays",
    "gpu_pcie_recoveries_total": "pcie_recoveries",
    "gpu_fabric_errors_total": "fabric_errors",
}


#: The canonical metric behind each GPU signal, for evidence when no series text is at hand.
SIGNAL_METRIC: dict[str, str] = {
    **{signal: metric for metric, (signal, _) in _GAUGES.items()},
    **{signal: metric for metric, signal in _COUNTERS.items()},
    "clock": "gpu_clock_hertz",
    "mem_clock": "gpu_clock_hertz",
    "thr_hbm": "gpu_throttle_seconds_total",
    "thr_thermal": "gpu_throttle_seconds_total",
    "thr_power": "gpu_throttle_seconds_total",
}


def _device_route(key: SeriesKey, gkey: str) -> Route | None:
    m, label = key.metric, key.label
    if m in _GAUGES:
        signal, how = _GAUGES[m]
        if how == "last" and label("partition") not in (None, "", "0"):
            return None  # physical sensors live on partition 0 only
        return Route("gpu", gkey, signal, how)
    if m == "gpu_hbm_stack_temperature_celsius":
        stack = label("stack") or ""
        if stack.isdigit() and int(stack) < MAX_STACKS:
            return Route("gpu", gkey, "stack", "last", int(stack))
        return None
    if m == "gpu_clock_hertz":
        domain = label("domain")
        if domain in ("compute", "memory"):
            return Route("gpu", gkey, "clock" if domain == "compute" else "mem_clock", "last")
        return None
    if m in ("gpu_throttle_active", "gpu_throttle_seconds_total"):
        reason = label("reason") or ""
        how = "max" if m == "gpu_throttle_active" else "frac"
        if reason == "hbm_thermal":
            return Route("gpu", gkey, "thr_hbm", how)
        if reason in THERMAL_THROTTLE_REASONS:
            return Route("gpu", gkey, "thr_thermal", how)
        if reason in POWER_THROTTLE_REASONS:
            return Route("gpu", gkey, "thr_power", how)
        return None
    if m in _COUNTERS:
        return Route("gpu", gkey, _COUNTERS[m], "sum")
    if m == "gpu_ecc_errors_total" and label("severity") == "uncorrectable":
        return Route("gpu", gkey, "ecc_uncorrectable", "sum")
    return None


def counter_deltas(prev: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Increase from ``prev`` to ``values`` elementwise, and where a reset happened.

    A drop from the top half of a 32- or 64-bit range is a wrap; any other drop is a reset
    and the new value is the increase (as Prometheus' ``rate`` counts it).

    >>> d, r = counter_deltas(np.array([4294967000.0, 500.0, np.nan]), np.array([100.0, 20.0, 7.0]))
    >>> d.tolist(), r.tolist()
    ([396.0, 20.0, nan], [False, True, False])
    """
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


class FrameBuilder:
    """Routes series to rows and keeps each counter's last value between frames.

    Everything a series needs (table, signal, entity, counter state) lives in columns
    indexed by a slot the series gets the first time it is seen, so building a frame is a
    handful of array operations over all samples rather than a loop over series (a minute
    of 1,024 GPUs is ~3 million samples of ~69k series; docs/benchmarks.md).  Samples stay
    in time order; only counters are regrouped by series, with a radix sort.
    """

    def __init__(self, key_of: Callable[[int], SeriesKey | None]) -> None:
        self.key_of = key_of
        self._slot_by_sid = np.zeros(0, np.int64)  # -1: not seen yet
        self._table: list[int] = []  # index into TABLES, -1 for series no detector reads
        self._signal: list[int] = []
        self._entity: list[int] = []  # row in self._entities[table]
        self._stack: list[int] = []
        self._how: list[int] = []  # 0 gauge, 1 counter, 2 seconds counter (fraction)
        self._text: list[str] = []
        self._link: list[str] = []
        self._entities = [Entities(), Entities(), Entities()]
        self._cols: dict[str, np.ndarray] = {}
        self._last = np.zeros(0)  # each counter's last value, NaN before the first
        self._last_ms = np.zeros(0, np.int64)  # and its time: samples up to it are used

    def _slots(self, sids: np.ndarray) -> np.ndarray:
        """Each sample's slot, routing series not seen before (in ascending id order)."""
        top = int(sids.max()) + 1
        if top > len(self._slot_by_sid):
            grown = np.full(max(top, 2 * len(self._slot_by_sid)), -1, np.int64)
            grown[: len(self._slot_by_sid)] = self._slot_by_sid
            self._slot_by_sid = grown
        slots = self._slot_by_sid[sids]
        unseen = slots < 0
        if unseen.any():
            for sid in np.unique(sids[unseen]).tolist():
                self._slot_by_sid[sid] = self._add(sid)
            self._grow()
            slots = self._slot_by_sid[sids]
        return slots

    def _add(self, sid: int) -> int:
        key = self.key_of(sid)
        r = route(key) if key is not None else None
        slot = len(self._table)
        table = TABLES.index(r.table) if r is not None else -1
        self._table.append(table)
        self._signal.append(SIGNALS.index(r.signal) if r is not None else 0)
        self._stack.append(r.slot if r is not None else -1)
        self._how.append({"sum": 1, "frac": 2}.get(r.how, 0) if r is not None else 0)
        self._text.append(key.text if key is not None else "")
        self._link.append((key.label("link") or "all") if key is not None else "")
        if r is None or key is None:
            self._entity.append(-1)
        else:
            labels = dict(key.labels)
            keep = TABLE_LABELS[table]
            self._entity.append(
                self._entities[table].add(r.key, {k: labels[k] for k in keep if k in labels})
            )
        return slot

    def _grow(self) -> None:
        n = len(self._table)
        for name in ("_table", "_signal", "_entity", "_stack", "_how"):
            self._cols[name] = np.asarray(getattr(self, name), dtype=np.int64)
        table, how = self._cols["_table"], self._cols["_how"]
        self._cols["fabric"] = (table == 0) & (
            self._cols["_signal"] == SIGNAL_CODE["fabric_errors"]
        )
        self._cols["kind"] = np.where(table < 0, -1, how).astype(np.int8)
        self._cols["counter_id"] = np.cumsum(self._cols["kind"] > 0) - 1
        # One small code per (table, signal): the scatter's radix-sort key.
        self._cols["group"] = (np.maximum(table, 0) * len(SIGNALS) + self._cols["_signal"]
                               ).astype(np.uint8)  # fmt: skip
        grown = n - len(self._last)
        self._last = np.r_[self._last, np.full(grown, np.nan)]
        self._last_ms = np.r_[self._last_ms, np.full(grown, -1, np.int64)]

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
        if len(ts) > 1 and (ts[1:] < ts[:-1]).any():  # storage order is nearly time order
            order = np.argsort(ts, kind="stable")
            ts, sids, vals = ts[order], sids[order], vals[order]
        slot = self._slots(sids)
        kind = self._cols["kind"][slot]  # -1 unread, 0 gauge, 1 counter, 2 seconds counter
        gauge = np.flatnonzero((kind == 0) & (ts >= start_ms) & (ts < end_ms))
        counter = np.flatnonzero(kind > 0)
        # Each counter sample is differenced once: samples of later frames wait (the
        # runner hands them back), ones already used are not used again.
        ct = ts[counter]
        counter = counter[(ct < end_ms) & (ct > self._last_ms[slot[counter]])]
        # By series, then time: counters numbered densely sort in one 16-bit radix pass.
        counter = counter[_stable_order(self._cols["counter_id"][slot[counter]])]
        inc = (
            self._increments(frame, slot[counter], ts[counter], vals[counter])
            if len(counter)
            else np.zeros(0)
        )
        in_frame = ts[counter] >= start_ms
        pick = np.concatenate([gauge, counter[in_frame]])  # gauges stay in time order
        values = np.concatenate([vals[gauge], inc[in_frame]]).astype(float, copy=False)
        known = ~np.isnan(values)
        pick, values = pick[known], values[known]
        self._scatter(frame, slot[pick], (ts[pick] - start_ms) // step_ms, values)
        return frame

    def _increments(
        self, frame: Frame, slot: np.ndarray, t: np.ndarray, v: np.ndarray
    ) -> np.ndarray:
        """Counter samples (grouped by series, in time order) as increments per sample."""
        first = np.empty(len(slot), bool)
        first[0], first[1:] = True, slot[1:] != slot[:-1]
        last = np.empty(len(slot), bool)
        last[-1], last[:-1] = True, first[1:]
        prev = np.empty(len(v))
        prev[1:] = v[:-1]
        prev[first] = self._last[slot[first]]
        delta, reset = counter_deltas(prev, v)
        self._last[slot[last]] = v[last]
        self._last_ms[slot[last]] = t[last]
        gpus = self._entities[TABLES.index("gpu")]
        for s in slot[reset].tolist():  # rare: a handful of series at most
            if self._table[s] == 0:
                key = gpus.keys[self._entity[s]]
                frame.resets[key] = frame.resets.get(key, 0) + 1
        fabric = np.flatnonzero(self._cols["fabric"][slot] & (t >= frame.start_ms))
        for i in fabric[delta[fabric] > 0].tolist():  # NaN compares false: skipped
            errs = frame.link_errors.setdefault(gpus.keys[self._entity[slot[i]]], {})
            link = self._link[slot[i]]
            errs[link] = errs.get(link, 0.0) + float(delta[i])
        frac = np.flatnonzero(self._cols["kind"][slot] == 2)
        if len(frac):  # seconds of throttling per step -> fraction of the step
            dt = np.where(first[frac], frame.step_ms, t[frac] - t[frac - 1]) / 1000.0
            delta[frac] = np.clip(delta[frac] / np.fmax(dt, 1e-3), 0.0, 1.0)
        return delta

    def _scatter(
        self, frame: Frame, slot: np.ndarray, cols: np.ndarray, values: np.ndarray
    ) -> None:
        """Lay samples (in time order) on the grid, one signal at a time.

        Rows are the frame's entities in the order the builder first met them, so a GPU
        keeps its row from frame to frame while the fleet does not change.
        """
        present = np.flatnonzero(np.bincount(slot, minlength=len(self._table)))
        codes = self._cols["group"][slot]
        order = np.argsort(codes, kind="stable")  # by table and signal, still in time order
        slot, cols, values = slot[order], cols[order], values[order]
        bounds = np.r_[0, np.cumsum(np.bincount(codes))]
        rows = np.zeros(len(self._table), np.int64)  # each slot's row in this frame
        tables = (frame.gpus, frame.workloads, frame.targets)
        for table, ents in enumerate(tables):
            mine = present[self._cols["_table"][present] == table]
            rows[mine] = self._frame_rows(table, ents, self._cols["_entity"][mine])
            self._note_series(frame, table, mine, rows[mine])
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
                out[table][signal] = _reduce(_HOW[signal], shape, rows[s], c, v)

    def _frame_rows(self, table: int, ents: Entities, entity: np.ndarray) -> np.ndarray:
        seen = np.unique(entity)
        known = self._entities[table]
        ents.keys = [known.keys[e] for e in seen.tolist()]
        ents.labels = [known.labels[e] for e in seen.tolist()]  # shared: detectors only read
        ents.index = {k: i for i, k in enumerate(ents.keys)}
        return np.searchsorted(seen, entity)

    def _note_series(self, frame: Frame, table: int, slots: np.ndarray, rows: np.ndarray) -> None:
        """The first series behind each (entity, signal), for evidence, as a matrix."""
        n = len((frame.gpus, frame.workloads, frame.targets)[table])
        none = np.iinfo(np.int64).max
        matrix = np.full((n, len(SIGNALS)), none, np.int64)
        np.minimum.at(matrix, (rows, self._cols["_signal"][slots]), slots)
        matrix[matrix == none] = -1
        assert isinstance(frame.series, SeriesIndex)
        frame.series._slots[TABLES[table]] = matrix


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """A stable argsort of small non-negative ints, as radix sorts on 16-bit digits."""
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    high = keys >> 16
    if len(high) and high.max() > 0:
        order = order[np.argsort(high[order].astype(np.uint16), kind="stable")]
    return order


def _reduce(how: str, shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray,
            values: np.ndarray) -> np.ndarray:  # fmt: skip
    """Samples falling in the same cell: the last, the largest, the mean or the sum."""
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


_HOW: dict[str, str] = {
    "mem_temp": "last", "hot_temp": "last", "power": "last", "power_limit": "last",
    "clock": "last", "mem_clock": "last", "bw": "mean", "util": "mean",
    "thr_hbm": "max", "thr_thermal": "max", "thr_power": "max",
    "pcie_replays": "sum", "pcie_recoveries": "sum", "fabric_errors": "sum",
    "ecc_uncorrectable": "sum",
    "p50": "last", "p95": "last", "p99": "last", "res50": "last", "res95": "last",
    "res99": "last", "window_requests": "last", "requests": "sum",
    "up": "last", "sentinel": "sum",
}  # fmt: skip

#: Every metric a frame reads: what the runner asks the store to keep in memory.
WATCHED_METRICS: tuple[str, ...] = (
    *_GAUGES,
    *_COUNTERS,
    "gpu_hbm_stack_temperature_celsius",
    "gpu_clock_hertz",
    "gpu_throttle_active",
    "gpu_throttle_seconds_total",
    "gpu_ecc_errors_total",
    "workload_latency_seconds",
    "workload_latency_resolution_seconds",
    "workload_window_requests",
    "workload_requests_total",
    "hbmwatch_target_up",
    "hbmwatch_scrape_dropped_total",
)

#: Every signal a frame can carry, in a fixed order (the builder's signal codes).
SIGNALS: tuple[str, ...] = (*_HOW, "stack")
SIGNAL_CODE: dict[str, int] = {signal: i for i, signal in enumerate(SIGNALS)}
