"""What SQLite and PostgreSQL do differently: bulk writes, upserts, partitions.

Everything else in the store is dialect-neutral SQLAlchemy.  The hot paths go to the DBAPI
connection directly (``executemany``), because the write path has to keep within 0.7 of
what the driver alone can do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Connection, text

DAY_MS = 86_400_000
#: one ``samples_head_batch`` row: minute_ms, n, and the ts, series_id, value blobs
HeadBatchRow = tuple[int, int, bytes, bytes, bytes]

_HEAD_COLUMNS = "minute_ms, n, ts, series_id, value"

_CHUNK_COLUMNS = "series_id, start_ms, count, min, max, sum, last, data, last_ms"
_ROLLUP_COLUMNS = "series_id, start_ms, count, min, max, sum, last, last_ms"
_HOUR_COLUMNS = "series_id, start_ms, minutes, data"
#: PostgreSQL: the transaction-scoped lock every compaction write transaction takes first, one
#: per schema (the processes sharing one store: the service, the API, detector shards)
#: One process at a time creates partitions, seeing what the others made (collector and
#: detector shards share one store), or a CREATE ... IF NOT EXISTS can still race another's
#: into DuplicateTable.
PARTITION_LOCK_SQL = (
    "SELECT pg_advisory_xact_lock(hashtextextended('hbmwatch partitions:' || current_schema(), 0))"
)
COMPACTION_LOCK_SQL = (
    "SELECT pg_advisory_xact_lock(hashtextextended('hbmwatch compaction:' || current_schema(), 0))"
)


class Backend(Protocol):
    name: str

    def insert_head(self, conn: Connection, rows: Sequence[HeadBatchRow]) -> None:
        """Append head batch rows (``store/head.py``: duplicates are left out before)."""

    def lock_compaction(self, conn: Connection) -> None:
        """Take the store-wide compaction lock for the rest of ``conn``'s transaction; must
        be its first statement, so that what it reads next is what the last holder committed.
        """

    def write_chunks(self, conn: Connection, rows: Sequence[tuple], replace: bool) -> None:
        """Insert chunk rows (or replace them, for merges of late samples)."""

    def merge_rollup_1h(self, conn: Connection, rows: Sequence[tuple]) -> None:
        """Fold hourly partial statistics into ``rollup_1h``."""

    def prepare_partitions(self, conn: Connection, first_ms: int, last_ms: int) -> None:
        """Make sure samples between the two instants have somewhere to go."""

    def drop_minute_tier_before(self, conn: Connection, cutoff_ms: int) -> int:
        """Delete 1-minute rows (and raw chunks) older than ``cutoff_ms``."""

    def prepare_hour_partitions(self, conn: Connection, days: set[int]) -> None:
        """Make sure hour rows of these days (each a day's start, epoch ms) have somewhere
        to go (PostgreSQL only)."""

    def write_hours(self, conn: Connection, rows: Sequence[tuple]) -> None:
        """Insert or replace ``samples_hour`` rows (series_id, start_ms, minutes, data)."""

    def drop_hour_partitions_before(self, conn: Connection, cutoff_ms: int) -> int:
        """Drop whole days of ``samples_hour`` older than ``cutoff_ms`` (PostgreSQL only)."""


def _dbapi(conn: Connection):  # type: ignore[no-untyped-def]
    return conn.connection.driver_connection


class SqliteBackend:
    name = "sqlite"

    def lock_compaction(self, conn: Connection) -> None:
        # pysqlite opens a (deferred) transaction only at the first write statement, so reads
        # before it see whatever another process commits meanwhile.  Issued first, BEGIN
        # IMMEDIATE takes the database's write lock (waiting out the busy timeout for it) and
        # makes reads and writes one transaction; pysqlite's commit() ends it.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def insert_head(self, conn: Connection, rows: Sequence[HeadBatchRow]) -> None:
        cur = _dbapi(conn).cursor()
        try:
            cur.executemany(
                f"INSERT INTO samples_head_batch ({_HEAD_COLUMNS}) VALUES (?, ?, ?, ?, ?)", rows
            )
        finally:
            cur.close()

    def write_chunks(self, conn: Connection, rows: Sequence[tuple], replace: bool) -> None:
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        cur = _dbapi(conn).cursor()
        try:
            cur.executemany(
                f"{verb} INTO samples_chunk ({_CHUNK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        finally:
            cur.close()

    def merge_rollup_1h(self, conn: Connection, rows: Sequence[tuple]) -> None:
        cur = _dbapi(conn).cursor()
        try:
            cur.executemany(
                f"INSERT INTO rollup_1h ({_ROLLUP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (series_id, start_ms) DO UPDATE SET "
                "count = count + excluded.count, min = min(min, excluded.min), "
                "max = max(max, excluded.max), sum = sum + excluded.sum, "
                "last = CASE WHEN excluded.last_ms >= last_ms THEN excluded.last ELSE last END, "
                "last_ms = max(last_ms, excluded.last_ms)",
                rows,
            )
        finally:
            cur.close()

    def prepare_partitions(self, conn: Connection, first_ms: int, last_ms: int) -> None:
        return None

    def prepare_hour_partitions(self, conn: Connection, days: set[int]) -> None:
        return None

    def drop_minute_tier_before(self, conn: Connection, cutoff_ms: int) -> int:
        # The table is keyed (series_id, start_ms): a range delete per series stays indexed.
        result = conn.execute(
            text(
                "DELETE FROM samples_chunk WHERE series_id IN (SELECT id FROM series) "
                "AND start_ms < :cutoff"
            ),
            {"cutoff": cutoff_ms},
        )
        return result.rowcount or 0

    def write_hours(self, conn: Connection, rows: Sequence[tuple]) -> None:
        cur = _dbapi(conn).cursor()
        try:
            cur.executemany(
                f"INSERT OR REPLACE INTO samples_hour ({_HOUR_COLUMNS}) VALUES (?, ?, ?, ?)", rows
            )
        finally:
            cur.close()

    def drop_hour_partitions_before(self, conn: Connection, cutoff_ms: int) -> int:
        return 0


def partition_name(day_start_ms: int, table: str = "samples_chunk") -> str:
    day = dt.datetime.fromtimestamp(day_start_ms / 1000, tz=dt.UTC)
    return f"{table}_p{day:%Y%m%d}"


class PostgresBackend:
    name = "postgresql"

    def lock_compaction(self, conn: Connection) -> None:
        # READ COMMITTED: each later statement sees what the lock's last holder committed.
        conn.execute(text(COMPACTION_LOCK_SQL))

    def insert_head(self, conn: Connection, rows: Sequence[HeadBatchRow]) -> None:
        with _dbapi(conn).cursor() as cur:  # %b: the blobs go binary, not hex-escaped
            cur.executemany(
                f"INSERT INTO samples_head_batch ({_HEAD_COLUMNS}) VALUES (%s, %s, %b, %b, %b)",
                rows,
            )

    def write_chunks(self, conn: Connection, rows: Sequence[tuple], replace: bool) -> None:
        conflict = (
            "ON CONFLICT (series_id, start_ms) DO UPDATE SET count = excluded.count, "
            "min = excluded.min, max = excluded.max, sum = excluded.sum, "
            "last = excluded.last, data = excluded.data, last_ms = excluded.last_ms"
            if replace
            else ""
        )
        with _dbapi(conn).cursor() as cur:
            cur.executemany(
                f"INSERT INTO samples_chunk ({_CHUNK_COLUMNS}) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) {conflict}",
                rows,
            )

    def merge_rollup_1h(self, conn: Connection, rows: Sequence[tuple]) -> None:
        with _dbapi(conn).cursor() as cur:
            cur.executemany(
                f"INSERT INTO rollup_1h AS r ({_ROLLUP_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (series_id, start_ms) DO UPDATE SET "
                "count = r.count + excluded.count, min = LEAST(r.min, excluded.min), "
                "max = GREATEST(r.max, excluded.max), sum = r.sum + excluded.sum, "
                "last = CASE WHEN excluded.last_ms >= r.last_ms THEN excluded.last "
                "ELSE r.last END, last_ms = GREATEST(r.last_ms, excluded.last_ms)",
                rows,
            )

    def prepare_partitions(self, conn: Connection, first_ms: int, last_ms: int) -> None:
        conn.execute(text(PARTITION_LOCK_SQL))
        self._create_days(conn, first_ms, last_ms, ("samples_chunk",))

    def prepare_hour_partitions(self, conn: Connection, days: set[int]) -> None:
        # An hour's day partition is made when its first hour is re-packed, not ahead for the
        # whole retention window as the minute table's are: a young store holds no empty ones.
        # Creating one locks ``samples_hour`` against readers until the transaction ends.
        made = set(_partitions(conn, "samples_hour").values())
        if not days <= made:
            conn.execute(text(PARTITION_LOCK_SQL))
            self._create_days(conn, min(days - made), max(days - made), ("samples_hour",))

    def _create_days(
        self, conn: Connection, first_ms: int, last_ms: int, tables: Sequence[str]
    ) -> None:
        for table in tables:
            existing = set(_partitions(conn, table))
            day = first_ms - first_ms % DAY_MS
            while day <= last_ms:
                name = partition_name(day, table)
                if name not in existing:
                    conn.execute(
                        text(
                            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} "
                            f"FOR VALUES FROM ({day}) TO ({day + DAY_MS})"
                        )
                    )
                day += DAY_MS

    def drop_minute_tier_before(self, conn: Connection, cutoff_ms: int) -> int:
        dropped = _drop_days_before(conn, "samples_chunk", cutoff_ms)
        result = conn.execute(
            text("DELETE FROM samples_chunk WHERE start_ms < :cutoff"), {"cutoff": cutoff_ms}
        )
        return dropped + (result.rowcount or 0)

    def write_hours(self, conn: Connection, rows: Sequence[tuple]) -> None:
        self.prepare_hour_partitions(conn, {int(r[1]) - int(r[1]) % DAY_MS for r in rows})
        with _dbapi(conn).cursor() as cur:
            cur.executemany(
                f"INSERT INTO samples_hour ({_HOUR_COLUMNS}) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (series_id, start_ms) DO UPDATE SET minutes = excluded.minutes, "
                "data = excluded.data",
                rows,
            )

    def drop_hour_partitions_before(self, conn: Connection, cutoff_ms: int) -> int:
        return _drop_days_before(conn, "samples_hour", cutoff_ms)


def _partitions(conn: Connection, table: str) -> dict[str, int]:
    """The day partitions of ``table``, by name, with the day each starts (epoch ms)."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:table AS regclass) AND c.relname LIKE :prefix"
        ),
        {"table": table, "prefix": f"{table}_p%"},
    ).all()
    out = {}
    for (name,) in rows:
        day = dt.datetime.strptime(name[len(table) + 2 :], "%Y%m%d").replace(tzinfo=dt.UTC)
        out[name] = int(day.timestamp() * 1000)
    return out


def _drop_days_before(conn: Connection, table: str, cutoff_ms: int) -> int:
    """Drop the day partitions of ``table`` that end at or before ``cutoff_ms``."""
    dropped = 0
    for name, day in _partitions(conn, table).items():
        if day + DAY_MS <= cutoff_ms:
            conn.execute(text(f"DROP TABLE {name}"))
            dropped += 1
    return dropped


def backend_for(dialect_name: str) -> Backend:
    if dialect_name == "sqlite":
        return SqliteBackend()
    if dialect_name == "postgresql":
        return PostgresBackend()
    raise ValueError(f"unsupported database {dialect_name!r}")
