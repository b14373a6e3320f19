"""Which process leads alerting: a PostgreSQL advisory lock held for the leader's lifetime.

The lock is session-level and held on a connection of its own, so PostgreSQL releases it
the moment that process dies (even by ``kill -9``: the server sees the socket close), and
a candidate's next ``pg_try_advisory_lock`` wins.  Its key is a hash of the schema the
store lives in, so two fleets (or two tests) in one database elect apart.  On SQLite,
which one process writes, that process simply leads.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import Connection, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from hbmwatch.store.engine import PG_CONNECT_ARGS

_KEY = "hashtextextended('hbmwatch alert leader:' || current_schema(), 0)"


class LeaderLock(Protocol):
    def try_acquire(self) -> bool:
        """Take the lock if no one holds it; True while this process holds it."""
        ...

    def held(self) -> bool:
        """Whether the lock is still ours (False once its connection is gone)."""
        ...

    def release(self) -> None: ...


class OnlyProcess:
    """SQLite: the one process that writes the store leads."""

    def try_acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return True

    def release(self) -> None:
        return None


class AdvisoryLock:
    """``pg_try_advisory_lock`` on a dedicated autocommit connection."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        args = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in parsed.query}
        self._engine = create_engine(parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT",
                                     connect_args=args)  # fmt: skip
        self._conn: Connection | None = None

    def try_acquire(self) -> bool:
        if self._conn is not None:
            return self.held()
        conn = self._engine.connect()
        try:
            won = bool(conn.execute(text(f"SELECT pg_try_advisory_lock({_KEY})")).scalar())
        except Exception:
            conn.close()
            raise
        if won:
            self._conn = conn
        else:
            conn.close()
        return won

    def held(self) -> bool:
        if self._conn is None:
            return False
        try:
            mine = self._conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid()"
            )).scalar()  # fmt: skip
        except Exception:  # the connection is gone, and the lock with it
            self._drop()
            return False
        if not mine:
            self._drop()
        return bool(mine)

    def release(self) -> None:
        """Close the connection: the lock goes with the session."""
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a dead connection closes with an error; nothing is held
                conn.invalidate()

    def close(self) -> None:
        self._drop()
        self._engine.dispose()


def leader_lock(url: str) -> LeaderLock:
    """The election for the store at ``url``."""
    if url.startswith("postgresql"):
        return AdvisoryLock(url)
    return OnlyProcess()
