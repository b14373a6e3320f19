"""The alert engine on constructed findings: lifecycle, flap damping, grouping, muting."""

from __future__ import annotations

import pytest

from hbmwatch.alerts.engine import AlertEngine, place
from hbmwatch.alerts.labels import ALERT_NAMES, alert_labels, label_fingerprint
from hbmwatch.detectors.base import make_finding
from hbmwatch.records import (
    AlertState,
    Evidence,
    Finding,
    IncidentState,
    Matcher,
    RankedCause,
    Severity,
    Silence,
)
from hbmwatch.settings import AlertSettings
from hbmwatch.taxonomy import Cause, FindingKind

T0 = 1_800_000_000_000


def gpu(rack: str, host: str, g: int) -> dict[str, str]:
    return {"cluster": "c0", "rack": rack, "host": host, "gpu": str(g), "sku": "MI300X"}


def finding(kind: str, entity: dict[str, str], start_s: float, *, end_s: float | None = None,
            severity: Severity = Severity.WARNING, causes: tuple = (),
            summary: str = "hot") -> Finding:  # fmt: skip
    return make_finding(
        kind=kind, detector="test", entity=entity, severity=severity, summary=summary,
        started_ms=T0 + int(start_s * 1000), raised_ms=T0 + int(start_s * 1000),
        updated_ms=T0 + int((end_s or start_s) * 1000),
        ended_ms=None if end_s is None else T0 + int(end_s * 1000),
        evidence=[Evidence(f'gpu_memory_temperature_celsius{{host="{entity.get("host")}"}}',
                           "margin_c", -2.0, 0.0)],
        causes=causes,
    )  # fmt: skip


def engine(**kw: object) -> AlertEngine:
    return AlertEngine(AlertSettings(**kw))  # type: ignore[arg-type]


def at(seconds: float) -> int:
    return T0 + int(seconds * 1000)


def test_a_finding_fires_an_alert_with_labels_annotations_and_an_incident() -> None:
    e = engine()
    f = finding(FindingKind.THERMAL_EXCURSION, gpu("r0", "n1", 3), 0)
    changes = e.apply([f], at(1))
    (alert,) = e.alerts.values()
    assert alert.state is AlertState.FIRING and alert.firing_ms == at(1)
    (inc,) = e.incidents.values()
    assert dict(alert.labels) == {
        "alertname": "HBMThermalExcursion", "severity": "warning",
        "kind": "thermal_excursion", "scope": "gpu", "cluster": "c0", "rack": "r0",
        "host": "n1", "gpu": "3", "sku": "MI300X", "incident": inc.id,
    }  # fmt: skip
    assert alert.fingerprint == label_fingerprint(alert_labels(f))  # the labels it rose with
    assert alert.annotations["runbook"] == ALERT_NAMES["HBMThermalExcursion"]
    assert "margin_c = -2" in alert.annotations["description"]
    assert alert.incident_id == inc.id and alert.annotations["incident_url"].endswith(inc.id)
    assert inc.scope == {"cluster": "c0", "host": "n1"} and inc.state is IncidentState.OPEN
    assert [ev.kind for ev in inc.timeline] == ["opened", "alert_added"]
    assert changes.alerts == {alert.id} and changes.incidents == {inc.id}
    # Restating the same finding changes nothing that needs saving.
    assert not e.apply([f], at(2))


def test_pending_then_firing_and_a_short_finding_never_pages() -> None:
    e = engine(pending_seconds=30)
    e.apply([finding(FindingKind.THROTTLE, gpu("r0", "n1", 0), 0)], at(1))
    (a,) = e.alerts.values()
    assert a.state is AlertState.PENDING and not e.incidents
    e.apply([], at(31))
    assert e.alerts[a.id].state is AlertState.FIRING and len(e.incidents) == 1
    short = finding(FindingKind.THROTTLE, gpu("r0", "n2", 0), 40)
    e.apply([short], at(41))
    e.apply([finding(FindingKind.THROTTLE, gpu("r0", "n2", 0), 40, end_s=50)], at(51))
    b = next(x for x in e.alerts.values() if x.labels["host"] == "n2")
    assert b.state is AlertState.RESOLVED and b.firing_ms is None and b.incident_id is None


