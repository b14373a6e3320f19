"""Alert delivery against a real Alertmanager and a recording webhook (tests/alertmanager.py).

A fake clock drives the dispatcher, so backoff, re-send and rate-limit waits are crossed by
moving time; the only real waiting is for Alertmanager itself to act (bounded polls).  The
clock starts at the wall clock where a real Alertmanager judges ``endsAt`` against its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import CollectorRegistry

from hbmwatch.alerts.delivery import (
    SINCE_STATE,
    WEBHOOK_REPEAT_SECONDS,
    ZERO_TIME,
    Dispatcher,
    alertmanager_alerts,
    rfc3339,
    silence_body,
    webhook_payload,
)
from hbmwatch.records import Alert, AlertState, Delivery, Matcher, Severity, Silence
from hbmwatch.settings import AlertSettings, ReceiverSettings
from tests.alertmanager import Alertmanager, WebhookSink, free_port, running_alertmanager
from tests.conftest import NOW, Clock

EXTERNAL = "http://hbmwatch.test:8427"
WEBHOOK_KEYS = {
    "version",
    "groupKey",
    "truncatedAlerts",
    "status",
    "receiver",
    "groupLabels",
    "commonLabels",
    "commonAnnotations",
    "externalURL",
    "alerts",
}
WEBHOOK_ALERT_KEYS = {
    "status",
    "labels",
    "annotations",
    "startsAt",
    "endsAt",
    "generatorURL",
    "fingerprint",
}


class MemoryBook:
    """A DeliveryBook in dicts; state goes through JSON, as the store keeps it."""

    def __init__(self) -> None:
        self.alerts: dict[str, Alert] = {}
        self.rows: dict[tuple[str, str], Delivery] = {}
        self.silence_rows: dict[str, Silence] = {}
        self.state: dict[str, str] = {}

    def add(self, *alerts: Alert) -> None:
        for a in alerts:
            self.alerts[a.id] = a

    def resolve(self, alert_id: str, at_ms: int) -> None:
        a = self.alerts[alert_id]
        self.alerts[alert_id] = replace(
            a, state=AlertState.RESOLVED, resolved_ms=at_ms, updated_ms=at_ms
        )

    def row(self, receiver: str, alert_id: str) -> Delivery:
        return self.rows.get((receiver, alert_id)) or Delivery(receiver, alert_id)

    def deliverable(self, since_ms: int) -> list[Alert]:
        return [
            a
            for a in self.alerts.values()
            if a.state is AlertState.FIRING
            or (a.state is AlertState.RESOLVED and (a.resolved_ms or 0) >= since_ms)
        ]

    def deliveries(self, receiver: str) -> dict[str, Delivery]:
        return {aid: d for (r, aid), d in self.rows.items() if r == receiver}

    def save_deliveries(self, rows: Iterable[Delivery]) -> None:
        for d in rows:
            self.rows[(d.receiver, d.alert_id)] = d

    def silences(self) -> list[Silence]:
        return list(self.silence_rows.values())

    def get_state(self, name: str) -> Any:
        raw = self.state.get(name)
        return None if raw is None else json.loads(raw)

    def put_state(self, name: str, value: Any) -> None:
        self.state[name] = json.dumps(value)


def make_alert(
    key: str,
    at_ms: int,
    *,
    incident: str | None = "inc-1",
    alertname: str = "HBMThermalExcursion",
    rack: str = "r1",
    host: str = "h1",
    **extra: Any,
) -> Alert:
    """A firing GPU alert as the engine makes one; ``extra`` overrides Alert fields."""
    labels = {
        "alertname": alertname,
        "severity": "warning",
        "kind": "hbm_thermal",
        "scope": "gpu",
        "cluster": "c1",
        "rack": rack,
        "host": host,
        "gpu": key,
        "sku": "MI300X",
    }
    annotations = {
        "summary": f"HBM temperature excursion on {key}",
        "description": "HBM 12 C above its rack baseline",
        "runbook": "https://runbooks.test/hbm-thermal",
        "top_cause": "",
        "incident_url": f"{EXTERNAL}/incidents/{incident}" if incident else "",
    }
    fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    fields: dict[str, Any] = {
        "id": f"a-{key}",
        "fingerprint": fingerprint,
        "labels": labels,
        "annotations": annotations,
        "state": AlertState.FIRING,
        "severity": Severity.WARNING,
        "finding_id": f"f-{key}",
        "started_ms": at_ms - 30_000,
        "updated_ms": at_ms,
        "firing_ms": at_ms,
        "incident_id": incident,
    }
    return Alert(**(fields | extra))


def am_receiver(url: str, **kw: Any) -> ReceiverSettings:
    return ReceiverSettings(name="am", kind="alertmanager", url=url, **kw)


def hook_receiver(url: str, **kw: Any) -> ReceiverSettings:
    return ReceiverSettings(name="hook", kind="webhook", url=url, **kw)


def settings_for(*receivers: ReceiverSettings, **kw: Any) -> AlertSettings:
    return AlertSettings(receivers=list(receivers), external_url=EXTERNAL, **kw)


def ms_of(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def now_ms(clock: Clock) -> int:
    return int(clock() * 1000)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def recording_client(bodies: list[Any]) -> httpx.AsyncClient:
    """A client that notes each request's JSON body: an independent count of requests."""

    async def note(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content) if request.content else None)

    return httpx.AsyncClient(event_hooks={"request": [note]})


