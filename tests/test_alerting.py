"""Alerting on real stores: state persisted, a restart resumes without duplicates or loss."""

from __future__ import annotations

import dataclasses

import pytest

from hbmwatch.alerts.runner import Alerting
from hbmwatch.records import AlertState, Finding, IncidentState, Matcher
from hbmwatch.settings import AlertSettings
from hbmwatch.store.store import Store
from hbmwatch.taxonomy import FindingKind
from tests.conftest import Clock
from tests.test_alerts_engine import finding, gpu


def alerting(store: Store, **kw: object) -> Alerting:
    a = Alerting(store, AlertSettings(keep_firing_seconds=30, **kw))  # type: ignore[arg-type]
    a.start()
    return a


def ms(clock: Clock) -> int:
    return int(clock() * 1000)


def stated(clock: Clock, kind: str, entity: dict[str, str]) -> Finding:
    """A finding that started 10 s before the clock, stated now."""
    f = finding(kind, entity, 0)
    start = ms(clock) - 10_000
    return dataclasses.replace(f, id=f"{f.fingerprint}-{start}", started_ms=start,
                               raised_ms=start, updated_ms=ms(clock))  # fmt: skip


def ended(f: Finding, clock: Clock) -> Finding:
    return dataclasses.replace(f, updated_ms=ms(clock), ended_ms=ms(clock))


def test_a_restart_during_an_open_incident_makes_no_duplicate_and_loses_no_resolution(
    store: Store, clock: Clock
) -> None:
    first = alerting(store)
    fa = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 0))
    store.findings.save([fa])
    first.process([fa])
    (inc,) = store.alerts.incidents()
    assert inc.state is IncidentState.OPEN and len(inc.alerts) == 1

    # The finding ends while hbmwatch is down: the detectors wrote it, alerting never saw it.
    clock.advance(5)
    store.findings.save([ended(fa, clock)])
    second = alerting(store)  # the restart catches up from the findings table
    (alert,) = store.alerts.alerts(incident_id=inc.id)
    assert alert.ending_ms == ms(clock)  # held for the flap window, then resolved

    fb = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 1))
    second.process([fb])  # another GPU of that host, hot too: the same incident
    incidents = store.alerts.incidents()
    assert [i.id for i in incidents] == [inc.id] and len(incidents[0].alerts) == 2

    clock.advance(40)
    second.process([ended(fb, clock)])
    clock.advance(31)
    second.process([])
    states = {x.labels["gpu"]: x.state for x in store.alerts.alerts(incident_id=inc.id)}
    assert states == {"0": AlertState.RESOLVED, "1": AlertState.RESOLVED}
    final = store.alerts.incident(inc.id)
    assert final is not None and final.state is IncidentState.RESOLVED
    assert [e.kind for e in final.timeline].count("opened") == 1


def test_silences_and_acknowledgements_are_stored(store: Store, clock: Clock) -> None:
    svc = alerting(store)
    f = stated(clock, FindingKind.THROTTLE, gpu("r0", "n1", 0))
    svc.process([f])
    s = svc.add_silence([Matcher("host", "n1")], starts_ms=None, ends_ms=ms(clock) + 3_600_000,
                        created_by="alice", comment="swap")  # fmt: skip
    (alert,) = store.alerts.alerts()
    assert alert.silenced_by == (s.id,)
    assert [x.id for x in store.alerts.silences(active_at_ms=ms(clock))] == [s.id]
    (inc,) = store.alerts.incidents()
    svc.acknowledge(inc.id, "alice", "on it")
    again = alerting(store)  # a restart keeps the silence and the acknowledgement
    assert again.engine.silences[s.id].created_by == "alice"
    stored = store.alerts.incident(inc.id)
    assert stored is not None and stored.state is IncidentState.ACKNOWLEDGED
    expired = again.expire_silence(s.id)
    assert expired is not None and expired.ends_ms == ms(clock)
    assert store.alerts.alerts()[0].silenced_by == ()
    with pytest.raises(ValueError, match="end after"):
        again.add_silence([Matcher("host", "n1")], starts_ms=None, ends_ms=ms(clock) - 1,
                          created_by="a", comment="")  # fmt: skip
    with pytest.raises(ValueError, match="regular expression"):
        again.add_silence([Matcher("host", "(", "=~")], starts_ms=None,
                          ends_ms=ms(clock) + 10, created_by="a", comment="")  # fmt: skip
    with pytest.raises(KeyError):
        again.acknowledge("inc-missing", "a")


def test_the_leader_carries_on_what_a_person_did_through_another_process(
    store: Store, clock: Clock
) -> None:
    """An acknowledgement saved by an API that does not lead (its own engine) is not written
    over by the leader's next change to the incident."""
    leader = alerting(store)
    f = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 0))
    leader.process([f])
    (inc,) = store.alerts.incidents()
    clock.advance(2)
    api = alerting(store)  # hbmwatch serve: an engine of its own over the same store
    api.acknowledge(inc.id, "alice", "on it")
    clock.advance(2)
    g = stated(clock, FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 1))
    leader.process([f, g])  # another GPU joins the incident: the leader writes it
    stored = store.alerts.incident(inc.id)
    assert stored is not None and len(stored.alerts) == 2
    assert stored.state is IncidentState.ACKNOWLEDGED and stored.acknowledged_by == "alice"
    assert [e.kind for e in stored.timeline].count("acknowledged") == 1
