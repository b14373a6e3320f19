"""The head: samples not compacted yet, one row per write batch and minute.

A write splits its accepted samples by minute and stores each minute's as one
``samples_head_batch`` row of three raw little-endian arrays: uint16 milliseconds after
``minute_ms``, uint32 series ids (int64 when one is past 2**32: the blob's length over
``n`` tells) and float64 values, 14 bytes a sample with no compression (the head lives
minutes).  One INSERT of a few blobs per write replaces one B-tree insert per sample
(about 3 us each), and compaction reads and deletes a minute as a few rows.

Duplicates: the first value written for (series, ts) wins.  The writer knows the newest
time it wrote of each series (``NewestWritten``); a sample after it cannot be in the head
unless another process wrote it, and is stored without a lookup.  A sample at or before it
is looked up in the head batches of its minute.  Two processes writing one series can
therefore both store a sample, and count it as accepted; so every reader (``read``) and
compaction dedupe by (series, ts), keeping the lowest ``seq``: what is stored stays
first-written-wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hbmwatch.store.backend import HeadBatchRow
from hbmwatch.store.tiers import MINUTE_MS

_EMPTY_I = np.zeros(0, np.int64)
_U2, _U4, _I8, _F8 = np.dtype("<u2"), np.dtype("<u4"), np.dtype("<i8"), np.dtype("<f8")


def batch_rows(ts: np.ndarray, sids: np.ndarray, values: np.ndarray) -> list[HeadBatchRow]:
    """One head row per minute the samples fall in, samples in their given order."""
    minutes = ts - ts % MINUTE_MS
    first, last = int(minutes.min()), int(minutes.max())
    if first == last:
        return [_row(first, ts, sids, values)]
    rows = []
    for minute in np.unique(minutes).tolist():
        pick = minutes == minute
        rows.append(_row(minute, ts[pick], sids[pick], values[pick]))
    return rows


def _row(minute: int, ts: np.ndarray, sids: np.ndarray, values: np.ndarray) -> HeadBatchRow:
    wide = int(sids.max()) > 0xFFFF_FFFF
    return (
        minute,
        len(ts),
        (ts - minute).astype(_U2).tobytes(),
        sids.astype(_I8 if wide else _U4).tobytes(),
        values.astype(_F8, copy=False).tobytes(),
    )


def _times(minute: int, blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, _U2).astype(np.int64) + minute


def _ids(n: int, blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, _U4 if len(blob) == 4 * n else _I8).astype(np.int64)


def read(
    conn: Any, lo: int, hi: int, ids: Any = None, *, values: bool = True, dedupe: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Head samples with ``lo <= ts < hi`` (of series ``ids``, if given) as times, series ids
    and values (empty unless ``values``), deduped first-written-wins and sorted by series
    then time (unless not ``dedupe``: then in storage order)."""
    columns = "minute_ms, n, ts, series_id" + (", value" if values else "")
    raw = conn.connection.driver_connection
    # plain tuples of bytes; psycopg fetches them binary, not as hex text to decode
    cur = raw.cursor(binary=True) if conn.dialect.name == "postgresql" else raw.cursor()
    try:
        cur.execute(  # every interpolated value is an int
            f"SELECT {columns} FROM samples_head_batch WHERE minute_ms >= "
            f"{int(lo) - int(lo) % MINUTE_MS} AND minute_ms < {int(hi)} ORDER BY seq"
        )
        fetched = cur.fetchall()
    finally:
        cur.close()
    if not fetched:
        return _EMPTY_I, _EMPTY_I, np.zeros(0)
    ts = np.concatenate([_times(r[0], r[2]) for r in fetched])
    sids = np.concatenate([_ids(r[1], r[3]) for r in fetched])
    vals = np.concatenate([np.frombuffer(r[4], _F8) for r in fetched]) if values else None
    keep = (ts >= lo) & (ts < hi)
    if ids is not None:
        keep &= np.isin(sids, np.asarray(ids, dtype=np.int64))
    if not keep.all():
        ts, sids = ts[keep], sids[keep]
        vals = vals[keep] if vals is not None else None
    if dedupe:
        order = first_written(ts, sids)
        ts, sids = ts[order], sids[order]
        vals = vals[order] if vals is not None else None
    return ts, sids, (vals if vals is not None else np.zeros(0))