def poll(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Wait for Alertmanager to act: ``check()`` truthy, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "Alertmanager did not act in time"
        time.sleep(0.05)


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    with WebhookSink() as s:
        yield s


@pytest.fixture
def am(tmp_path: Path, sink: WebhookSink) -> Iterator[Alertmanager]:
    with running_alertmanager(tmp_path, f"{sink.url}/am") as a:
        yield a


@pytest.fixture
def wall_clock() -> Clock:
    return Clock(float(int(time.time())))


# --- payload builders ---------------------------------------------------------------------


def test_alertmanager_alerts_times_and_links() -> None:
    now = int(NOW * 1000)
    firing = make_alert("g0", now - 5_000)
    no_incident = make_alert("g1", now, incident=None, firing_ms=None)
    resolved = replace(firing, id="a-r", state=AlertState.RESOLVED, resolved_ms=now - 1_000)

    out = alertmanager_alerts(
        [firing, no_incident, resolved], now, valid_for_ms=240_000, external_url=EXTERNAL + "/"
    )

    assert rfc3339(now - 5_000) == "2027-01-15T07:59:55.000Z"
    assert out[0]["startsAt"] == "2027-01-15T07:59:55.000Z"
    assert ms_of(out[0]["endsAt"]) == now + 240_000  # four re-sends ahead, as Prometheus
    assert out[0]["generatorURL"] == f"{EXTERNAL}/incidents/inc-1"
    assert out[0]["labels"] == dict(firing.labels)
    assert "top_cause" not in out[0]["annotations"]  # empty values dropped
    assert out[0]["annotations"]["runbook"] == "https://runbooks.test/hbm-thermal"
    assert ms_of(out[1]["startsAt"]) == no_incident.started_ms  # never fired: its start
    assert out[1]["generatorURL"] == f"{EXTERNAL}/api/v1/alerts/a-g1"
    assert "incident_url" not in out[1]["annotations"]
    assert out[2]["endsAt"] == rfc3339(now - 1_000)  # resolved: when it resolved
    assert set(out[0]) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}


