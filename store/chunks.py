"""Chunks at rest, read from both tables, and the packed minute statistics of an hour.

A series' closed minute sits in exactly one place: its own ``samples_chunk`` row, or (once
compaction's hour pass has re-packed its hour, ``store/hours.py``) its hour's ``samples_hour``
row.  Every reader of chunks goes through ``chunk_blobs`` (raw samples) or ``minute_stats``
(the 1-minute tier), which read both tables, so no reader needs to know where the pass is.

An hour row's ``minutes`` blob holds the statistics of the minutes that had samples::

    byte 0     format (1)
    bytes 1-8  which of the hour's 60 minutes are present (bit m = minute m, little endian)
    then       three codec chunks (``store/codec.py``), each after a varint length but the
               last: integers (counts, then each minute's last sample in ms after the
               minute's start), sample values (mins, maxes, lasts) and sums

Grouping arrays of one kind lets each chunk keep one decimal scale; the codec's timestamps
are 0..n-1 (regular, three bytes).  An hour of a flat series packs into about 60 bytes, of
noisy telemetry at 1 s into about 330 (docs/store.md).

Readers that take more than one statement (``minute_stats`` with the head after it, say)
run inside ``store.engine.read_snapshot``, so a compaction committing between their
statements cannot move a minute past them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import text

from hbmwatch.store import codec
from hbmwatch.store.tiers import HOUR_MS, MINUTE_MS, batches, floor, in_list

FORMAT = 1
_MINUTES = HOUR_MS // MINUTE_MS
_BITS = np.uint64(1) << np.arange(_MINUTES, dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class MinuteStats:
    """The statistics of one series' minutes: each minute's start and last sample (ms)."""

    start_ms: np.ndarray
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    last: np.ndarray
    last_ms: np.ndarray


def pack_minutes(hour_ms: Sequence[int], stats: Sequence[MinuteStats]) -> list[bytes]:
    """The ``minutes`` blob of each (series') hour; ``stats`` within ``hour_ms`` each."""
    arrays: list[np.ndarray] = []
    masks: list[int] = []
    for hour, s in zip(hour_ms, stats, strict=True):
        index = (s.start_ms - hour) // MINUTE_MS
        masks.append(int(np.bitwise_or.reduce(_BITS[index])))
        arrays.append(np.r_[s.count, s.last_ms - s.start_ms].astype(np.float64))
        arrays.append(np.r_[s.min, s.max, s.last])
        arrays.append(np.asarray(s.sum, dtype=np.float64))
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    values = np.concatenate(arrays)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    ts = np.arange(len(values), dtype=np.int64) - np.repeat(starts, lengths)
    enc = codec.encode_segments(np.zeros(len(arrays), dtype=np.int64), ts, values, starts)
    out = []
    for i, mask in enumerate(masks):
        ints, vals, sums = enc.blobs[3 * i : 3 * i + 3]
        out.append(
            bytes((FORMAT,)) + mask.to_bytes(8, "little")
            + codec.varints(len(ints)) + ints + codec.varints(len(vals)) + vals + sums
        )  # fmt: skip
    return out


def unpack_minutes(blob: bytes, hour_ms: int) -> MinuteStats:
    """The statistics ``pack_minutes`` packed, minutes in time order."""
    table = unpack_many([blob], [hour_ms])
    ints = table[:, [START, COUNT, LAST_MS]].astype(np.int64)
    return MinuteStats(ints[:, 0], ints[:, 1], *table[:, MIN : LAST + 1].T, ints[:, 2])


def unpack_many(
    blobs: Sequence[bytes], hours_ms: Sequence[int], series_ids: Sequence[int] | None = None
) -> np.ndarray:
    """The minutes of many packed hours as one ``minute_stats`` table, in the blobs' order,
    every codec chunk of them decoded in one ``decode_many``."""
    parts: list[bytes] = []
    masks = np.zeros(len(blobs), dtype=np.uint64)
    for i, blob in enumerate(blobs):
        if len(blob) < 10 or blob[0] != FORMAT:
            raise codec.CorruptChunk(f"unknown minute statistics format {blob[:1]!r}")
        masks[i] = int.from_bytes(blob[1:9], "little")
        (a,), pos = codec.read_varints(blob, 9, 1)
        (b,), mid = codec.read_varints(blob, pos + a, 1)
        parts += [blob[pos : pos + a], blob[mid : mid + b], blob[mid + b :]]
    present = (masks[:, None] & _BITS[None, :]) != 0
    n = present.sum(axis=1)
    _, flat, counts = codec.decode_many(parts, [0] * len(parts))
    if not np.array_equal(counts.reshape(-1, 3), n[:, None] * np.array([2, 3, 1])):
        raise codec.CorruptChunk("minute statistics do not add up to their minutes")
    offsets = np.r_[0, np.cumsum(counts)][:-1].reshape(-1, 3)
    row, minute = np.nonzero(present)
    within = np.arange(len(row)) - np.repeat(np.r_[0, np.cumsum(n)[:-1]], n)
    at_ints, at_vals, at_sums = (offsets[row, k] + within for k in range(3))
    start = np.asarray(hours_ms, dtype=np.int64)[row] + minute * MINUTE_MS
    sid = np.zeros(len(row)) if series_ids is None else np.asarray(series_ids, np.float64)[row]
    return np.column_stack((
        sid, start, flat[at_ints], flat[at_vals], flat[at_vals + n[row]],
        flat[at_sums], flat[at_vals + 2 * n[row]], start + flat[at_ints + n[row]],
    ))  # fmt: skip


def merge_samples(
    blob: bytes, start_ms: int, ts: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[Any, ...]] | None:
    """A stored chunk's samples with late ones merged in, time-sorted (stored values win on
    equal timestamps), and the statistics of what was added (count, min, max, sum, last,
    last_ms: for the hourly rollup); None when nothing was new."""
    old_ts, old_values = codec.decode(bytes(blob), start_ms)
    new = ~np.isin(ts, old_ts)
    add_ts, add_values = ts[new], values[new]
    if len(add_ts) == 0:
        return None
    all_ts, all_values = np.r_[old_ts, add_ts], np.r_[old_values, add_values]
    order = np.argsort(all_ts, kind="stable")
    added = (
        len(add_ts), float(add_values.min()), float(add_values.max()),
        float(add_values.sum()), float(add_values[-1]), int(add_ts[-1]),
    )  # fmt: skip
    return all_ts[order], all_values[order], added


def chunk_blobs(conn: Any, ids: Sequence[int], lo: int, hi: int) -> Iterator[tuple[int, int, Any]]:
    """``(series_id, chunk start, data)`` of every chunk that may hold samples in ``[lo, hi)``
    ms: hour chunks and minute chunks, in no particular order (``data`` None: expired)."""
    for batch in batches(ids):
        which = f"series_id IN ({in_list(batch)}) AND start_ms < :hi"
        # One statement: the hour pass moves a minute between the tables in one transaction,
        # so a reader outside ``read_snapshot`` (the write path's duplicate check) still
        # sees it in exactly one.
        yield from conn.execute(
            text(
                f"SELECT series_id, start_ms, data FROM samples_hour WHERE {which} "
                "AND start_ms >= :hour_lo UNION ALL "
                f"SELECT series_id, start_ms, data FROM samples_chunk WHERE {which} "
                "AND start_ms >= :minute_lo"
            ),
            {"hour_lo": floor(lo, HOUR_MS), "minute_lo": floor(lo, MINUTE_MS), "hi": hi},
        )


#: columns of ``minute_stats``' table
SID, START, COUNT, MIN, MAX, SUM, LAST, LAST_MS = range(8)


def minute_stats(conn: Any, ids: Sequence[int], lo: int, hi: int) -> np.ndarray:
    """One row per series and minute starting in ``[lo, hi)`` ms, from either table:
    (series_id, start_ms, count, min, max, sum, last, last_ms) as float64 (ms and ids are
    exact), sorted by series and time.  ``last_ms`` of chunks older than migration 0004 is
    their minute's last millisecond."""
    parts: list[np.ndarray] = []
    if hi <= lo:
        return np.zeros((0, 8))
    stamp = f"COALESCE(last_ms, start_ms + {MINUTE_MS - 1})"
    for batch in batches(ids):
        which = f"series_id IN ({in_list(batch)}) AND start_ms < :hi"
        rows = conn.execute(  # one statement, one round trip, both tables
            text(
                f"SELECT series_id, start_ms, count, min, max, sum, last, {stamp}, NULL "
                f"FROM samples_chunk WHERE {which} AND start_ms >= :lo UNION ALL "
                "SELECT series_id, start_ms, NULL, NULL, NULL, NULL, NULL, NULL, minutes "
                f"FROM samples_hour WHERE {which} AND start_ms >= :hour_lo "
                "AND minutes IS NOT NULL"
            ),
            {"lo": lo, "hour_lo": floor(lo, HOUR_MS), "hi": hi},
        ).all()
        minutes = [tuple(r)[:8] for r in rows if r[8] is None]
        if minutes:
            parts.append(np.array(minutes, dtype=np.float64))
        hours = [r for r in rows if r[8] is not None]
        if hours:
            sids, starts, blobs = zip(*((r[0], r[1], r[8]) for r in hours), strict=True)
            table = unpack_many([bytes(b) for b in blobs], starts, sids)
            parts.append(table[(table[:, START] >= lo) & (table[:, START] < hi)])
    if not parts:
        return np.zeros((0, 8))
    table = np.concatenate(parts)
    return table[np.lexsort((table[:, START], table[:, SID]))]


def by_series(table: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """The blocks of a table sorted by series id (column 0), one per series."""
    if len(table) == 0:
        return
    cuts = np.flatnonzero(np.r_[True, table[1:, 0] != table[:-1, 0]])
    for a, b in zip(cuts.tolist(), [*cuts[1:].tolist(), len(table)], strict=True):
        yield int(table[a, 0]), table[a:b]