def first_written(ts: np.ndarray, sids: np.ndarray) -> np.ndarray:
    """Indices that sort samples (in write order) by series then time, keeping only the first
    written of each (series, ts)."""
    order = np.lexsort((ts, sids))  # stable: equal keys stay in write order
    s, t = sids[order], ts[order]
    if len(order) < 2:
        return order
    first = np.r_[True, (s[1:] != s[:-1]) | (t[1:] != t[:-1])]
    return order if first.all() else order[first]


def already_stored(conn: Any, ts: np.ndarray, sids: np.ndarray) -> np.ndarray:
    """Which of the samples (series, ts) the head holds already: looked up in the head
    batches of their minutes, one minute at a time."""
    found = np.zeros(len(ts), dtype=bool)
    minutes = ts - ts % MINUTE_MS
    for minute in np.unique(minutes).tolist():
        here = minutes == minute
        got_ts, got_sids, _ = read(conn, minute, minute + MINUTE_MS, values=False, dedupe=False)
        if len(got_ts):
            # within a minute, series * 60_000 + offset is one exact int64 key per sample
            stored = got_sids * MINUTE_MS + (got_ts - minute)
            asked = sids[here] * MINUTE_MS + (ts[here] - minute)
            found[here] = np.isin(asked, stored)
    return found


class NewestWritten:
    """The newest sample time this process stored of each series, indexed by series id.

    Loaded from the head on first use; a series with nothing there starts just before the
    compaction watermark of that moment, since everything at or after it is in the head.
    """

    def __init__(self) -> None:
        self._newest: np.ndarray | None = None
        self._slot = _EMPTY_I  # scratch for ``distinct``, as long as ``_newest``
        self._default = 0

    @property
    def loaded(self) -> bool:
        return self._newest is not None

    def load(self, conn: Any, watermark: int) -> None:
        ts, sids, _ = read(conn, 0, 2**62, values=False, dedupe=False)
        self._default = watermark - 1
        self._newest = np.full(int(sids.max()) + 1 if len(sids) else 0, self._default)
        self._slot = np.zeros(len(self._newest), np.int64)
        np.maximum.at(self._newest, sids, ts)

    def of(self, sids: np.ndarray) -> np.ndarray:
        """The newest time of each of ``sids`` (growing the index for new series)."""
        assert self._newest is not None
        top = int(sids.max()) + 1
        if top > len(self._newest):
            grow = max(top, 2 * len(self._newest)) - len(self._newest)
            self._newest = np.r_[self._newest, np.full(grow, self._default)]
            self._slot = np.r_[self._slot, np.zeros(grow, np.int64)]
        return self._newest[sids]

    def distinct(self, sids: np.ndarray) -> bool:
        """Whether no id repeats in ``sids`` (after ``of`` sized the index): each writes its
        position into a scratch slot, and a repeat finds a later one in its own."""
        where = np.arange(len(sids))
        self._slot[sids] = where
        return bool((self._slot[sids] == where).all())

    def update(self, ts: np.ndarray, sids: np.ndarray, unique: bool) -> None:
        """Take in stored samples (``unique``: each series at most once, the common case)."""
        assert self._newest is not None
        if unique:
            self._newest[sids] = np.maximum(self._newest[sids], ts)
        else:
            np.maximum.at(self._newest, sids, ts)


def head_samples(
    conn: Any, ids: Sequence[int], lo: int, hi: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Head samples in ``[lo, hi)`` ms of each series: times (ms) and values, time-sorted."""
    ts, sids, values = read(conn, lo, hi, ids)
    if not len(ts):
        return {}
    starts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
    ends = np.r_[starts[1:], len(sids)]
    return {
        int(sids[a]): (ts[a:b], values[a:b])
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    }


def series_in(conn: Any, ids: Sequence[int], lo: int, hi: int) -> set[int]:
    """Which of ``ids`` hold a head sample in ``[lo, hi]``."""
    if not ids:
        return set()
    _, sids, _ = read(conn, lo, hi + 1, ids, values=False, dedupe=False)
    return set(np.unique(sids).tolist())


def newest(conn: Any, ids: Sequence[int], since: int) -> dict[int, tuple[int, float]]:
    """The newest head sample of each of ``ids`` since ``since``: (ms, value)."""
    ts, sids, values = read(conn, since, 2**62, ids)
    if not len(ts):
        return {}
    last = np.flatnonzero(np.r_[sids[1:] != sids[:-1], True])
    columns = (sids[last].tolist(), ts[last].tolist(), values[last].tolist())
    return {int(s): (int(t), float(v)) for s, t, v in zip(*columns, strict=True)}
