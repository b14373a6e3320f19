"""Compaction's hour pass: a series' closed hour of minute chunks re-packed into one row.

A minute chunk per series costs a row key, five statistics and a short blob each minute;
one ``samples_hour`` row an hour holds the same samples in one chunk (pcodec finds more to
squeeze in 3,600 samples than in 60) and the minute statistics packed (``store/chunks.py``),
about half the bytes.  Minute chunks stay for the open hour: the head must stay small, and
late samples and the 1-minute tier need them.

Once the compaction watermark is past an hour's end plus the compaction grace, each batch
of series has its minute rows of that hour read, decoded and re-encoded outside the write
lock, then stored (and the minute rows deleted) under it in one transaction, prepared again
if a late sample changed those minute rows meanwhile.  ``store_state`` keeps how far the
pass got.  Minute rows written before this pass existed are re-packed the same way.

Several processes compact one store (the service, the API's process): every compaction
write transaction, here and in ``store/compaction.py``, is ``_locked`` (the process's write
lock, then the database's compaction lock as its first statement), so the re-checks it
reads decide on what the other processes have committed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, text

from hbmwatch.settings import StoreSettings
from hbmwatch.store import codec
from hbmwatch.store.backend import DAY_MS, Backend
from hbmwatch.store.chunks import MinuteStats, merge_samples, pack_minutes, unpack_minutes
from hbmwatch.store.guard import guarded
from hbmwatch.store.tiers import (
    HOUR_MS,
    MINUTE_MS,
    batches,
    floor,
    in_list,
    read_watermark,
    write_state,
)

#: the store_state row: hours before this instant (epoch ms) have been re-packed
HOURS_PACKED = "hours_packed_until_ms"
#: hours one compaction pass re-packs at most (a migrated store's backlog takes several)
HOURS_PER_PASS = 6
_ALL_SERIES = "series_id IN (SELECT id FROM series)"  # keeps SQLite's range scans indexed


@dataclass(frozen=True)
class _HourBatch:
    """One hour of a batch of series, re-packed but not stored: what it replaces, and rows."""

    signature: tuple[int, ...]
    rows: list[tuple[Any, ...]]


def read_packed_until(conn: Any) -> int:
    value = conn.execute(
        text("SELECT value FROM store_state WHERE name = :n"), {"n": HOURS_PACKED}
    ).scalar()
    return int(value) if value is not None else 0


def _minute_rows(conn: Any, ids: list[int], hour: int) -> list[tuple[Any, ...]]:
    """Through the driver's cursor: plain tuples, no row objects for sixty rows a series."""
    cur = conn.connection.driver_connection.cursor()
    try:
        cur.execute(  # every interpolated value is an int
            "SELECT series_id, start_ms, count, min, max, sum, last, last_ms, data "
            f"FROM samples_chunk WHERE series_id IN ({in_list(ids)}) AND start_ms >= {int(hour)} "
            f"AND start_ms < {int(hour) + HOUR_MS} ORDER BY series_id, start_ms"
        )
        return cur.fetchall()
    finally:
        cur.close()


def _signature(conn: Any, ids: list[int], hour: int) -> tuple[int, ...]:
    """Minute rows, samples, newest times and raw chunks of the hour: a late sample merged
    meanwhile, another process's re-pack or a retention pass changes it."""
    row = conn.execute(
        text(
            "SELECT count(*), COALESCE(sum(count), 0), COALESCE(sum(last_ms), 0), count(data) "
            f"FROM samples_chunk WHERE series_id IN ({in_list(ids)}) "
            "AND start_ms >= :lo AND start_ms < :hi"
        ),
        {"lo": hour, "hi": hour + HOUR_MS},
    ).one()
    return tuple(int(v) for v in row)


