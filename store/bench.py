"""What the store's benchmark needs from SQL: the drivers' raw ceiling and bytes at rest.

The ceiling writes the very rows the store wrote, into a table of the same layout, through
the bare driver (``sqlite3`` executemany, psycopg binary COPY), so the ratio shows what the
store's own work costs.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

HeadRow = tuple[int, int, float]

_TABLES = (
    "series", "samples_head_batch", "samples_chunk", "samples_hour", "rollup_1h",
    "store_state", "devices",
)  # fmt: skip


class SqliteCeiling:
    """Plain ``sqlite3.executemany`` into a table of the head's layout, in its own file."""

    def __init__(self, path: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE samples_head (ts INTEGER NOT NULL, series_id INTEGER NOT NULL, "
            "value REAL NOT NULL, PRIMARY KEY (ts, series_id)) WITHOUT ROWID"
        )

    def write(self, rows: Sequence[HeadRow]) -> float:
        """Insert one batch; return the seconds it took."""
        started = time.perf_counter()
        self._conn.execute("BEGIN")
        self._conn.executemany("INSERT OR IGNORE INTO samples_head VALUES (?, ?, ?)", rows)
        self._conn.execute("COMMIT")
        return time.perf_counter() - started

    def close(self) -> None:
        self._conn.close()


class PostgresCeiling:
    """Plain psycopg binary COPY into a table of the head's layout."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
        self._conn.execute("DROP TABLE IF EXISTS bench_ceiling")
        self._conn.execute(
            "CREATE TABLE bench_ceiling (ts bigint NOT NULL, series_id bigint NOT NULL, "
            "value double precision NOT NULL, PRIMARY KEY (ts, series_id))"
        )
        self._conn.commit()

    def write(self, rows: Sequence[HeadRow]) -> float:
        started = time.perf_counter()
        with (
            self._conn.cursor() as cur,
            cur.copy(
                "COPY bench_ceiling (ts, series_id, value) FROM STDIN (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(["int8", "int8", "float8"])
            for row in rows:
                copy.write_row(row)
        self._conn.commit()
        return time.perf_counter() - started

    def close(self) -> None:
        self._conn.execute("DROP TABLE IF EXISTS bench_ceiling")
        self._conn.commit()
        self._conn.close()


def bytes_at_rest(engine: Engine, *, vacuum: bool = False) -> dict[str, int]:
    """Bytes each table (with its indexes) occupies.

    ``vacuum`` first rewrites PostgreSQL's tables without their dead row versions and index
    pages (compaction deletes every head row; in a running service autovacuum keeps the head
    at its working-set size for reuse), so the figure is what the data itself takes.
    """
    if vacuum and engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            tables = ("samples_head_batch", "rollup_1h", "samples_chunk", "samples_hour", "series")
            for table in tables:
                conn.execute(text(f"VACUUM FULL {table}"))
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
            try:
                rows = conn.execute(
                    text("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")
                ).all()
                sizes = {name: int(size) for name, size in rows}
            except Exception:
                page = conn.execute(text("PRAGMA page_size")).scalar_one()
                used = (
                    conn.execute(text("PRAGMA page_count")).scalar_one()
                    - conn.execute(text("PRAGMA freelist_count")).scalar_one()
                )
                return {"total": int(page * used)}
            totals = {t: 0 for t in _TABLES}
            for name, size in sizes.items():
                owner = next((t for t in _TABLES if t in name), "other")
                totals[owner] = totals.get(owner, 0) + size
            return totals
        totals = {}
        for table in _TABLES:
            totals[table] = int(
                conn.execute(
                    text(
                        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                        "WHERE c.oid = to_regclass(:t) OR c.oid IN (SELECT inhrelid FROM "
                        "pg_inherits WHERE inhparent = to_regclass(:t))"
                    ),
                    {"t": table},
                ).scalar_one()
            )
        return totals


def chunk_rows_bytes(rows: Sequence[tuple[Any, ...]], columns: int) -> int:
    """Bytes SQLite takes for ``rows`` in a table of ``samples_chunk``'s layout.

    ``columns`` 9 is the real layout (series_id, start_ms, count, min, max, sum, last, data,
    last_ms); 3 is (series_id, start_ms, data), a chunk without its minute statistics; 4 is
    ``samples_hour``'s (series_id, start_ms, minutes, data).  The codec benchmark measures
    chunk formats with this instead of migrating a store per format.
    """
    names = _CHUNK_LAYOUTS[columns]
    conn = sqlite3.connect(":memory:")
    try:
        rowid = "" if columns == 4 else " WITHOUT ROWID"  # as store/models.py declares them
        conn.execute(
            f"CREATE TABLE chunk ({', '.join(names)}, PRIMARY KEY (series_id, start_ms)){rowid}"
        )
        marks = ", ".join("?" * columns)
        conn.executemany(f"INSERT INTO chunk VALUES ({marks})", rows)
        conn.commit()
        conn.execute("VACUUM")
        (size,) = conn.execute(  # the table, and its key's index when it has rowids
            "SELECT sum(pgsize) FROM dbstat WHERE name IN ('chunk', 'sqlite_autoindex_chunk_1')"
        ).fetchone()
        return int(size)
    finally:
        conn.close()


_CHUNK_LAYOUTS = {
    9: (
        "series_id INTEGER NOT NULL",
        "start_ms INTEGER NOT NULL",
        "count INTEGER",
        "min REAL",
        "max REAL",
        "sum REAL",
        "last REAL",
        "data BLOB",
        "last_ms INTEGER",
    ),
    3: ("series_id INTEGER NOT NULL", "start_ms INTEGER NOT NULL", "data BLOB"),
    4: ("series_id INTEGER NOT NULL", "start_ms INTEGER NOT NULL", "minutes BLOB", "data BLOB"),
}