def test_webhook_payload_fields() -> None:
    now = int(NOW * 1000)
    a = make_alert("g0", now)
    b = make_alert("g1", now, host="h2", state=AlertState.RESOLVED, resolved_ms=now)

    body = webhook_payload("hook", "inc-1", [a, b], now + 1, external_url=EXTERNAL)

    assert set(body) == WEBHOOK_KEYS
    assert body["version"] == "4" and body["groupKey"] == "inc-1"
    assert body["status"] == "firing" and body["receiver"] == "hook"
    assert body["truncatedAlerts"] == 0 and body["externalURL"] == EXTERNAL
    assert body["groupLabels"] == {"cluster": "c1", "rack": "r1"}  # hosts differ
    assert body["commonLabels"]["alertname"] == "HBMThermalExcursion"
    assert "gpu" not in body["commonLabels"] and "host" not in body["commonLabels"]
    assert "summary" not in body["commonAnnotations"]
    assert body["commonAnnotations"]["runbook"] == "https://runbooks.test/hbm-thermal"
    first, second = body["alerts"]
    assert set(first) == WEBHOOK_ALERT_KEYS
    assert first["status"] == "firing" and first["endsAt"] == ZERO_TIME
    assert first["fingerprint"] == a.fingerprint
    assert second["status"] == "resolved" and second["endsAt"] == rfc3339(now)
    resolved_only = webhook_payload("hook", "k", [b], now, external_url=EXTERNAL)
    assert resolved_only["status"] == "resolved"


def test_silence_body_matchers() -> None:
    s = Silence(
        "s1",
        (Matcher("rack", "r1"), Matcher("gpu", "g.*", "=~"), Matcher("severity", "info", "!=")),
        1_000,
        2_000,
        "",
        "",
    )
    body = silence_body(s)
    assert [(m["isRegex"], m["isEqual"]) for m in body["matchers"]] == [
        (False, True),
        (True, True),
        (False, False),
    ]
    assert body["createdBy"] == "hbmwatch" and "s1" in body["comment"]


# --- Alertmanager -------------------------------------------------------------------------


def test_firing_alerts_reach_alertmanager(
    am: Alertmanager, sink: WebhookSink, wall_clock: Clock
) -> None:
    now = now_ms(wall_clock)
    book = MemoryBook()
    shown, loose = make_alert("g0", now - 10_000), make_alert("g1", now, incident=None)
    inhibited = make_alert("g2", now, inhibited_by=("rackfp",))
    book.add(shown, loose, inhibited)
    registry = CollectorRegistry()
    settings = settings_for(am_receiver(am.url, bearer_token="am-token"))

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, wall_clock, registry=registry)
        report = await dispatcher.tick()
        assert sorted(report.sent) == [("am", "a-g0"), ("am", "a-g1")]
        assert report.requests == 1
        assert (await dispatcher.tick()).requests == 0  # not due again yet
        wall_clock.advance(settings.resend_seconds)
        assert sorted((await dispatcher.tick()).sent) == [("am", "a-g0"), ("am", "a-g1")]
        await dispatcher.aclose()

    run(scenario)
    got = {a["labels"]["gpu"]: a for a in am.alerts()}
    assert set(got) == {"g0", "g1"}  # the inhibited one is not sent
    assert got["g0"]["labels"] == dict(shown.labels)
    assert got["g0"]["annotations"] == {k: v for k, v in shown.annotations.items() if v}
    assert got["g0"]["generatorURL"] == f"{EXTERNAL}/incidents/inc-1"
    assert got["g1"]["generatorURL"] == f"{EXTERNAL}/api/v1/alerts/a-g1"
    assert ms_of(got["g0"]["startsAt"]) == now - 10_000
    assert ms_of(got["g0"]["endsAt"]) == now_ms(wall_clock) + 4 * 60_000
    assert got["g0"]["status"]["state"] == "active"
    row = book.row("am", "a-g0")
    assert (row.sent_state, row.sent_ms, row.attempts) == ("firing", now_ms(wall_clock), 0)
    sample = registry.get_sample_value
    assert sample("hbmwatch_alert_notifications_total", {"receiver": "am", "outcome": "sent"}) == 2
    sink.wait_for(lambda rs: len(rs) >= 2)  # Alertmanager notified its own receiver


