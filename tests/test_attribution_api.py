"""The API names workloads: incidents filtered by namespace/pod/job, devices with what runs
on them now, and bad filter values answered with a 400 and the reason."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hbmwatch.records import Device
from hbmwatch.store.store import Store
from tests.conftest import Clock
from tests.test_api import client, open_incident
from tests.test_attribution_alerts import _attribute

__all__ = ["client"]  # the fixture, used by name


def test_incidents_filter_by_workload(client: TestClient, store: Store, clock: Clock) -> None:
    _attribute(store, clock)
    _, incident_id = open_incident(store, clock)
    get = client.get
    (listed,) = get("/api/v1/incidents", params={"pod": "llama-7b-5d9f"}).json()["items"]
    assert listed["id"] == incident_id
    assert {(w["namespace"], w["pod"], w["container"], w["job"], w["gpu"])
            for w in listed["workloads"]} == {("ml", "llama-7b-5d9f", "vllm", "", "0"),
                                              ("", "", "", "4242", "1")}  # fmt: skip
    for params in ({"job": "4242"}, {"namespace": "ml", "container": "vllm"}):
        assert [i["id"] for i in get("/api/v1/incidents", params=params).json()["items"]] == [
            incident_id
        ]
    for params in ({"pod": "elsewhere"}, {"namespace": "ml", "job": "4242"}):
        assert get("/api/v1/incidents", params=params).json()["items"] == []
    detail = get(f"/api/v1/incidents/{incident_id}").json()
    assert len(detail["workloads"]) == 2


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"pod": "Bad Pod"}, "pod: 'Bad Pod' is not a Kubernetes pod name"),
        ({"namespace": "x" * 64}, "is not a Kubernetes namespace"),
        ({"job": "42;drop"}, "job: '42;drop' is not a job id"),
        ({"container": ""}, "container: '' is not a Kubernetes container name"),
        ({"pod": "p" * 10_000}, "is not a Kubernetes pod name"),
    ],
)
def test_bad_workload_filters_are_a_400_with_the_reason(
    client: TestClient, params: dict[str, str], says: str
) -> None:
    r = client.get("/api/v1/incidents", params=params)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_devices_show_what_runs_on_them_now(client: TestClient, store: Store, clock: Clock) -> None:
    _attribute(store, clock)
    store.upsert_devices([Device(host="n1", gpu=g, cluster="c0", rack="r0") for g in "012"])
    items = client.get("/api/v1/devices", params={"host": "n1"}).json()["items"]
    runs = {d["gpu"]: [(w["pod"], w["job"]) for w in d["workloads"]] for d in items}
    assert runs == {"0": [("llama-7b-5d9f", "")], "1": [("", "4242")], "2": []}
    clock.advance(600)  # nothing written since: nothing runs now
    items = client.get("/api/v1/devices", params={"host": "n1"}).json()["items"]
    assert all(d["workloads"] == [] for d in items)


def test_the_incident_page_names_the_workloads(store: Store, clock: Clock) -> None:
    from hbmwatch.api.main import create_app
    from tests.test_api import settings_for

    _attribute(store, clock)
    _, incident_id = open_incident(store, clock)
    html = TestClient(create_app(settings_for(store), store)).get(f"/incidents/{incident_id}").text
    section = html.split('id="workloads"')[1].split("</section>")[0]
    assert "n1 GPU 0" in section and "ml/llama-7b-5d9f" in section and "vllm" in section
    assert "n1 GPU 1" in section and "4242" in section


def test_an_incident_page_without_workloads_has_no_such_section(store: Store, clock: Clock) -> None:
    from hbmwatch.api.main import create_app
    from tests.test_api import settings_for

    _, incident_id = open_incident(store, clock)
    html = TestClient(create_app(settings_for(store), store)).get(f"/incidents/{incident_id}").text
    assert 'id="workloads"' not in html and 'id="alerts"' in html
