"""A whole rack loses coolant: one incident, delivered to a real Alertmanager, end to end.

The scenario runs through the real path (simulated exporters over HTTP, scrape engine,
SQLite store, detectors) on a simulated clock that ends before the wall clock, so every
time hbmwatch sends is in Alertmanager's past; the dispatcher runs on the wall clock.  On
the way the test silences one host in hbmwatch, restarts alerting and delivery in the
middle of the incident, and checks what Alertmanager holds and what it notified.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from hbmwatch.alerts.delivery import Dispatcher
from hbmwatch.alerts.runner import Alerting
from hbmwatch.evaluation.run import run_scenario
from hbmwatch.records import AlertState, IncidentState, Matcher
from hbmwatch.runtime.detection import CycleReport
from hbmwatch.settings import AlertSettings, ReceiverSettings
from hbmwatch.simulator.scenario import scenario_from_dict
from hbmwatch.store.store import Store
from hbmwatch.validation import parse_duration
from tests.alertmanager import WebhookSink, running_alertmanager

SCENARIO = {
    "name": "rack_coolant_storm",
    "description": "Rack r0 (24 GPUs) loses coolant; rack r1 is the control",
    # A throttle closes 5 min after it last held (flap damping), then keeps firing 30 s:
    # the run goes on 8 min past the fault so every alert's resolution reaches Alertmanager.
    "duration": "19m",
    "seed": 12,
    # The run starts just before the wall clock: a flat day keeps its load independent of
    # the hour it runs at (the daily peak can throttle a rack on its power cap).
    "workload": {"diurnal_amplitude": 0.0},
    "racks": [
        {"name": "r0", "nodes": 3, "sku": "MI300X"},
        {"name": "r1", "nodes": 1, "sku": "H200"},
    ],
    "faults": [
        {"kind": "coolant_degradation", "target": {"rack": "r0"}, "onset": "8m",
         "ramp": "2m", "end": "11m"},
    ],
}  # fmt: skip
SILENCED_HOST = "r0-node1"
MAX_REQUESTS_PER_MINUTE = 10
MAX_ALERTS_PER_REQUEST = 50


class Run:
    """What happens at each detection cycle: alerting, delivery, and the test's actions."""

    def __init__(self, am_url: str, settings: AlertSettings, client: httpx.AsyncClient,
                 notified: WebhookSink) -> None:  # fmt: skip
        self.am_url, self.settings, self.client = am_url, settings, client
        self.notified = notified
        self.known_before_silence: set[tuple[tuple[str, str], ...]] = set()
        self.after_silence: list[dict[str, Any]] = []
        self.alerting: Alerting | None = None
        self.dispatcher: Dispatcher | None = None
        self.firing_seen: list[dict[str, Any]] = []
        self.silence_id: str | None = None
        self.restarted = False
        self.cycles = 0
        self.incidents: list[Any] = []
        self.alerts: list[Any] = []
        self.rows: dict[str, Any] = {}
        self.end_ms = 0

    def start(self, store: Store) -> None:
        """A fresh process's alerting and delivery over the same store."""
        self.alerting = Alerting(store, self.settings)
        self.alerting.start()
        self.dispatcher = Dispatcher(store.alerts, self.settings, time.time, client=self.client)

    async def __call__(self, store: Store, report: CycleReport) -> None:
        if self.alerting is None:
            self.start(store)
        assert self.alerting is not None and self.dispatcher is not None
        self.cycles += 1
        self.alerting.process(report.findings)
        await self.dispatcher.tick()
        in_am = [a for a in await self.am_alerts() if a["labels"].get("rack") == "r0"]
        rack_in_am = any(a["labels"]["alertname"] == "HBMRackThermalExcursion" for a in in_am)
        if self.silence_id is None:  # maintenance on one host of the rack, before the fault
            silence = self.alerting.add_silence(
                [Matcher("host", SILENCED_HOST)], starts_ms=None,
                ends_ms=store.now_ms() + 36_000_000, created_by="oncall", comment="swap",
            )  # fmt: skip
            self.silence_id = silence.id
            await self.dispatcher.tick()  # mirrors the silence into Alertmanager
            # Alerts Alertmanager had before the silence may have notifications in flight.
            self.known_before_silence = {_key(a) for a in await self.am_alerts()}
        elif self.silence_id:
            self.after_silence += [a for a in in_am if a["labels"].get("host") == SILENCED_HOST
                                   and _key(a) not in self.known_before_silence]  # fmt: skip
        if rack_in_am and not self.firing_seen:
            self.firing_seen = in_am
        elif self.firing_seen and self.after_silence and not self.restarted:
            self.restarted = True  # mid-incident: a new process takes over from the store
            self.start(store)
        if store.now_ms() >= self.end_ms - 1000:  # the last cycle: delivery finishes
            deadline = time.monotonic() + 75  # at most one rate-limit window
            while self.owed(store) and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                await self.dispatcher.tick()
        self.incidents = store.alerts.incidents()
        self.alerts = store.alerts.alerts(limit=5000)
        self.rows = store.alerts.deliveries("am")

    def owed(self, store: Store) -> list[str]:
        rows = store.alerts.deliveries("am")
        return [a.id for a in store.alerts.deliverable(0)
                if a.state is AlertState.RESOLVED and rows.get(a.id)
                and rows[a.id].sent_state == "firing"]  # fmt: skip

    async def am_alerts(self) -> list[dict[str, Any]]:
        r = await self.client.get(f"{self.am_url}/api/v2/alerts")
        r.raise_for_status()
        return r.json()