def test_flap_damping_keeps_one_alert_and_resolves_after_the_hold() -> None:
    e = engine(keep_firing_seconds=60)
    ent = gpu("r0", "n1", 0)
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0)], at(1))
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0, end_s=20)], at(21))
    (a,) = e.alerts.values()
    assert a.state is AlertState.FIRING and a.ending_ms == at(20)
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0)], at(40))  # back: a flap
    (a,) = e.alerts.values()
    assert a.state is AlertState.FIRING and a.ending_ms is None and a.flaps == 1
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0, end_s=100)], at(101))
    e.apply([], at(159))
    assert e.alerts[a.id].state is AlertState.FIRING
    e.apply([], at(160))
    done = e.alerts[a.id]
    assert done.state is AlertState.RESOLVED and done.resolved_ms == at(100)
    (inc,) = e.incidents.values()
    assert inc.state is IncidentState.RESOLVED and inc.resolved_ms == at(100)
    assert [ev.kind for ev in inc.timeline][-2:] == ["alert_resolved", "resolved"]


COOLING = (
    RankedCause(Cause.COOLING, 0.85, (), "rack r0 warms alone"),
    RankedCause(Cause.THERMAL, 0.15),
)
HBM_THROTTLE = (RankedCause(Cause.HBM_THERMAL_THROTTLE, 0.9),)


def rack_storm(e: AlertEngine, rack: str = "r0", start_s: float = 0) -> list[Finding]:
    found = [finding(FindingKind.THERMAL_EXCURSION, {"cluster": "c0", "rack": rack}, start_s,
                     severity=Severity.CRITICAL, summary=f"rack {rack} warms alone",
                     causes=COOLING)]  # fmt: skip
    for n in range(8):
        for g in range(8):
            ent = gpu(rack, f"{rack}-node{n}", g)
            found.append(finding(FindingKind.THERMAL_EXCURSION, ent, start_s, causes=COOLING))
            found.append(finding(FindingKind.THROTTLE, {**ent, "reason": "hbm"}, start_s,
                                 causes=HBM_THROTTLE))  # fmt: skip
    e.apply(found, at(start_s + 1))
    return found


def test_a_rack_is_one_incident_and_its_cooling_alert_inhibits_the_gpus() -> None:
    e = engine()
    rack_storm(e)
    p99 = finding(FindingKind.P99_REGRESSION,
                  {**gpu("r0", "r0-node1", 2), "service": "chat", "phase": "e2e"}, 5,
                  causes=(RankedCause(Cause.COOLING, 0.8, (), "rack inlet +40 C"),
                          RankedCause(Cause.CO_TENANT, 0.1)))  # fmt: skip
    other = finding(FindingKind.THERMAL_EXCURSION, gpu("r1", "r1-node0", 0), 5)
    e.apply([p99, other], at(6))
    incidents = {tuple(sorted(i.scope.items())): i for i in e.incidents.values()}
    assert len(incidents) == 2
    r0 = incidents[(("cluster", "c0"), ("rack", "r0"))]
    assert len(r0.alerts) == 1 + 64 + 64 + 1 and r0.severity is Severity.CRITICAL
    assert r0.title.startswith("rack r0 (c0) cooling: ")
    assert [c.cause for c in r0.causes][:1] == ["cooling"]
    assert {"hbm_thermal_throttle", "co_tenant"} <= {c.cause for c in r0.causes}
    rack_alert = next(a for a in e.alerts.values() if a.labels["scope"] == "rack")
    by_name: dict[str, list] = {}
    for a in e.alerts.values():
        by_name.setdefault(a.labels["alertname"], []).append(a)
    r0_gpu = [a for a in by_name["HBMThermalExcursion"] if a.labels["rack"] == "r0"]
    assert all(a.inhibited_by == (rack_alert.fingerprint,) for a in r0_gpu)
    assert all(a.inhibited_by for a in by_name["GPUThrottling"])
    assert not rack_alert.muted
    assert not by_name["P99LatencyRegression"][0].muted  # the page still shows the p99
    assert not next(a for a in r0_gpu + by_name["HBMThermalExcursion"]
                    if a.labels["rack"] == "r1").muted  # fmt: skip


