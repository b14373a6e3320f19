"""Schema migrations: ``hbmwatch migrate`` runs Alembic's upgrade to head in-process."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from hbmwatch.resources import data_dir

_PARTITION = re.compile(r"^samples_(chunk|hour)_(p\d{8}|default)$")


def include_name(name: str | None, type_: str, parent_names: dict) -> bool:  # type: ignore[type-arg]
    """Leave PostgreSQL's day partitions out of model/migration comparisons."""
    return not (type_ == "table" and name is not None and _PARTITION.match(name))


def script_location() -> Path:
    """The Alembic scripts: package data of a wheel, or ``alembic/`` of a checkout."""
    return data_dir("migrations")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Migrate the database to ``revision``; return the revision it is at afterwards."""
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return current_revision(engine)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@functools.cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