def repack(rows: list[tuple[Any, ...]], hour: int, expired: bool = False) -> list[tuple[Any, ...]]:
    """``samples_hour`` rows from minute rows sorted by series and time (``_minute_rows``).

    A series whose raw samples have partly expired is left out (its minute rows stay, and
    expire minute by minute), unless the whole hour is past raw retention (``expired``):
    then its row keeps no raw samples, as raw retention would leave it.  So an hour row
    without ``data`` only covers samples that the write path refuses as too old."""
    groups: list[list[tuple[Any, ...]]] = []
    for row in rows:
        if groups and groups[-1][0][0] == row[0]:
            groups[-1].append(row)
        else:
            groups.append([row])
    if not expired:
        groups = [g for g in groups if all(r[8] is not None for r in g)]
        rows = [r for g in groups for r in g]
    if not groups:
        return []
    stored = [r for r in rows if r[8] is not None]
    ts, values, counts = codec.decode_many([bytes(r[8]) for r in stored], [r[1] for r in stored])
    ends = iter(np.cumsum(counts).tolist())
    stats: list[MinuteStats] = []
    samples: list[tuple[np.ndarray, np.ndarray] | None] = []
    at = 0
    for group in groups:
        mine = sum(1 for r in group if r[8] is not None)
        end = at
        for _ in range(mine):
            end = next(ends)
        samples.append((ts[at:end], values[at:end]) if mine == len(group) else None)
        at = end
        # A chunk older than migration 0004 stands at its minute's end, as the readers say.
        cols = np.array(
            [(*r[1:7], r[7] if r[7] is not None else r[1] + MINUTE_MS - 1) for r in group],
            dtype=np.float64,
        )
        ints = cols[:, [0, 1, 6]].astype(np.int64)
        stats.append(MinuteStats(ints[:, 0], ints[:, 1], *cols[:, 2:6].T, ints[:, 2]))
    packed = pack_minutes([hour] * len(groups), stats)
    blobs = _hour_blobs(hour, samples)
    return [(g[0][0], hour, p, b) for g, p, b in zip(groups, packed, blobs, strict=True)]


def _hour_blobs(hour: int, samples: list[tuple[np.ndarray, np.ndarray] | None]) -> list:
    """One codec chunk per series' hour (None: raw expired), encoded in one vectorised call."""
    whole = [i for i, s in enumerate(samples) if s is not None]
    out: list[bytes | None] = [None] * len(samples)
    if not whole:
        return out
    ts = [samples[i][0] for i in whole]  # type: ignore[index]
    vs = [samples[i][1] for i in whole]  # type: ignore[index]
    lengths = np.array([len(t) for t in ts])
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    enc = codec.encode_segments(
        np.full(len(whole), hour), np.concatenate(ts), np.concatenate(vs), starts
    )
    for i, blob in zip(whole, enc.blobs, strict=True):
        out[i] = blob
    return out


def merge_late(
    row: tuple[Any, ...], minute: int, ts: np.ndarray, values: np.ndarray
) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """Merge late samples of ``minute`` into a stored hour row (series_id, start_ms, minutes,
    data); stored values win on equal timestamps.

    Returns the new row and the statistics of what was added (for the hourly rollup), or
    None when nothing was new or the hour's raw samples have expired: only a whole hour past
    raw retention has none (``repack``), and the write path refuses samples that old, so
    only a write accepted just before a retention pass passed its hour gets here.
    """
    sid, hour, minutes, blob = row
    if blob is None or minutes is None:
        return None
    merged_samples = merge_samples(blob, hour, ts, values)
    if merged_samples is None:
        return None
    all_ts, all_values, added = merged_samples
    in_minute = (all_ts >= minute) & (all_ts < minute + MINUTE_MS)
    mt, mv = all_ts[in_minute], all_values[in_minute]
    stats = unpack_minutes(bytes(minutes), hour)
    keep = stats.start_ms != minute
    merged = MinuteStats(
        *(np.r_[getattr(stats, f)[keep], x] for f, x in (
            ("start_ms", minute), ("count", len(mt)), ("min", mv.min()), ("max", mv.max()),
            ("sum", mv.sum()), ("last", mv[-1]), ("last_ms", mt[-1])))
    )  # fmt: skip
    order = np.argsort(merged.start_ms, kind="stable")
    merged = MinuteStats(*(getattr(merged, f)[order] for f in MinuteStats.__slots__))
    (packed,) = pack_minutes([hour], [merged])
    return (sid, hour, packed, codec.encode(hour, all_ts, all_values)), added


def hour_rows(conn: Any, ids: list[int], hour: int) -> dict[int, tuple[Any, ...]]:
    """The stored ``samples_hour`` rows of ``ids`` for one hour, by series."""
    out = {}
    for batch in batches(ids):
        for row in conn.execute(
            text(
                "SELECT series_id, start_ms, minutes, data FROM samples_hour WHERE "
                f"series_id IN ({in_list(batch)}) AND start_ms = :hour"
            ),
            {"hour": hour},
        ):
            out[int(row[0])] = tuple(row)
    return out


