"""Engines for the two backends, with the connection settings each needs."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from hbmwatch.validation import ConfigError

SQLITE_CACHE_KIB = 128 * 1024
#: PostgreSQL: how long a connection attempt may take, and how long a dead peer may keep a
#: call waiting (keepalives, TCP_USER_TIMEOUT), so no thread waits on a gone server forever.
PG_CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
#: The longest one statement may run (compaction and retention included) before it is
#: cancelled and the call fails as "store unavailable".
PG_STATEMENT_TIMEOUT_SECONDS = 300
#: How long a caller waits for a pooled connection before the store counts as unavailable.
POOL_TIMEOUT_SECONDS = 10


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    database = make_url(url).database
    return Path(database) if database and database != ":memory:" else None


def create_store_engine(
    url: str, *, synchronous: str = "NORMAL", busy_timeout_seconds: float = 60.0
) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and a larger page cache."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # No mkdir of the file's folder: a typo in store.url must fail, not grow a tree.
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_seconds},
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
            cur.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cur.execute("PRAGMA temp_store=MEMORY")
            cur.close()

        return engine
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "postgresql+psycopg" and importlib.util.find_spec("psycopg") is None:
        raise ConfigError("store.url: PostgreSQL needs psycopg: pip install 'hbmwatch[postgres]'")
    connect_args = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in parsed.query}
    engine = create_engine(
        parsed,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=10,
        pool_timeout=POOL_TIMEOUT_SECONDS,
        connect_args=connect_args,
    )

    @event.listens_for(engine, "connect")
    def _timeouts(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        dbapi_conn.execute(f"SET statement_timeout = {PG_STATEMENT_TIMEOUT_SECONDS * 1000}")
        dbapi_conn.autocommit = autocommit

    return engine


@contextmanager
def read_snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection whose statements all see one committed state of the store.

    Why: a query reads the head, the minute chunks and the hour chunks in several
    statements, and compaction (in this process or another) moves a minute from one to the
    next in one transaction; read between its commit, a minute would be missed or counted
    twice.  SQLite (WAL) holds the snapshot of a read transaction's first read until it
    ends; PostgreSQL's REPEATABLE READ one transaction snapshot.  Rolled back on leaving.
    """
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN")  # pysqlite itself begins only before a write
        else:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        try:
            yield conn
        finally:
            conn.rollback()