def test_target_down_inhibits_that_hosts_gpu_alerts() -> None:
    e = engine()
    down = finding(FindingKind.DATA_QUALITY,
                   {"cluster": "c0", "rack": "r0", "host": "n1", "target": "n1:9400"}, 0,
                   causes=(RankedCause(Cause.TARGET_DOWN, 1.0),))  # fmt: skip
    e.apply([down, finding(FindingKind.THROTTLE, gpu("r0", "n1", 0), 0),
             finding(FindingKind.THROTTLE, gpu("r0", "n2", 0), 0)], at(1))  # fmt: skip
    names = {a.labels.get("host"): a for a in e.alerts.values() if a.labels["scope"] == "gpu"}
    source = next(a for a in e.alerts.values() if a.labels["alertname"] == "HbmwatchTargetDown")
    assert names["n1"].inhibited_by == (source.fingerprint,) and not names["n2"].muted


def test_silences_mute_while_active_and_expire() -> None:
    e = engine()
    e.apply([finding(FindingKind.THROTTLE, gpu("r0", "n1", 0), 0)], at(1))
    s = Silence("s1", (Matcher("host", "n1"), Matcher("alertname", "GPU.*", "=~")),
                at(2), at(100), "ops", "maintenance")  # fmt: skip
    e.add_silence(s, at(2))
    (a,) = e.alerts.values()
    assert a.silenced_by == ("s1",) and a.state is AlertState.FIRING  # muted, still firing
    e.expire_silence("s1", at(10))
    assert e.alerts[a.id].silenced_by == ()
    e.add_silence(Silence("s2", (Matcher("host", "n9"),), at(11), at(100), "ops", ""), at(11))
    assert e.alerts[a.id].silenced_by == ()


def test_escalation_resolves_the_old_labels_and_fires_new_ones_in_the_same_incident() -> None:
    e = engine()
    ent = gpu("r0", "n1", 0)
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0)], at(1))
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0, severity=Severity.CRITICAL)], at(9))
    old, new = sorted(e.alerts.values(), key=lambda a: a.started_ms)
    assert old.state is AlertState.RESOLVED and old.labels["severity"] == "warning"
    assert new.state is AlertState.FIRING and new.labels["severity"] == "critical"
    (inc,) = e.incidents.values()
    assert inc.alerts == (old.id, new.id) and inc.severity is Severity.CRITICAL
    assert "severity" in [ev.kind for ev in inc.timeline]
    # Back to warning, then critical again: the critical alert stays, nothing new starts.
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0)], at(20))
    e.apply([finding(FindingKind.THERMAL_EXCURSION, ent, 0, severity=Severity.CRITICAL)], at(30))
    assert len(e.alerts) == 2 and e.alerts[new.id].state is AlertState.FIRING


def test_acknowledge_resolve_and_reopen_within_the_group_window() -> None:
    e = engine(keep_firing_seconds=0, group_seconds=300)
    ent = gpu("r0", "n1", 0)
    e.apply([finding(FindingKind.THROTTLE, ent, 0)], at(1))
    (inc,) = e.incidents.values()
    acked = e.acknowledge(inc.id, "alice", at(5), "looking")
    assert acked.state is IncidentState.ACKNOWLEDGED and acked.acknowledged_by == "alice"
    e.apply([finding(FindingKind.THROTTLE, ent, 0, end_s=10)], at(11))
    assert e.incidents[inc.id].state is IncidentState.RESOLVED
    with pytest.raises(ValueError, match="resolved"):
        e.acknowledge(inc.id, "bob", at(12))
    e.apply([finding(FindingKind.THROTTLE, gpu("r0", "n1", 1), 100)], at(101))
    assert list(e.incidents) == [inc.id]  # same host, 90 s later: the same incident reopens
    assert e.incidents[inc.id].timeline[-2].kind == "reopened"
    with pytest.raises(KeyError):
        e.acknowledge("inc-nope", "bob", at(12))


def test_place_prefers_rack_then_host_then_service() -> None:
    assert place({"cluster": "c", "rack": "r", "host": "h"}) == {"cluster": "c", "rack": "r"}
    assert place({"host": "h", "gpu": "0"}) == {"host": "h"}
    assert place({"service": "chat"}) == {"service": "chat"}
    assert place({}) == {"fleet": "all"}