def test_resolution_reaches_alertmanager(
    am: Alertmanager, sink: WebhookSink, wall_clock: Clock
) -> None:
    book = MemoryBook()
    alert = make_alert("g0", now_ms(wall_clock) - 10_000)
    book.add(alert)
    settings = settings_for(am_receiver(am.url))

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, wall_clock)
        await dispatcher.tick()
        await asyncio.to_thread(sink.wait_for, lambda rs: len(rs) == 1)  # firing notified
        resolved_ms = min(int(time.time() * 1000), now_ms(wall_clock)) + 1
        book.resolve(alert.id, resolved_ms)
        wall_clock.advance(1)
        assert (await dispatcher.tick()).sent == [("am", alert.id)]
        wall_clock.advance(1)
        assert (await dispatcher.tick()).requests == 0  # accepted: not sent again
        await dispatcher.aclose()

    run(scenario)
    assert am.alerts() == []
    notes = sink.wait_for(lambda rs: any(r.body["status"] == "resolved" for r in rs))
    resolved = next(r.body for r in notes if r.body["status"] == "resolved")
    entry = resolved["alerts"][0]
    assert entry["labels"] == dict(alert.labels)
    assert ms_of(entry["endsAt"]) == book.alerts[alert.id].resolved_ms
    assert book.row("am", alert.id).sent_state == "resolved"
    # Our webhook payload has exactly the fields Alertmanager's own has, with equal values.
    ours = webhook_payload("sink", "k", [book.alerts[alert.id]], 0, external_url=EXTERNAL)
    assert set(ours) == set(resolved) == WEBHOOK_KEYS
    assert set(ours["alerts"][0]) == set(entry) == WEBHOOK_ALERT_KEYS
    mine = ours["alerts"][0]
    for key in ("status", "labels", "annotations", "generatorURL"):
        assert mine[key] == entry[key], key
    for key in ("startsAt", "endsAt"):
        assert ms_of(mine[key]) == ms_of(entry[key]), key
    assert ours["commonLabels"] == resolved["commonLabels"]
    assert ours["commonAnnotations"] == resolved["commonAnnotations"]


def test_silence_mirrored_then_expired_early(am: Alertmanager, wall_clock: Clock) -> None:
    now = now_ms(wall_clock)
    book = MemoryBook()
    silence = Silence(
        "hs-1",
        (Matcher("rack", "r1"), Matcher("gpu", "g[0-9]+", "=~")),
        now - 60_000,
        now + 3_600_000,
        "ops@example.test",
        "rack r1 maintenance",
    )
    book.silence_rows[silence.id] = silence
    book.add(make_alert("g0", now, silenced_by=(silence.id,)))
    settings = settings_for(am_receiver(am.url))
    key = "delivery:am:silences"

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, wall_clock)
        report = await dispatcher.tick()
        assert report.silences_mirrored == [("am", "hs-1")]
        assert report.sent == [("am", "a-g0")]  # silenced, still sent: the mirror mutes it
        am_id = book.get_state(key)["hs-1"]["id"]
        [got] = am.alerts()
        assert got["status"]["state"] == "suppressed"
        assert got["status"]["silencedBy"] == [am_id]
        assert (await dispatcher.tick()).requests == 0  # mirrored once
        # Expired early in hbmwatch: its Alertmanager twin is expired too.
        book.silence_rows[silence.id] = replace(silence, ends_ms=now_ms(wall_clock))
        wall_clock.advance(1)
        report = await dispatcher.tick()
        assert report.silences_expired == [("am", "hs-1")]
        assert am.silence(am_id)["status"]["state"] == "expired"
        assert book.get_state(key) == {}
        assert am.alerts()[0]["status"]["state"] == "active"
        await dispatcher.aclose()

    run(scenario)


def test_silenced_alerts_not_sent_without_mirroring(sink: WebhookSink) -> None:
    now = int(NOW * 1000)
    book = MemoryBook()
    book.add(make_alert("g0", now), make_alert("g1", now, silenced_by=("hs-1",)))
    settings = settings_for(am_receiver(sink.url, mirror_silences=False))

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, Clock())
        assert (await dispatcher.tick()).sent == [("am", "a-g0")]
        await dispatcher.aclose()

    run(scenario)
    [request] = sink.requests()
    assert request.path == "/api/v2/alerts"
    assert [a["labels"]["gpu"] for a in request.body] == ["g0"]


