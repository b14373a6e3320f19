"""Compaction and retention: closed minutes leave the head for chunks and rollups, then expire.

Compaction moves each closed minute of the head into one encoded chunk per series and folds
it into the hourly rollup, merging late samples into chunks already written (a minute chunk,
or the hour chunk its hour was re-packed into); the watermark moves with the data, in the
same transaction.  Then the hour pass (``store/hours.py``) re-packs closed hours.  Retention
drops raw sample data, minute statistics and hour rows, each after its own retention.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, text

from hbmwatch.settings import StoreSettings
from hbmwatch.store import codec, head
from hbmwatch.store.backend import DAY_MS, Backend
from hbmwatch.store.chunks import merge_samples
from hbmwatch.store.guard import guarded
from hbmwatch.store.hours import Hours, hour_rows, merge_late
from hbmwatch.store.results import CompactionReport, StoreMetrics
from hbmwatch.store.tiers import (
    HOUR_MS,
    MINUTE_MS,
    WATERMARK,
    batches,
    floor,
    in_list,
    read_watermark,
    write_watermark,
)


@dataclass(frozen=True)
class _Minute:
    """One head minute, compacted but not yet stored: its rows for each table."""

    samples: int
    head_samples: int  # as read, duplicates included: a write landing meanwhile changes it
    chunks: list[tuple[Any, ...]]
    merged: list[tuple[Any, ...]]
    hours: list[tuple[Any, ...]]
    hour_chunks: list[tuple[Any, ...]]


class _HeadMoved(Exception):
    """A write landed in the minute being stored: roll back and prepare it again."""


def _head_rows(conn: Any, lo: int) -> int:
    count = "SELECT coalesce(sum(n), 0) FROM samples_head_batch WHERE minute_ms = :lo"
    return int(conn.execute(text(count), {"lo": lo}).scalar_one())


@guarded
class Compaction(Hours):
    """Compaction and retention for ``Store``, a mixin over the attributes it sets.

    Relies on: ``engine``, ``settings``, ``backend``, ``metrics``, ``now_ms``, ``get_state``;
    the lock ``_write_lock`` (shared with the write path, so a minute is never compacted
    while a write into it is half done) and ``_watermark_read_at``, reset whenever the
    watermark moves so the write path re-reads it.  Every write transaction is ``_locked``
    (``store/hours.py``): other processes compacting the same store wait for it.
    """

    engine: Engine
    settings: StoreSettings
    backend: Backend
    metrics: StoreMetrics
    now_ms: Callable[[], int]
    get_state: Callable[[str], Any]
    _write_lock: threading.Lock
    _watermark_read_at: float

    def watermark_ms(self) -> int:
        """Minutes before this instant are compacted into chunks."""
        value = self.get_state(WATERMARK)
        return int(value) if value is not None else 0

    def compact(self, now_ms: int | None = None, *, hours: bool = True) -> CompactionReport:
        """Move closed minutes from the head into chunks and fold them into the tiers; then
        re-pack closed hours into hour chunks (``hours`` False leaves them in minute chunks:
        the tests and benchmarks compare the two)."""
        now = self.now_ms() if now_ms is None else now_ms
        target = floor(now - int(self.settings.compaction_grace_seconds * 1000), MINUTE_MS)
        minutes = samples = chunks = merged = 0
        while True:
            # The costly part (read, sort, encode) holds no lock, so collectors keep writing;
            # the lock is taken to store the result, after checking no write landed in that
            # minute meanwhile (a late sample): then the minute is prepared again under it.
            with self.engine.connect() as conn:
                oldest_sql = "SELECT min(minute_ms) FROM samples_head_batch"
                oldest = conn.execute(text(oldest_sql)).scalar()
                watermark = read_watermark(conn)
                if oldest is not None and oldest < target:
                    lo = floor(int(oldest), MINUTE_MS)
                    prepared = self._prepare_minute(conn, lo, watermark)
            if oldest is None or oldest >= target:
                # Every minute before the target is now complete in the tiers.
                if watermark < target:
                    with self._locked() as conn:
                        if read_watermark(conn) < target:
                            write_watermark(conn, target)
                            self._watermark_read_at = -math.inf
                break
            applied = self._store_minute(lo, watermark, prepared)
            if applied is None:
                continue
            prepared = applied
            m = len(prepared.merged) + len(prepared.hour_chunks)  # into minute or hour chunks
            minutes, samples = minutes + 1, samples + prepared.samples
            chunks, merged = chunks + len(prepared.chunks) + m, merged + m
        self.metrics.compacted.inc(samples)
        repacked = self.repack_hours() if hours else 0
        return CompactionReport(minutes, samples, chunks, merged, repacked)

    def _prepare_minute(self, conn: Any, lo: int, watermark: int) -> _Minute:
        """The chunk, merge and rollup rows of the head's minute starting at ``lo``."""
        ts, sid, values = head.read(conn, lo, lo + MINUTE_MS, dedupe=False)
        read = len(ts)
        if not read:  # another process applied it since this one looked
            return _Minute(0, 0, [], [], [], [])
        order = head.first_written(ts, sid)  # sorted by series, time; duplicates dropped
        ts, sid, values = ts[order], sid[order], values[order]
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        seg_sid = sid[starts]

        existing: dict[int, tuple[Any, ...]] = {}
        packed: dict[int, tuple[Any, ...]] = {}
        hour = floor(lo, HOUR_MS)
        if lo < watermark:  # late samples: their minute may already be in a chunk
            packed = hour_rows(conn, seg_sid.tolist(), hour)
            for batch in batches(seg_sid.tolist()):
                for row in conn.execute(
                    text(
                        "SELECT series_id, count, min, max, sum, last, data FROM samples_chunk "
                        f"WHERE start_ms = :lo AND series_id IN ({in_list(batch)})"
                    ),
                    {"lo": lo},
                ):
                    existing[int(row[0])] = tuple(row)

        fresh_segments = [
            i for i, s in enumerate(seg_sid.tolist()) if s not in existing and s not in packed
        ]
        ends = np.r_[starts[1:], len(ts)]
        chunk_rows: list[tuple[Any, ...]] = []
        rollup_rows: list[tuple[Any, ...]] = []
        if fresh_segments:
            pick = np.concatenate([np.arange(starts[i], ends[i]) for i in fresh_segments])
            sub_starts = np.r_[0, np.cumsum(ends[fresh_segments] - starts[fresh_segments])[:-1]]
            enc = codec.encode_segments(
                np.full(len(fresh_segments), lo), ts[pick], values[pick], sub_starts
            )
            last_ts = ts[ends[fresh_segments] - 1]
            for j, i in enumerate(fresh_segments):
                stats = (
                    int(enc.count[j]),
                    float(enc.min[j]),
                    float(enc.max[j]),
                    float(enc.sum[j]),
                    float(enc.last[j]),
                )
                chunk_rows.append((int(seg_sid[i]), lo, *stats, enc.blobs[j], int(last_ts[j])))
                rollup_rows.append((int(seg_sid[i]), hour, *stats, int(last_ts[j])))
        merged_rows: list[tuple[Any, ...]] = []
        hour_chunks: list[tuple[Any, ...]] = []
        for i, s in enumerate(seg_sid.tolist()):
            late_ts, late_values = ts[starts[i] : ends[i]], values[starts[i] : ends[i]]
            if s in existing:
                merged = self._merge_late(existing[s], lo, late_ts, late_values)
                if merged is not None:
                    merged_rows.append((s, lo, *merged[0]))
                    rollup_rows.append((s, hour, *merged[1]))
            elif s in packed:
                into_hour = merge_late(packed[s], lo, late_ts, late_values)
                if into_hour is not None:
                    hour_chunks.append(into_hour[0])
                    rollup_rows.append((s, hour, *into_hour[1]))
        return _Minute(len(ts), read, chunk_rows, merged_rows, rollup_rows, hour_chunks)

    def _store_minute(self, lo: int, watermark: int, prepared: _Minute) -> _Minute | None:
        """Store the head's minute ``lo`` under the compaction lock, prepared again there when
        what it was prepared from has changed; None when it is not stored (another process
        took it out of the head, or a write landed in it meanwhile: the caller looks again).
        """
        try:
            with self._locked() as conn:
                # Under the lock these reads see what other processes committed.  A late
                # minute is prepared again: the hour pass may have re-packed its chunks.
                in_head = _head_rows(conn, lo)
                if in_head == 0:
                    return None
                moved = in_head != prepared.head_samples
                if lo < watermark or read_watermark(conn) != watermark or moved:
                    watermark = read_watermark(conn)
                    prepared = self._prepare_minute(conn, lo, watermark)
                self._apply_minute(conn, lo, prepared)
                if lo + MINUTE_MS > watermark:
                    write_watermark(conn, lo + MINUTE_MS)
                    self._watermark_read_at = -math.inf
        except _HeadMoved:
            return None
        return prepared

    def _apply_minute(self, conn: Any, lo: int, minute: _Minute) -> None:
        """Store a prepared minute and take its samples out of the head."""
        self.backend.write_chunks(conn, minute.chunks, replace=False)
        self.backend.write_chunks(conn, minute.merged, replace=True)
        self.backend.merge_rollup_1h(conn, minute.hours)
        if minute.hour_chunks:
            self.backend.write_hours(conn, minute.hour_chunks)
        # Writers do not take the compaction lock: on PostgreSQL one may commit a late
        # sample into this minute after it was read; deleting it unread would lose it.
        gone = conn.execute(
            text("DELETE FROM samples_head_batch WHERE minute_ms = :lo RETURNING n"), {"lo": lo}
        ).scalars()
        if sum(gone) != minute.head_samples:
            raise _HeadMoved

    @staticmethod
    def _merge_late(
        row: tuple[Any, ...], lo: int, ts: np.ndarray, values: np.ndarray
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """Merge late samples into a stored chunk; stored values win on equal timestamps.

        Returns the new chunk columns and the statistics of what was added (for the hourly
        tier), or None when nothing was new.  A chunk whose raw samples have expired takes
        nothing: raw retention expires whole minutes only, writes that old are refused, so
        only a write accepted just before a retention pass passed its minute gets here.
        """
        if row[6] is None:
            return None
        merged = merge_samples(row[6], lo, ts, values)
        if merged is None:
            return None
        all_ts, all_values, added = merged
        chunk = (
            len(all_ts), float(all_values.min()), float(all_values.max()),
            float(all_values.sum()), float(all_values[-1]),
            codec.encode(lo, all_ts, all_values), int(all_ts[-1]),
        )  # fmt: skip
        return chunk, added

    def apply_retention(self, now_ms: int | None = None) -> dict[str, int]:
        """Expire raw samples, then 1-minute and 1-hour rows, each after its own retention."""
        now = self.now_ms() if now_ms is None else now_ms
        s = self.settings
        raw_cutoff = now - int(s.raw_retention_days * DAY_MS)
        minute_cutoff = now - int(s.rollup_1m_retention_days * DAY_MS)
        hour_cutoff = now - int(s.rollup_1h_retention_days * DAY_MS)
        with self._locked() as conn:
            # whole minutes: one that straddles the cutoff keeps samples writes still accept
            raw = conn.execute(
                text(
                    "UPDATE samples_chunk SET data = NULL WHERE series_id IN (SELECT id FROM "
                    "series) AND start_ms < :cutoff AND data IS NOT NULL"
                ),
                {"cutoff": floor(raw_cutoff, MINUTE_MS)},
            ).rowcount
            # whole head minutes: one that straddles the cutoff goes with its compaction
            old_head = {"cutoff": floor(raw_cutoff, MINUTE_MS)}
            old_sum = "SELECT coalesce(sum(n), 0) FROM samples_head_batch WHERE minute_ms < :cutoff"
            head_rows = conn.execute(text(old_sum), old_head).scalar_one()
            conn.execute(text("DELETE FROM samples_head_batch WHERE minute_ms < :cutoff"), old_head)
            minute = self.backend.drop_minute_tier_before(conn, minute_cutoff)
            hour_chunks = self._expire_hours(conn, raw_cutoff, minute_cutoff)
            hour = conn.execute(
                text(
                    "DELETE FROM rollup_1h WHERE series_id IN (SELECT id FROM series) "
                    "AND start_ms < :cutoff"
                ),
                {"cutoff": hour_cutoff},
            ).rowcount
        return {
            "raw_chunks_expired": raw or 0,
            "head_rows_deleted": int(head_rows),
            "minute_rows_deleted": minute,
            "hour_rows_deleted": hour or 0,
            **hour_chunks,
        }
