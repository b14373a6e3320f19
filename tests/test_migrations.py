"""Models and Alembic migrations describe the same schema, on both backends."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import current_revision, head_revision, include_name, upgrade
from hbmwatch.store.models import Base


def test_models_and_migrations_agree(store_url: str) -> None:
    engine = create_store_engine(store_url)
    try:
        assert upgrade(engine) == head_revision()
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_name": include_name, "compare_type": True}
            )
            diff = compare_metadata(context, Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_migrate_is_idempotent(store_url: str) -> None:
    engine = create_store_engine(store_url)
    try:
        upgrade(engine)
        upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