def test_alertmanager_down_then_up(tmp_path: Path, sink: WebhookSink, wall_clock: Clock) -> None:
    port = free_port()  # nothing listens there yet
    book = MemoryBook()
    book.add(make_alert("g0", now_ms(wall_clock)), make_alert("g1", now_ms(wall_clock)))
    settings = settings_for(
        am_receiver(f"http://127.0.0.1:{port}"), retry_seconds=1, retry_max_seconds=8
    )
    registry = CollectorRegistry()

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, wall_clock, registry=registry)
        delays = []
        for _ in range(5):
            report = await dispatcher.tick()
            assert sorted(report.failed) == [("am", "a-g0"), ("am", "a-g1")]
            row = book.row("am", "a-g0")
            delays.append((row.next_attempt_ms - now_ms(wall_clock)) // 1000)
            wall_clock.advance(0.5)
            assert (await dispatcher.tick()).requests == 0  # waits out its backoff
            wall_clock.now = row.next_attempt_ms / 1000
        assert delays == [1, 2, 4, 8, 8]  # doubling, capped at retry_max_seconds
        row = book.row("am", "a-g1")
        assert row.attempts == 5 and row.sent_state == "" and "ConnectError" in row.last_error
        with running_alertmanager(tmp_path, f"{sink.url}/am", port=port) as am:
            report = await dispatcher.tick()
            assert sorted(report.sent) == [("am", "a-g0"), ("am", "a-g1")]
            assert sorted(a["labels"]["gpu"] for a in am.alerts()) == ["g0", "g1"]
        await dispatcher.aclose()

    run(scenario)
    row = book.row("am", "a-g1")
    assert (row.sent_state, row.attempts, row.last_error) == ("firing", 0, "")
    sample = registry.get_sample_value
    labels = {"receiver": "am", "outcome": "failed"}
    assert sample("hbmwatch_alert_notifications_total", labels) == 5


def test_restarted_dispatcher_continues(
    tmp_path: Path, sink: WebhookSink, wall_clock: Clock
) -> None:
    port = free_port()
    book = MemoryBook()
    a, b = make_alert("g0", now_ms(wall_clock)), make_alert("g1", now_ms(wall_clock))
    book.add(a, b)
    settings = settings_for(am_receiver(f"http://127.0.0.1:{port}"))
    bodies: list[Any] = []

    async def scenario() -> None:
        with running_alertmanager(tmp_path, f"{sink.url}/am", port=port):
            first = Dispatcher(book, settings, wall_clock)
            assert len((await first.tick()).sent) == 2
        book.resolve(a.id, int(time.time() * 1000))  # resolves while Alertmanager is down
        wall_clock.advance(1)
        assert (await first.tick()).failed == [("am", a.id)]
        await first.aclose()  # hbmwatch restarts
        with running_alertmanager(tmp_path, f"{sink.url}/am", port=port) as am:
            second = Dispatcher(book, settings, wall_clock, client=recording_client(bodies))
            assert (await second.tick()).requests == 0  # the book's backoff still holds
            wall_clock.advance(1)
            assert (await second.tick()).sent == [("am", a.id)]  # the owed resolution
            [[sent]] = bodies
            assert sent["labels"]["gpu"] == "g0" and ms_of(sent["endsAt"]) <= time.time() * 1000
            assert am.alerts() == []  # g1 was accepted before: not re-sent early
            wall_clock.advance(settings.resend_seconds)
            # g1's normal re-send; g0's resolution is repeated for resolved_resend_seconds.
            assert sorted((await second.tick()).sent) == [("am", a.id), ("am", b.id)]
            assert [x["labels"]["gpu"] for x in am.alerts()] == ["g1"]
            await second.aclose()

    run(scenario)


def test_rate_limit(am: Alertmanager, wall_clock: Clock) -> None:
    book = MemoryBook()
    start = now_ms(wall_clock)
    book.add(*(make_alert(f"g{i}", start, incident=f"inc-{i // 10}") for i in range(1000)))
    receiver = am_receiver(am.url, max_alerts_per_request=100, max_requests_per_minute=5)
    settings = settings_for(receiver)
    registry = CollectorRegistry()
    bodies: list[Any] = []

    async def scenario() -> None:
        client = recording_client(bodies)
        dispatcher = Dispatcher(book, settings, wall_clock, client=client, registry=registry)
        first = await dispatcher.tick()
        assert len(first.sent) == 500 and len(first.deferred) == 500
        for _ in range(11):  # the rest of the first minute
            wall_clock.advance(5)
            assert (await dispatcher.tick()).sent == []
        assert len(bodies) == 5
        # A restart does not reopen the window: a new dispatcher still waits it out.
        again = Dispatcher(book, settings, wall_clock, client=client)
        assert (await again.tick()).sent == [] and len(bodies) == 5
        assert all(len(body) == 100 for body in bodies)
        wall_clock.now = start / 1000 + 60
        assert len((await dispatcher.tick()).sent) == 500  # the unsent ones go first
        assert len(bodies) == 10
        await client.aclose()

    run(scenario)
    assert all(book.row("am", f"a-g{i}").sent_state == "firing" for i in range(1000))
    assert len(am.alerts()) == 1000
    labels = {"receiver": "am", "outcome": "rate_limited"}
    # 5 in the first pass, 5 in each of 11 more, then 5 re-sends waiting behind the new ones.
    assert registry.get_sample_value("hbmwatch_alert_notifications_total", labels) == 65


# --- webhooks -----------------------------------------------------------------------------


def test_webhook_one_request_per_incident(sink: WebhookSink) -> None:
    clock = Clock()
    now = now_ms(clock)
    book = MemoryBook()
    book.add(
        make_alert("a1", now),
        make_alert("a2", now),
        make_alert("a3", now, silenced_by=("hs-1",)),
        make_alert("b1", now, incident="inc-2", rack="r2"),
        make_alert("b2", now, incident="inc-2", inhibited_by=("fp",)),
        make_alert("c1", now, incident=None),
    )
    settings = settings_for(hook_receiver(f"{sink.url}/hook", bearer_token="hook-s3cret"))

    def posts() -> dict[str, dict[str, Any]]:
        requests = sink.requests()
        sink.clear()
        assert all(r.headers["authorization"] == "Bearer hook-s3cret" for r in requests)
        got = {r.body["groupKey"]: r.body for r in requests}
        assert len(got) == len(requests)  # one POST per group
        return got

    def gpus(body: dict[str, Any]) -> list[tuple[str, str]]:
        return [(x["labels"]["gpu"], x["status"]) for x in body["alerts"]]

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, clock)
        await dispatcher.tick()
        sent = posts()
        assert set(sent) == {"inc-1", "inc-2", "a-c1"}  # one POST per incident
        assert gpus(sent["inc-1"]) == [("a1", "firing"), ("a2", "firing")]  # a3 muted
        assert gpus(sent["inc-2"]) == [("b1", "firing")]  # b2 inhibited
        for body in sent.values():
            assert set(body) == WEBHOOK_KEYS and body["receiver"] == "hook"
            assert all(set(x) == WEBHOOK_ALERT_KEYS for x in body["alerts"])
        assert sent["inc-1"]["groupLabels"] == {"cluster": "c1", "rack": "r1", "host": "h1"}
        await dispatcher.tick()
        assert posts() == {}  # nothing changed
        book.add(make_alert("a4", now))
        book.resolve("a-a1", now + 1_000)
        clock.advance(2)
        await dispatcher.tick()
        sent = posts()
        assert set(sent) == {"inc-1"}
        assert gpus(sent["inc-1"]) == [("a2", "firing"), ("a4", "firing"), ("a1", "resolved")]
        assert sent["inc-1"]["status"] == "firing"
        book.resolve("a-b1", now + 3_000)
        clock.advance(2)
        await dispatcher.tick()
        sent = posts()
        assert gpus(sent["inc-2"]) == [("b1", "resolved")] and sent["inc-2"]["status"] == "resolved"
        clock.advance(WEBHOOK_REPEAT_SECONDS)
        await dispatcher.tick()
        sent = posts()
        assert set(sent) == {"inc-1", "a-c1"}  # still firing: repeated
        assert gpus(sent["inc-1"]) == [("a2", "firing"), ("a4", "firing")]
        await dispatcher.aclose()

    run(scenario)


