"""Laying a frame's samples on its grid: one block of rows per signal, one scatter per reduction.

Why apart from the builder (``detectors/frame_builder.py``): where each series lands
depends only on which series a frame has (the ``Plan``, kept while they stay the same),
and the reductions (last, mean, max, sum) are array arithmetic with no builder state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from hbmwatch.detectors.frame import TABLES, Frame, SeriesIndex
from hbmwatch.detectors.signals import MAX_STACKS, SIGNAL_CODE, SIGNAL_REDUCTION, SIGNALS

#: How samples falling in one cell combine: the last, the mean, the largest, the sum.
LAST, MEAN, MAX, SUM = range(4)
REDUCE_OF_SIGNAL = np.array(
    [
        {"last": LAST, "mean": MEAN, "max": MAX, "sum": SUM}[SIGNAL_REDUCTION.get(s, "last")]
        for s in SIGNALS
    ]
)


class Samples(NamedTuple):
    """Samples to lay on the grid, in the order each cell reduces them."""

    slot: np.ndarray
    col: np.ndarray  # step
    value: np.ndarray


class Plan:
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
            how = int(REDUCE_OF_SIGNAL[signal])
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


class Grid:
    """One frame's arrays, one per reduction, laid out as the plan says.

    Laying all samples down is one scatter for the last value, one ``bincount`` for sums
    and means and one ``maximum.at``: no sort of the samples by signal, and each cell sees
    its samples in the order they come, as the cell-by-cell reductions did.
    """

    def __init__(self, plan: Plan, steps: int) -> None:
        self.plan, self.steps, used = plan, steps, plan.used
        # One scratch row past the blocks of each reduction that samples may skip into.
        self.last = np.full((used[LAST] + 1) * steps, np.nan)
        self.sums = [np.zeros((used[h] + 1) * steps) for h in (MEAN, SUM)]
        self.counts = [np.zeros((used[h] + 1) * steps, np.int64) for h in (MEAN, SUM)]
        self.high = np.full((used[MAX] + 1) * steps, -np.inf)

    def lay(self, s: Samples, main: int) -> None:
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
