"""Building frames: series routed to rows once, counters differenced once, cells reduced.

Why apart from the frame (``detectors/frame.py``): the builder keeps state between frames
(each series' slot and route, each counter's last value) and does the arithmetic that
makes building a minute of a 1,024-GPU fleet cheap; detectors only read the frame.  How
samples are laid on the grid is in ``detectors/frame_grid.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hbmwatch.detectors.frame import TABLE_LABELS, TABLES, Entities, Frame, RawSeries, SeriesIndex
from hbmwatch.detectors.frame_grid import LAST, REDUCE_OF_SIGNAL, SUM, Grid, Plan, Samples
from hbmwatch.detectors.signals import (
    MAX_STACKS,
    RAW_METRICS,
    SIGNAL_CODE,
    SIGNALS,
    error_code,
    route,
)
from hbmwatch.records import SeriesKey
from hbmwatch.store.feed import SampleBlock

WRAPS = (2.0**32, 2.0**64)


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
        self._code: list[str] = []  # error event series: its code (``xid:79``), else ""
        self._entities = [Entities(), Entities(), Entities()]
        self._raw: list[bool] = []  # a series read sample by sample (signals.RAW_METRICS)
        self._raw_labels: dict[int, dict[str, str]] = {}  # slot -> labels, raw series only
        self._any_raw = False  # none seen yet: the raw pass costs nothing
        self._cols: dict[str, np.ndarray] = {}
        self._plan: Plan | None = None  # where the last frame's series went
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
        raw = key is not None and key.metric in RAW_METRICS
        self._raw.append(raw)
        if raw and key is not None:
            self._raw_labels[slot] = key.label_dict
        self._any_raw |= raw
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
        code = error_code(key) if r is not None and key is not None else None
        self._code.append(code or "")
        return slot

    def _grow(self) -> None:
        n = len(self._table)
        for name in ("_table", "_signal", "_entity", "_stack", "_how"):
            self._cols[name] = np.asarray(getattr(self, name), dtype=np.int64)
        self._cols["link_pair"] = np.asarray(self._pair, dtype=np.int64)
        self._cols["error"] = np.asarray([bool(c) for c in self._code], dtype=bool)
        self._cols["raw"] = np.asarray(self._raw, dtype=bool)
        table, how = self._cols["_table"], self._cols["_how"]
        self._cols["fabric"] = (table == 0) & (
            self._cols["_signal"] == SIGNAL_CODE["fabric_errors"]
        )
        self._cols["kind"] = np.where(table < 0, -1, how).astype(np.int8)
        self._cols["counter_id"] = np.cumsum(self._cols["kind"] > 0) - 1
        # One small code per (table, signal): a signal's block in the frame's grid.
        self._cols["group"] = np.maximum(table, 0) * len(SIGNALS) + self._cols["_signal"]
        self._cols["reduce"] = REDUCE_OF_SIGNAL[self._cols["_signal"]].astype(np.int8)
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
        if self._any_raw:
            frame.raw = self._raw_series(frame, slot, ts, vals)
        return frame

    def _raw_series(
        self, frame: Frame, slot: np.ndarray, ts: np.ndarray, vals: np.ndarray
    ) -> list[RawSeries]:
        """Each raw series' finite samples inside the frame, in time order, as they came."""
        pick = np.flatnonzero(self._cols["raw"][slot] & (ts >= frame.start_ms)
                              & (ts < frame.end_ms) & np.isfinite(vals))  # fmt: skip
        if len(pick) == 0:
            return []
        order = pick[np.argsort(slot[pick], kind="stable")]  # grouped, time order kept
        groups, first = np.unique(slot[order], return_index=True)
        return [
            RawSeries(self._text[s], dict(self._raw_labels[s]), ts[part].astype(np.int64),
                      vals[part].astype(float))
            for s, part in zip(groups.tolist(), np.split(order, first[1:]), strict=True)
        ]  # fmt: skip

    def _gauges(
        self, frame: Frame, slot: np.ndarray, kind: np.ndarray, ts: np.ndarray, vals: np.ndarray
    ) -> Samples:
        """Gauge samples inside the frame, in time order (the order cells reduce in)."""
        pick = np.flatnonzero((kind == 0) & (ts >= frame.start_ms) & (ts < frame.end_ms))
        value = vals[pick].astype(float, copy=False)
        known = ~np.isnan(value)
        if not known.all():
            pick, value = pick[known], value[known]
        return Samples(slot[pick], (ts[pick] - frame.start_ms) // frame.step_ms, value)

    def _counters(
        self, frame: Frame, slot: np.ndarray, kind: np.ndarray, ts: np.ndarray, vals: np.ndarray
    ) -> Samples:
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
        return Samples(
            np.concatenate([busy.slot[pick], cslot[quiet]]),
            (np.concatenate([busy.col[pick], ct[quiet]]) - frame.start_ms) // frame.step_ms,
            np.concatenate([busy.value[pick], np.zeros(len(quiet))]),
        )

    def _differenced(
        self, frame: Frame, cslot: np.ndarray, ct: np.ndarray, cv: np.ndarray
    ) -> Samples:
        """Samples (in time order) grouped by series, then time, with their times in place
        of steps and their increments in place of values.  Counters are numbered densely,
        so grouping is one 16-bit radix pass, and the grouped series numbers are each
        number repeated as often as it occurs (no gather needed)."""
        if len(cslot) == 0:
            return Samples(cslot, ct, cv)
        cid = self._cols["counter_id"][cslot]
        order = _stable_order(cid)
        seen = np.bincount(cid)
        cslot = self._cols["counter_slot"][np.repeat(np.arange(len(seen)), seen)]
        ct, cv = np.take(ct, order), np.take(cv, order)
        return Samples(cslot, ct, self._increments(frame, cslot, ct, cv))

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
        self._error_codes(frame, slot, t, delta)
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

    def _error_codes(
        self, frame: Frame, slot: np.ndarray, t: np.ndarray, delta: np.ndarray
    ) -> None:
        """GPU error events in the frame per GPU and code: what the detector names."""
        up = np.flatnonzero(delta > 0)
        up = up[self._cols["error"][slot[up]] & (t[up] >= frame.start_ms)]
        gpus = self._entities[TABLES.index("gpu")]
        for s, n in zip(slot[up].tolist(), delta[up].tolist(), strict=True):  # rare events
            codes = frame.gpu_errors.setdefault(gpus.keys[self._entity[s]], {})
            codes[self._code[s]] = codes.get(self._code[s], 0.0) + n

    def _scatter(self, frame: Frame, gauges: Samples, counters: Samples) -> None:
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
        grid = Grid(plan, frame.steps)
        grid.lay(gauges, LAST)
        grid.lay(counters, SUM)
        grid.fill(frame)

    def _make_plan(self, present: np.ndarray) -> Plan:
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
        return Plan(self._cols, present, rows, entities, series)

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