def test_webhook_failure_keeps_resolution_owed_through_long_outage(sink: WebhookSink) -> None:
    clock = Clock()
    book = MemoryBook()
    book.add(make_alert("a1", now_ms(clock)))
    settings = settings_for(
        hook_receiver(f"{sink.url}/hook", bearer_token="hook-s3cret"), retry_max_seconds=300
    )

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, clock)
        assert (await dispatcher.tick()).sent == [("hook", "a-a1")]
        sink.status = 503
        book.resolve("a-a1", now_ms(clock) + 1)
        with structlog.testing.capture_logs() as logs:
            for _ in range(40):  # over three hours of failures, backoff capped at 5 min
                clock.advance(300)
                assert (await dispatcher.tick()).failed == [("hook", "a-a1")]
        row = book.row("hook", "a-a1")
        assert row.attempts == 40 and row.last_error.startswith("HTTP 503")
        assert row.sent_state == "firing"
        assert book.get_state(SINCE_STATE) <= book.alerts["a-a1"].resolved_ms
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 40 and warnings[0]["receiver"] == "hook"
        assert "hook-s3cret" not in repr(logs)
        sink.status = 200
        clock.advance(300)
        assert (await dispatcher.tick()).sent == [("hook", "a-a1")]
        await dispatcher.aclose()

    run(scenario)
    last = sink.requests()[-1]
    assert last.body["status"] == "resolved"
    assert last.headers["authorization"] == "Bearer hook-s3cret"
    row = book.row("hook", "a-a1")
    assert (row.sent_state, row.attempts, row.last_error) == ("resolved", 0, "")


