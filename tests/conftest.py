"""Shared fixtures: real backends (SQLite file, PostgreSQL from .ci), a store with a clock.

PostgreSQL comes from ``HBMWATCH_TEST_PG_URL`` (``.ci/run`` starts one).  Without it the
PostgreSQL cases skip, unless ``HBMWATCH_REQUIRE_SERVICES=1``, when they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from hbmwatch.settings import StoreSettings
from store.engine import create_store_engine
from store.migrate import upgrade
from store.store import Store, open_store

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO.parent / "shared" / "fixtures"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z, minute-aligned


def require_service(env: str, what: str) -> str:
    value = os.environ.get(env)
    if value:
        return value
    message = f"{what} not available: set {env} (.ci/run starts one)"
    if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures missing at {FIXTURES}")
    return FIXTURES


class Clock:
    """A settable clock for the store: tests move time instead of sleeping."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pg_url() -> str:
    return require_service("HBMWATCH_TEST_PG_URL", "PostgreSQL")


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    """A private schema on the test server, dropped afterwards."""
    from sqlalchemy.engine import make_url

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_store_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    return request.getfixturevalue("pg_schema_url")


def make_store(url: str, clock: Clock, **settings: object) -> Store:
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    return open_store(StoreSettings(url=url, **settings), clock=clock)  # type: ignore[arg-type]


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[Store]:
    s = make_store(store_url, clock)
    yield s
    s.close()
