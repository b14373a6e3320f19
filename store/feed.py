"""The newest stored samples of the metrics the detectors watch, in the order they were stored.

Reading a minute of 1,024 GPUs back out of SQLite takes seconds (about 1.5 µs a row through
the driver), far over the detectors' budget, so the store keeps what it has just written
for the watched metrics in memory as column arrays, as Prometheus keeps its head block.  A
reader holds a cursor (a running sample count); ``read`` returns everything stored since
it, or ``None`` when the cursor fell out of the buffer (a restart, or a reader that fell
behind), and the store then reads the same span back from SQL.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SampleBlock:
    """Samples as three aligned columns (series id, time in ms, value), in storage order."""

    series_ids: np.ndarray
    timestamps_ms: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.series_ids)

    @classmethod
    def empty(cls) -> SampleBlock:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))

    @classmethod
    def concat(cls, blocks: Sequence[SampleBlock]) -> SampleBlock:
        if not blocks:
            return cls.empty()
        return cls(
            np.concatenate([b.series_ids for b in blocks]),
            np.concatenate([b.timestamps_ms for b in blocks]),
            np.concatenate([b.values for b in blocks]),
        )


class RecentSamples:
    """A bounded, append-only feed of watched samples with sequence-number cursors."""

    def __init__(self, capacity: int, is_watched: Callable[[int], bool]) -> None:
        self.capacity = capacity
        self._is_watched = is_watched
        self._mask = np.zeros(0, dtype=bool)
        self._known = np.zeros(0, dtype=bool)
        self._chunks: deque[tuple[int, SampleBlock]] = deque()
        self._held = 0
        self.next_seq = 0  # samples appended so far: a reader's cursor after reading all

    @property
    def first_seq(self) -> int:
        return self._chunks[0][0] if self._chunks else self.next_seq

    def reset_watch(self) -> None:
        """Forget which series are watched (the watched metrics changed)."""
        self._mask = np.zeros(0, dtype=bool)
        self._known = np.zeros(0, dtype=bool)

    def _watched(self, sids: np.ndarray) -> np.ndarray:
        top = int(sids.max()) + 1
        if top > len(self._mask):
            grow = max(top, 2 * len(self._mask))
            self._mask = np.concatenate([self._mask, np.zeros(grow - len(self._mask), bool)])
            self._known = np.concatenate([self._known, np.zeros(grow - len(self._known), bool)])
        unknown = np.unique(sids[~self._known[sids]])
        for sid in unknown.tolist():
            self._mask[sid] = self._is_watched(sid)
            self._known[sid] = True
        return self._mask[sids]

    def append(self, rows: Sequence[tuple[int, int, float]]) -> None:
        """Add stored ``(timestamp_ms, series_id, value)`` rows; unwatched ones are skipped."""
        if not rows:
            return
        table = np.array(rows, dtype=np.float64)
        self.append_columns(table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2])

    def append_columns(self, ts: np.ndarray, sids: np.ndarray, values: np.ndarray) -> None:
        """``append`` of rows already in columns (times in ms, series ids, values)."""
        if not len(sids):
            return
        keep = self._watched(sids)
        if not keep.any():
            return
        block = (
            SampleBlock(sids, ts, values)
            if keep.all()
            else SampleBlock(sids[keep], ts[keep], values[keep])
        )
        self._chunks.append((self.next_seq, block))
        self.next_seq += len(block)
        self._held += len(block)
        while self._held > self.capacity and len(self._chunks) > 1:
            _, dropped = self._chunks.popleft()
            self._held -= len(dropped)

    def read(self, cursor: int, head: SampleBlock | None = None) -> SampleBlock | None:
        """Everything appended at or after ``cursor``; ``None`` if some of it was evicted.

        ``head`` (samples a reader held back from its last read) comes first in the same
        block: a minute of 1,024 GPUs is 68 MB, and copying it twice showed in the cycle.
        """
        if cursor < self.first_seq:
            return None
        parts = [] if head is None else [head]
        for seq, block in self._chunks:
            end = seq + len(block)
            if end <= cursor:
                continue
            parts.append(block if seq >= cursor else _tail(block, cursor - seq))
        return SampleBlock.concat(parts)


def _tail(block: SampleBlock, skip: int) -> SampleBlock:
    return SampleBlock(block.series_ids[skip:], block.timestamps_ms[skip:], block.values[skip:])