def test_silence_changes_follow_hbmwatch(sink: WebhookSink) -> None:
    clock = Clock()
    now = now_ms(clock)
    book = MemoryBook()
    live = Silence("hs-1", (Matcher("rack", "r1"),), now - 1_000, now + 600_000, "ops", "work")
    gone = Silence("hs-old", (Matcher("rack", "r2"),), now - 9_000, now - 1_000, "ops", "done")
    book.silence_rows = {live.id: live, gone.id: gone}
    sink.reply = {"silenceID": "am-1"}
    settings = settings_for(am_receiver(sink.url))
    key = "delivery:am:silences"

    def calls() -> list[tuple[str, str, Any]]:
        got = [(r.method, r.path, r.body) for r in sink.requests()]
        sink.clear()
        return got

    async def scenario() -> None:
        dispatcher = Dispatcher(book, settings, clock)
        await dispatcher.tick()
        [(method, path, body)] = calls()  # the ended silence is not mirrored
        assert (method, path) == ("POST", "/api/v2/silences") and "id" not in body
        assert book.get_state(key) == {"hs-1": {"id": "am-1", "ends_ms": live.ends_ms}}
        book.silence_rows[live.id] = replace(live, ends_ms=now + 900_000)  # extended
        sink.reply = {"silenceID": "am-2"}
        await dispatcher.tick()
        [(method, path, body)] = calls()
        assert (method, path, body["id"]) == ("POST", "/api/v2/silences", "am-1")
        assert ms_of(body["endsAt"]) == now + 900_000
        assert book.get_state(key)["hs-1"]["id"] == "am-2"
        del book.silence_rows[live.id]  # deleted in hbmwatch
        await dispatcher.tick()
        assert calls() == [("DELETE", "/api/v2/silence/am-2", None)]
        assert book.get_state(key) == {}
        await dispatcher.aclose()

    run(scenario)


def test_run_until_stopped(sink: WebhookSink) -> None:
    book = MemoryBook()
    book.add(make_alert("g0", int(NOW * 1000)))
    settings = settings_for(hook_receiver(f"{sink.url}/hook"))

    async def scenario() -> None:
        stop = asyncio.Event()
        dispatcher = Dispatcher(book, settings, Clock())
        task = asyncio.create_task(dispatcher.run(stop, every_seconds=0.01))
        for _ in range(500):
            if sink.requests():
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)
        await dispatcher.aclose()

    run(scenario)
    assert len(sink.requests("/hook")) == 1 and book.row("hook", "a-g0").sent_state == "firing"