@pytest.mark.slow
def test_rack_coolant_fault_is_one_incident_in_alertmanager(tmp_path: Path) -> None:
    requests: list[float] = []

    async def count(request: httpx.Request) -> None:
        if request.url.path == "/api/v2/alerts" and request.method == "POST":
            requests.append(time.monotonic())

    with WebhookSink() as notified, running_alertmanager(tmp_path, notified.url) as am:
        settings = AlertSettings(
            external_url="http://hbmwatch.test:8427",
            keep_firing_seconds=30,
            resolved_resend_seconds=3600,
            receivers=[ReceiverSettings(
                name="am", kind="alertmanager", url=am.url,
                max_requests_per_minute=MAX_REQUESTS_PER_MINUTE,
                max_alerts_per_request=MAX_ALERTS_PER_REQUEST,
            )],
        )  # fmt: skip

        async def main() -> tuple[Run, Any]:
            async with httpx.AsyncClient(event_hooks={"request": [count]}) as client:
                run = Run(am.url, settings, client, notified)
                duration = parse_duration(SCENARIO["duration"])
                start = time.time() - duration - 120
                run.end_ms = int((start + duration) * 1000)
                result = await run_scenario(scenario_from_dict(SCENARIO), start_unix=start,
                                            on_cycle=run, workdir=tmp_path)  # fmt: skip
                return run, result

        run, _ = asyncio.run(main())
        check_alertmanager_saw_the_incident(run)
        check_resolution_reached_alertmanager(run, am, notified)

    # One incident for the rack, opened once, resolved after the restart.
    assert run.restarted
    # Nothing on the control rack is blamed on heat.
    incidents = [i for i in run.incidents if i.scope.get("rack") == "r0"]
    assert len(incidents) == 1, [i.title for i in run.incidents]
    (inc,) = incidents
    control = {a.labels["alertname"] for a in run.alerts if a.labels.get("rack") == "r1"}
    assert not control & {"HBMThermalExcursion", "HBMRackThermalExcursion"}
    assert dict(inc.scope) == {"cluster": "c0", "rack": "r0"}
    assert inc.state is IncidentState.RESOLVED
    assert [e.kind for e in inc.timeline].count("opened") == 1
    # The storm stayed within the receiver's limits.
    for i, t in enumerate(requests):
        assert sum(1 for u in requests[i:] if u - t < 60) <= MAX_REQUESTS_PER_MINUTE


def check_alertmanager_saw_the_incident(run: Run) -> None:
    names = Counter(a["labels"]["alertname"] for a in run.firing_seen)
    assert names["HBMRackThermalExcursion"] == 1
    rack = next(a for a in run.firing_seen if a["labels"]["alertname"].startswith("HBMRack"))
    # GPU thermal alerts that fired after the rack's were inhibited by it: never sent.
    rack_fired = min(a.firing_ms for a in run.alerts
                     if a.labels["alertname"] == "HBMRackThermalExcursion")  # fmt: skip
    later = [a for a in run.alerts if a.labels["alertname"] == "HBMThermalExcursion"
             and a.firing_ms > rack_fired and a.labels["rack"] == "r0"]  # fmt: skip
    assert later and all(run.rows.get(a.id) is None for a in later)
    (r0,) = [i for i in run.incidents if i.scope.get("rack") == "r0"]
    assert rack["labels"]["incident"] == r0.id  # one Alertmanager group per incident
    assert {k: rack["labels"][k] for k in ("cluster", "rack", "kind", "scope")} == {
        "cluster": "c0", "rack": "r0", "kind": "thermal_excursion", "scope": "rack"}  # fmt: skip
    assert rack["labels"]["severity"] in ("warning", "critical")
    ann = rack["annotations"]
    assert "rack r0" in ann["summary"] and ann["runbook"].startswith("The whole rack warms")
    assert ann["incident_url"].startswith("http://hbmwatch.test:8427/incidents/inc-")
    assert rack["generatorURL"] == ann["incident_url"]
    # The hbmwatch silence reached Alertmanager and muted that host's alerts there.
    # Alerts of the silenced host that reached Alertmanager after the hbmwatch silence were
    # muted there by its mirror.
    assert run.after_silence, "no alert of the silenced host came after the silence"
    assert all(a["status"]["state"] == "suppressed" for a in run.after_silence)
    assert all(a["status"]["silencedBy"] for a in run.after_silence)


def check_resolution_reached_alertmanager(run: Run, am: Any, notified: WebhookSink) -> None:
    assert not [a for a in am.alerts() if a["labels"].get("rack") == "r0"]

    def rack() -> list[str]:
        return [a["status"] for body in notified.bodies() for a in body["alerts"]
                if a["labels"]["alertname"] == "HBMRackThermalExcursion"]  # fmt: skip

    notified.wait_for(lambda _: "resolved" in rack(), timeout=15)  # Alertmanager notifies
    assert rack()[0] == "firing" and rack()[-1] == "resolved"
    # Alertmanager notified none of the silenced host's alerts that came after the silence.
    after = {_key(a) for a in run.after_silence}
    notified_keys = {_key(a) for body in notified.bodies() for a in body["alerts"]}
    assert not after & notified_keys


def _key(alert: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(alert["labels"].items()))
