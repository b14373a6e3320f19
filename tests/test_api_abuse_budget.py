"""Every query has a budget (series, points, time); over it the answer is a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from hbmwatch.api.main import create_app
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_api import TEMP, fill, settings_for


@pytest.fixture
def small_store(store_url: str, clock: Clock) -> Iterator[Store]:
    s = make_store(store_url, clock, max_series_per_query=1, max_points_per_query=1000)
    yield s
    s.close()


def over_budget(response, limit: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "query_too_expensive" and limit in error["message"]
    assert error["detail"]["limit"] == limit


def test_series_and_points_budgets_name_their_limit(small_store: Store, clock: Clock) -> None:
    fill(small_store, clock, minutes=2)
    window = {"start": clock() - 120, "end": clock()}
    with TestClient(create_app(settings_for(small_store), small_store)) as client:
        both = client.get("/api/v1/query_range", params={"query": TEMP, **window, "step": 60})
        over_budget(both, "store.max_series_per_query")
        one = {"query": f"{TEMP}{{gpu=1}}", **window}
        over_budget(client.get("/api/v1/query_range", params={**one, "step": 0.1}),
                    "store.max_points_per_query")  # fmt: skip
        over_budget(client.get("/api/v1/query", params={"query": TEMP}),
                    "store.max_series_per_query")  # fmt: skip
        assert client.get("/api/v1/query_range", params={**one, "step": 1}).status_code == 200


def test_a_query_past_its_time_budget_is_a_400_naming_it(store: Store, clock: Clock) -> None:
    fill(store, clock, minutes=2)
    app = create_app(settings_for(store, query_timeout_seconds=1e-9), store)
    with TestClient(app) as client:
        params = {"query": TEMP, "start": clock() - 120, "end": clock(), "step": 1}
        over_budget(client.get("/api/v1/query_range", params=params),
                    "api.query_timeout_seconds")  # fmt: skip
        over_budget(client.get("/api/v1/series", params={"match": TEMP}),
                    "api.query_timeout_seconds")  # fmt: skip
        over_budget(client.get("/api/v1/query", params={"query": TEMP}),
                    "api.query_timeout_seconds")  # fmt: skip
