"""Schemathesis against the OpenAPI schema: no 5xx, and every response matches its schema.

Generated requests go through the real app over a real SQLite store holding devices, series,
an open and a resolved incident, and a silence, so the handlers reach their data paths, not
only their validation (incident ids are the stored ones in two cases of three).  Requests
carry an admin token, so writes reach the store too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis import checks

from hbmwatch.api.main import create_app
from hbmwatch.records import Matcher
from hbmwatch.settings import Settings
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from tests.conftest import Clock, make_store
from tests.test_alerting import stated
from tests.test_alerts_engine import gpu
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
    alerting, resolved = open_incident(store, clock)
    alerting.resolve(resolved, "ci")
    alerting.process([stated(clock, FindingKind.THROTTLE, gpu("r1", "n5", 0))])
    (opened,) = [i.id for i in store.alerts.incidents() if i.id != resolved]
    store.schema_incidents = (resolved, opened)  # type: ignore[attr-defined]
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


#: Generated requests per operation; HBMWATCH_SCHEMATHESIS_EXAMPLES=300 for a deeper run.
EXAMPLES = int(os.environ.get("HBMWATCH_SCHEMATHESIS_EXAMPLES", "60"))


@pytest.mark.parametrize(("path", "method"), operations())
def test_api_conforms_to_its_schema(
    api_schema: schemathesis.BaseSchema, api_store: Store, path: str, method: str
) -> None:
    operation = api_schema[path][method]
    incidents = api_store.schema_incidents  # type: ignore[attr-defined]

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        derandomize=True,
        database=None,
    )
    def conforms(case: schemathesis.Case) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN}"}
        params = case.path_parameters or {}
        if "incident_id" in params and (pick := len(params["incident_id"]) % 3):
            params["incident_id"] = incidents[pick - 1]  # acknowledging a resolved one: 409
        case.call_and_validate(checks=CHECKS)

    conforms()
