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
    reset = np.zeros(values.shape, bool)
    at = np.flatnonzero(drop)  # drops are rare: the wrap arithmetic runs on them alone
    if len(at):
        p, v = prev[at], values[at]
        wrapped = np.full(len(at), np.nan)
        for span in WRAPS:
            fits = np.isnan(wrapped) & (p >= span / 2) & (p < span)
            wrapped = np.where(fits, span - p + v, wrapped)
        is_wrap = ~np.isnan(wrapped) & (wrapped < 2.0**30)
        reset[at] = ~is_wrap
        delta[at] = np.where(is_wrap, wrapped, np.where(reset[at], v, delta[at]))
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
        self._pair: list[int] = []  # fabric series: index into _pairs, else -1
        self._pairs: list[tuple[int, str]] = []  # (GPU entity, link) of fabric series
        self._pair_of: dict[tuple[int, str], int] = {}
        self._entities = [Entities(), Entities(), Entities()]
        self._cols: dict[str, np.ndarray] = {}
        self._plan: _Plan | None = None  # where the last frame's series went
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
        pair = -1
        if r is not None and r.table == "gpu" and r.signal == "fabric_errors":
            pair = self._pair_of.setdefault((self._entity[-1], self._link[-1]), len(self._pairs))
            if pair == len(self._pairs):
                self._pairs.append((self._entity[-1], self._link[-1]))
        self._pair.append(pair)
        return slot

    def _grow(self) -> None:
        n = len(self._table)
        for name in ("_table", "_signal", "_entity", "_stack", "_how"):
            self._cols[name] = np.asarray(getattr(self, name), dtype=np.int64)
        self._cols["link_pair"] = np.asarray(self._pair, dtype=np.int64)
        table, how = self._cols["_table"], self._cols["_how"]
        self._cols["fabric"] = (table == 0) & (
            self._cols["_signal"] == SIGNAL_CODE["fabric_errors"]
        )
        self._cols["kind"] = np.where(table < 0, -1, how).astype(np.int8)
        self._cols["counter_id"] = np.cumsum(self._cols["kind"] > 0) - 1
        # One small code per (table, signal): a signal's block in the frame's grid.
        self._cols["group"] = np.maximum(table, 0) * len(SIGNALS) + self._cols["_signal"]
        self._cols["reduce"] = _REDUCE_OF_SIGNAL[self._cols["_signal"]].astype(np.int8)
        self._cols["counter_slot"] = np.flatnonzero(self._cols["kind"] > 0)
        self._plan = None
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
        gauges = self._gauges(frame, slot, kind, ts, vals)
        counters = self._counters(frame, slot, kind, ts, vals)
        self._scatter(frame, gauges, counters)
        return frame

    def _gauges(
        self, frame: Frame, slot: np.ndarray, kind: np.ndarray, ts: np.ndarray, vals: np.ndarray
    ) -> _Samples:
        """Gauge samples inside the frame, in time order (the order cells reduce in)."""
        pick = np.flatnonzero((kind == 0) & (ts >= frame.start_ms) & (ts < frame.end_ms))
        value = vals[pick].astype(float, copy=False)
        known = ~np.isnan(value)
        if not known.all():
            pick, value = pick[known], value[known]
        return _Samples(slot[pick], (ts[pick] - frame.start_ms) // frame.step_ms, value)

    def _counters(
        self, frame: Frame, slot: np.ndarray, kind: np.ndarray, ts: np.ndarray, vals: np.ndarray
    ) -> _Samples:
        """Counter samples as increments inside the frame.

        Each counter sample is differenced once: samples of later frames wait (the runner
        hands them back), ones already used are not used again.  A series whose every
        sample equals the last value it had adds nothing but exact zeros, so only the
        others (on a fleet, a few of them: most error counters stand still) are grouped
        by series and differenced; a cell's sum is the same with its zeros anywhere.
        """
        counter = np.flatnonzero(kind > 0)
        cslot, ct = slot[counter], ts[counter]
        keep = (ct < frame.end_ms) & (ct > self._last_ms[cslot])
        if not keep.all():
            counter, cslot, ct = counter[keep], cslot[keep], ct[keep]
        cv = vals[counter].astype(float, copy=False)
        moved = np.zeros(len(self._table), bool)
        moved[cslot[cv != self._last[cslot]]] = True  # NaN equals nothing: it moves
        still = ~moved[cslot]
        self._last_ms[cslot] = ct  # in time order: each series' last stays
        busy = self._differenced(frame, *(a[~still] for a in (cslot, ct, cv)))
        pick = np.flatnonzero((busy.col >= frame.start_ms) & ~np.isnan(busy.value))
        quiet = np.flatnonzero(still & (ct >= frame.start_ms))
        return _Samples(
            np.concatenate([busy.slot[pick], cslot[quiet]]),
            (np.concatenate([busy.col[pick], ct[quiet]]) - frame.start_ms) // frame.step_ms,
            np.concatenate([busy.value[pick], np.zeros(len(quiet))]),
        )

    def _differenced(
        self, frame: Frame, cslot: np.ndarray, ct: np.ndarray, cv: np.ndarray
    ) -> _Samples:
        """Samples (in time order) grouped by series, then time, with their times in place
        of steps and their increments in place of values.  Counters are numbered densely,
        so grouping is one 16-bit radix pass, and the grouped series numbers are each
        number repeated as often as it occurs (no gather needed)."""
        if len(cslot) == 0:
            return _Samples(cslot, ct, cv)
        cid = self._cols["counter_id"][cslot]
        order = _stable_order(cid)
        seen = np.bincount(cid)
        cslot = self._cols["counter_slot"][np.repeat(np.arange(len(seen)), seen)]
        ct, cv = np.take(ct, order), np.take(cv, order)
        return _Samples(cslot, ct, self._increments(frame, cslot, ct, cv))

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
        self._link_errors(frame, slot, t, delta)
        frac = np.flatnonzero(self._cols["kind"][slot] == 2)
        if len(frac):  # seconds of throttling per step -> fraction of the step
            dt = np.where(first[frac], frame.step_ms, t[frac] - t[frac - 1]) / 1000.0
            delta[frac] = np.clip(delta[frac] / np.fmax(dt, 1e-3), 0.0, 1.0)
        return delta

    def _link_errors(
        self, frame: Frame, slot: np.ndarray, t: np.ndarray, delta: np.ndarray
    ) -> None:
        """Fabric errors in the frame per GPU and link, summed in sample order (as a loop
        over the samples would, which ``bincount`` does), keyed in order of appearance."""
        up = np.flatnonzero(delta > 0)  # NaN compares false: skipped
        up = up[self._cols["fabric"][slot[up]] & (t[up] >= frame.start_ms)]
        if len(up) == 0:
            return
        pairs, first, which = np.unique(
            self._cols["link_pair"][slot[up]], return_index=True, return_inverse=True
        )
        totals = np.bincount(which, weights=delta[up])
        gpus = self._entities[TABLES.index("gpu")]
        for j in np.argsort(first).tolist():
            entity, link = self._pairs[int(pairs[j])]
            frame.link_errors.setdefault(gpus.keys[entity], {})[link] = float(totals[j])

    def _scatter(self, frame: Frame, gauges: _Samples, counters: _Samples) -> None:
        """Lay the samples on the grid: one scatter per reduction, no sort by signal.

        Where each series goes (its entity's row, its signal's block) depends only on which
        series the frame has, so the plan is kept while the same series report.
        """
        n = len(self._table)
        present = np.flatnonzero(
            np.bincount(gauges.slot, minlength=n) + np.bincount(counters.slot, minlength=n)
        )
        plan = self._plan
        if plan is None or not np.array_equal(plan.present, present):
            plan = self._plan = self._make_plan(present)
        plan.name(frame)
        grid = _Grid(plan, frame.steps)
        grid.lay(gauges, LAST)
        grid.lay(counters, SUM)
        grid.fill(frame)

    def _make_plan(self, present: np.ndarray) -> _Plan:
        """Rows are the frame's entities in the order the builder first met them, so a GPU
        keeps its row from frame to frame while the fleet does not change."""
        rows = np.zeros(len(self._table), np.int64)  # each slot's row in this frame
        entities, series = [], {}
        for table in range(len(TABLES)):
            mine = present[self._cols["_table"][present] == table]
            seen = np.unique(self._cols["_entity"][mine])
            known = self._entities[table]
            keys = [known.keys[e] for e in seen.tolist()]
            labels = [known.labels[e] for e in seen.tolist()]  # shared: detectors only read
            entities.append((keys, labels, {k: i for i, k in enumerate(keys)}))
            rows[mine] = np.searchsorted(seen, self._cols["_entity"][mine])
            series[TABLES[table]] = self._series_matrix(len(keys), mine, rows[mine])
        return _Plan(self._cols, present, rows, entities, series)

    def _series_matrix(self, n: int, slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The first series behind each (entity, signal), for evidence, as a matrix."""
        none = np.iinfo(np.int64).max
        matrix = np.full((n, len(SIGNALS)), none, np.int64)
        np.minimum.at(matrix, (rows, self._cols["_signal"][slots]), slots)
        matrix[matrix == none] = -1
        return matrix


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """A stable argsort of small non-negative ints, as radix sorts on 16-bit digits."""
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    high = keys >> 16
    if len(high) and high.max() > 0:
        order = order[np.argsort(high[order].astype(np.uint16), kind="stable")]
    return order


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

#: How samples falling in one cell combine: the last, the mean, the largest, the sum.
LAST, MEAN, MAX, SUM = range(4)
_REDUCE_OF_SIGNAL = np.array(
    [{"last": LAST, "mean": MEAN, "max": MAX, "sum": SUM}[_HOW.get(s, "last")] for s in SIGNALS]
)


class _Samples(NamedTuple):
    """Samples to lay on the grid, in the order each cell reduces them."""

    slot: np.ndarray
    col: np.ndarray  # step
    value: np.ndarray


class _Plan:
    """Where a frame's series go: entity rows, and each (table, signal) a block of rows.

    Every (table, signal) the frame carries gets a block of rows (one per entity; the
    stacks one per GPU and stack) in the array of its reduction, and every series a row in
    it (``dest``).  Gauges are mostly laid by their last value and counters by their sum:
    ``main_row`` is the series' row for those and a scratch row for the others (``minor``:
    means, maxima), which are laid on their own.
    """

    def __init__(self, cols: Mapping[str, np.ndarray], present: np.ndarray, rows: np.ndarray,
                 entities: list[tuple[list[str], list[dict[str, str]], dict[str, int]]],
                 series: dict[str, np.ndarray]) -> None:  # fmt: skip
        self.present, self.entities, self.series = present, entities, series
        self.blocks: dict[int, tuple[int, int, int]] = {}  # code -> reduction, first row, rows
        self.used = [0, 0, 0, 0]
        for code in np.unique(cols["group"][present]).tolist():
            table, signal = divmod(code, len(SIGNALS))
            how = int(_REDUCE_OF_SIGNAL[signal])
            size = len(entities[table][0]) * (MAX_STACKS if signal == _STACK else 1)
            self.blocks[code] = (how, self.used[how], size)
            self.used[how] += size
        first = np.zeros(len(SIGNALS) * len(TABLES), np.int64)
        for code, (_, start, _) in self.blocks.items():
            first[code] = start
        group, stack = cols["group"][present], cols["_stack"][present]
        at = np.where(stack >= 0, rows[present] * MAX_STACKS + stack, rows[present])
        self.dest = np.zeros(len(rows), np.int64)  # row in its reduction's array
        self.dest[present] = first[group] + at
        self.how = cols["reduce"]
        main = np.where(cols["kind"] > 0, SUM, LAST)
        self.minor = self.how != main
        self.main_row = np.where(self.minor, np.asarray(self.used)[main], self.dest)

    def name(self, frame: Frame) -> None:
        """The frame's entities (fresh lists) and its series index."""
        for ents, (keys, labels, index) in zip(
            (frame.gpus, frame.workloads, frame.targets), self.entities, strict=True
        ):
            ents.keys, ents.labels, ents.index = list(keys), list(labels), dict(index)
        assert isinstance(frame.series, SeriesIndex)
        frame.series._slots.update(self.series)


class _Grid:
    """One frame's arrays, one per reduction, laid out as the plan says.

    Laying all samples down is one scatter for the last value, one ``bincount`` for sums
    and means and one ``maximum.at``: no sort of the samples by signal, and each cell sees
    its samples in the order they come, as the cell-by-cell reductions did.
    """

    def __init__(self, plan: _Plan, steps: int) -> None:
        self.plan, self.steps, used = plan, steps, plan.used
        # One scratch row past the blocks of each reduction that samples may skip into.
        self.last = np.full((used[LAST] + 1) * steps, np.nan)
        self.sums = [np.zeros((used[h] + 1) * steps) for h in (MEAN, SUM)]
        self.counts = [np.zeros((used[h] + 1) * steps, np.int64) for h in (MEAN, SUM)]
        self.high = np.full((used[MAX] + 1) * steps, -np.inf)

    def lay(self, s: _Samples, main: int) -> None:
        """Lay samples whose reduction is mostly ``main`` (LAST for gauges, SUM for counters):
        all in one pass, the others' landing in a scratch row; then the others by theirs."""
        if len(s.slot) == 0:
            return
        plan = self.plan
        minor = np.flatnonzero(plan.minor[s.slot])
        if len(minor):
            slot = s.slot[minor]
            how, flat = plan.how[slot], plan.dest[slot] * self.steps + s.col[minor]
            for other in np.unique(how).tolist():
                at = np.flatnonzero(how == other)
                self._reduce(other, flat[at], s.value[minor[at]])
        self._reduce(main, plan.main_row[s.slot] * self.steps + s.col, s.value)

    def _reduce(self, how: int, flat: np.ndarray, value: np.ndarray) -> None:
        if how == LAST:
            self.last[flat] = value  # in order: the last sample of a cell stays
        elif how == MAX:
            np.maximum.at(self.high, flat, value)
        else:
            k = 0 if how == MEAN else 1
            size = len(self.sums[k])
            self.sums[k] += np.bincount(flat, weights=value, minlength=size)
            self.counts[k] += np.bincount(flat, minlength=size)

    def fill(self, frame: Frame) -> None:
        """Each signal's block as the frame's (entities, steps) array; stacks (G, 8, T)."""
        with np.errstate(invalid="ignore"):
            mean = self.sums[0] / self.counts[0]
        total = np.where(self.counts[1] > 0, self.sums[1], np.nan)
        self.high[np.isinf(self.high)] = np.nan
        arrays = (self.last, mean, self.high, total)
        out = (frame.gpu, frame.wl, frame.tgt)
        frame.stacks = np.full((len(frame.gpus), MAX_STACKS, self.steps), np.nan)
        for code, (how, start, size) in self.plan.blocks.items():
            table, signal = divmod(code, len(SIGNALS))
            block = arrays[how][start * self.steps : (start + size) * self.steps]
            if signal == _STACK:
                frame.stacks = block.reshape(-1, MAX_STACKS, self.steps)
            else:
                out[table][SIGNALS[signal]] = block.reshape(size, self.steps)


_STACK = SIGNAL_CODE["stack"]