@guarded
class Hours:
    """The hour pass of ``Store``, a mixin; relies on what ``Compaction`` does."""

    engine: Engine
    settings: StoreSettings
    backend: Backend
    now_ms: Callable[[], int]
    _write_lock: threading.Lock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Connection]:
        """A compaction write transaction: this process's write lock, then the database's
        compaction lock as the transaction's first statement (always in that order, as the
        write path takes the write lock before the database's), so no other process
        compacts until it commits and what it reads is what they committed."""
        with self._write_lock, self.engine.begin() as conn:
            self.backend.lock_compaction(conn)
            yield conn

    def _advance_packed(self, until: int) -> None:
        """Move ``HOURS_PACKED`` forward (another process's pass may be further on)."""
        with self._locked() as conn:
            if read_packed_until(conn) < until:
                write_state(conn, HOURS_PACKED, until)

    def repack_hours(self, max_hours: int = HOURS_PER_PASS) -> int:
        """Re-pack the hours the watermark (less the grace) has closed, at most ``max_hours``
        of them (a store's backlog clears over several passes, the minute pass running
        between them); returns the series-hours stored."""
        grace = int(self.settings.compaction_grace_seconds * 1000)
        stored = 0
        for _ in range(max_hours):
            with self.engine.connect() as conn:
                done = read_packed_until(conn)
                limit = floor(read_watermark(conn) - grace, HOUR_MS)
                first = conn.execute(
                    text(f"SELECT min(start_ms) FROM samples_chunk WHERE {_ALL_SERIES} "
                         "AND start_ms >= :done AND start_ms < :limit"),
                    {"done": done, "limit": limit},
                ).scalar()  # fmt: skip
            if first is None:  # the usual answer: no closed hour left (read every compaction)
                if limit > done:
                    self._advance_packed(limit)
                return stored
            with self.engine.connect() as conn:
                ids = [int(i) for (i,) in conn.execute(text("SELECT id FROM series ORDER BY id"))]
            hour = floor(int(first), HOUR_MS)
            for batch in batches(ids):
                stored += self._repack_batch(batch, hour)
            self._advance_packed(hour + HOUR_MS)
        return stored

    def _repack_batch(self, ids: list[int], hour: int) -> int:
        with self.engine.connect() as conn:
            prepared = self._prepare_hour(conn, ids, hour)
        if not prepared.rows:
            return 0
        with self._locked() as conn:
            if _signature(conn, ids, hour) != prepared.signature:
                prepared = self._prepare_hour(conn, ids, hour)
            if not prepared.rows:  # another process re-packed them meanwhile
                return 0
            self.backend.write_hours(conn, prepared.rows)
            conn.execute(  # the series re-packed; one with raw partly expired keeps its rows
                text(
                    f"DELETE FROM samples_chunk WHERE series_id IN "
                    f"({in_list([r[0] for r in prepared.rows])}) "
                    "AND start_ms >= :lo AND start_ms < :hi"
                ),
                {"lo": hour, "hi": hour + HOUR_MS},
            )
        return len(prepared.rows)

    def _prepare_hour(self, conn: Any, ids: list[int], hour: int) -> _HourBatch:
        rows = _minute_rows(conn, ids, hour)
        raw_cutoff = self.now_ms() - int(self.settings.raw_retention_days * DAY_MS)
        signature = (
            len(rows),
            sum(int(r[2]) for r in rows),
            sum(int(r[7]) for r in rows if r[7] is not None),
            sum(1 for r in rows if r[8] is not None),
        )
        expired = hour + HOUR_MS <= raw_cutoff
        return _HourBatch(signature, repack(rows, hour, expired) if rows else [])

    def _expire_hours(self, conn: Any, raw_cutoff: int, minute_cutoff: int) -> dict[str, int]:
        """Retention of ``samples_hour``: an hour goes from a tier once all of it is past."""
        raw = conn.execute(
            text(f"UPDATE samples_hour SET data = NULL WHERE {_ALL_SERIES} "
                 "AND start_ms <= :cutoff AND data IS NOT NULL"),
            {"cutoff": raw_cutoff - HOUR_MS},
        ).rowcount  # fmt: skip
        stats = conn.execute(
            text(f"UPDATE samples_hour SET minutes = NULL WHERE {_ALL_SERIES} "
                 "AND start_ms <= :cutoff AND minutes IS NOT NULL"),
            {"cutoff": minute_cutoff - HOUR_MS},
        ).rowcount  # fmt: skip
        gone = self.backend.drop_hour_partitions_before(conn, min(raw_cutoff, minute_cutoff))
        gone += (
            conn.execute(
                text(f"DELETE FROM samples_hour WHERE {_ALL_SERIES} "
                     "AND start_ms <= :cutoff AND data IS NULL AND minutes IS NULL"),
                {"cutoff": max(raw_cutoff, minute_cutoff) - HOUR_MS},
            ).rowcount or 0
        )  # fmt: skip
        return {"raw_hours_expired": raw or 0, "minute_hours_expired": stats or 0,
                "hour_chunks_deleted": gone}  # fmt: skip
