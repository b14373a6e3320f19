"""Schemathesis against the OpenAPI schema: no 5xx, and every response matches its schema.

Generated requests go through the real app over a real SQLite store holding devices, series,
an incident with alerts, and a silence, so the handlers reach their data paths, not only
their validation.  Requests carry an admin token, so writes reach the store too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis import checks

from api.main import create_app
from hbmwatch.records import Matcher
from hbmwatch.settings import Settings
from store.store import Store
from tests.conftest import Clock, make_store
from tests.test_api import ADMIN, fill, open_incident, settings_for

CHECKS = (
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
)


@pytest.fixture(scope="module")
def api_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path: Path = tmp_path_factory.mktemp("schema") / "hbmwatch.db"
    clock = Clock()
    store = make_store(f"sqlite:///{path}", clock)
    fill(store, clock, minutes=3)
    alerting, _ = open_incident(store, clock)
    ends_ms = int(clock() * 1000) + 3_600_000
    alerting.add_silence(
        [Matcher("gpu", "1")], starts_ms=None, ends_ms=ends_ms, created_by="ci", comment="schema"
    )
    yield store
    store.close()


def operations() -> list[tuple[str, str]]:
    """Every (path, method) in the schema; the schema needs no store to be built."""
    spec = create_app(Settings(), None).openapi()  # type: ignore[arg-type]
    return [(path, method) for path, item in spec["paths"].items() for method in item]


@pytest.fixture(scope="module")
def api_schema(api_store: Store) -> schemathesis.BaseSchema:
    app = create_app(settings_for(api_store), api_store)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize(("path", "method"), operations())
def test_api_conforms_to_its_schema(
    api_schema: schemathesis.BaseSchema, path: str, method: str
) -> None:
    operation = api_schema[path][method]

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        derandomize=True,
        database=None,
    )
    def conforms(case: schemathesis.Case) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN}"}
        case.call_and_validate(checks=CHECKS)

    conforms()
