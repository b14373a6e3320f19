"""Alembic environment: the same models and migrations for SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from hbmwatch.store.migrate import include_name
from hbmwatch.store.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from hbmwatch.settings import load_settings
    from hbmwatch.store.engine import create_store_engine

    engine = create_store_engine(load_settings().store.url)
    with engine.connect() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run hbmwatch migrate")
run_migrations_online()
