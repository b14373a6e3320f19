"""Incidents follow causes (issue 13): hand-built findings through the alert engine.

Each test is one of the issue's cases: a target down and a hot GPU on one rack are two
pages; a rack losing coolant is one, titled by its cooling; a noisy neighbour on one host
and a power cap on another are two; a regression joins the hardware problem its top cause
names.  They run in milliseconds.
"""

from __future__ import annotations

import dataclasses

from hbmwatch.alerts.engine import AlertEngine
from hbmwatch.detectors.base import make_finding
from hbmwatch.records import (
    NO_EVIDENCE,
    UNEVIDENCED_MAX,
    Evidence,
    Finding,
    Incident,
    IncidentState,
    RankedCause,
    Severity,
)
from hbmwatch.settings import AlertSettings
from hbmwatch.taxonomy import Cause, FindingKind
from tests.test_alerts_engine import at, gpu

T0 = at(0)


def temp(host: str, g: int) -> str:
    return f'gpu_memory_temperature_celsius{{cluster="c0",rack="r0",host="{host}",gpu="{g}"}}'


def ev(series: str, stat: str, value: float, start_s: float = 0, end_s: float = 0) -> Evidence:
    return Evidence(series, stat, value, None, at(start_s), at(end_s))


def found(kind: str, entity: dict[str, str], start_s: float, causes: tuple = (), *,
          evidence: tuple = (), now_s: float | None = None, end_s: float | None = None,
          severity: Severity = Severity.WARNING, summary: str = "") -> Finding:  # fmt: skip
    """A finding stated at ``now_s`` (default: its start)."""
    now = start_s if now_s is None else now_s
    return make_finding(
        kind=kind, detector="test", entity=entity, severity=severity,
        summary=summary or f"{kind} on {entity}", started_ms=at(start_s), raised_ms=at(start_s),
        updated_ms=at(end_s if end_s is not None else now),
        ended_ms=None if end_s is None else at(end_s), evidence=evidence, causes=causes,
    )  # fmt: skip


def hot_gpu(host: str, g: int, start_s: float, cause: str = Cause.THERMAL, rise: float = 12.0,
            now_s: float | None = None) -> Finding:  # fmt: skip
    causes = (RankedCause(cause, 0.85, (), "rack r0 warms alone"),
              RankedCause(Cause.THERMAL, 0.15)) if cause != Cause.THERMAL else (
              RankedCause(Cause.THERMAL, 0.9, (), "this GPU alone"),)  # fmt: skip
    evidence = (ev(temp(host, g), "rise_over_load_baseline_c", rise, start_s, now_s or start_s),)
    return found(FindingKind.THERMAL_EXCURSION, gpu("r0", host, g), start_s, causes,
                 evidence=evidence, now_s=now_s)  # fmt: skip


def rack_warms(start_s: float, rise: float = 20.0, now_s: float | None = None) -> Finding:
    causes = (RankedCause(Cause.COOLING, 0.8, (), "rack r0 warms alone in c0"),
              RankedCause(Cause.AMBIENT, 0.2))  # fmt: skip
    evidence = (ev("mean over rack r0: gpu_memory_temperature_celsius", "rack_mean_rise_c", rise,
                   start_s, now_s or start_s),)  # fmt: skip
    return found(FindingKind.THERMAL_EXCURSION, {"cluster": "c0", "rack": "r0"}, start_s, causes,
                 evidence=evidence, now_s=now_s)  # fmt: skip


def p99(service: str, host: str, g: int, start_s: float, cause: str, ratio: float = 2.4,
        now_s: float | None = None, named: tuple[str, int] | None = None) -> Finding:  # fmt: skip
    """A regression of ``service`` on ``host`` gpu ``g``; its top cause names ``named``."""
    nh, ng = named or (host, g)
    series = f'gpu_power_watts{{cluster="c0",rack="r0",host="{nh}",gpu="{ng}"}}'
    named_ev = (ev(series, "mean change", 0.4),) if cause != Cause.NONE else ()
    causes = (
        RankedCause(cause, 0.7, named_ev, f"{cause} led the p99"),
        RankedCause(Cause.THERMAL, 0.1, (ev(temp(host, g), "max change", 0.5),)),
    )
    entity = {**gpu("r0", host, g), "service": service, "phase": "e2e"}
    evidence = (ev(f'vllm_p99{{service="{service}"}}', "p99_over_baseline_ratio", ratio),)
    return found(FindingKind.P99_REGRESSION, entity, start_s, causes, evidence=evidence,
                 now_s=now_s)  # fmt: skip


def throttle(host: str, g: int, start_s: float, reason: str = "power",
             cause: str = Cause.POWER_CAP, end_s: float | None = None) -> Finding:  # fmt: skip
    series = f'gpu_throttle_seconds_total{{host="{host}",gpu="{g}",reason="{reason}"}}'
    return found(FindingKind.THROTTLE, {**gpu("r0", host, g), "reason": reason}, start_s,
                 (RankedCause(cause, 0.9, (), f"{reason} throttle residency sustained"),),
                 evidence=(ev(series, "throttle_residency", 0.45),), end_s=end_s)  # fmt: skip


def target_down(host: str, start_s: float) -> Finding:
    entity = {"cluster": "c0", "rack": "r0", "host": host, "target": f"{host}:9400"}
    return found(FindingKind.DATA_QUALITY, entity, start_s,
                 (RankedCause(Cause.TARGET_DOWN, 0.9, (), "scrapes fail"),),
                 evidence=(ev('up{target="n1:9400"}', "consecutive_down_scrapes", 5),))  # fmt: skip


def engine() -> AlertEngine:
    return AlertEngine(AlertSettings())


def incidents(e: AlertEngine, *, open_only: bool = True) -> list[Incident]:
    out = [i for i in e.incidents.values() if i.open or not open_only]
    return sorted(out, key=lambda i: i.opened_ms)


def members(e: AlertEngine, inc: Incident) -> set[str]:
    mine = (e.alerts[a] for a in inc.alerts)
    return {a.labels["alertname"] for a in mine if a.incident_id == inc.id}


def test_a_target_down_and_a_hot_gpu_on_one_rack_are_two_incidents() -> None:
    e = engine()
    e.apply([target_down("n1", 0)], at(1))
    e.apply([hot_gpu("n2", 3, 30)], at(31))  # another host of the same rack
    e.apply([hot_gpu("n1", 4, 40)], at(41))  # and the very host that is down
    down, hot_n2, hot_n1 = incidents(e)
    assert [i.causes[0].cause for i in (down, hot_n2, hot_n1)] == ["target_down", "thermal",
                                                                     "thermal"]  # fmt: skip
    assert members(e, down) == {"HbmwatchTargetDown"}
    assert down.title == "host n1 (c0) target_down: target n1:9400 down"
    assert hot_n2.title.startswith("host n2 (c0) thermal: HBM +12 C")
    # The other way round: the target goes down under an open thermal incident.
    e = engine()
    e.apply([hot_gpu("n1", 4, 0)], at(1))
    e.apply([target_down("n1", 30)], at(31))
    assert [i.causes[0].cause for i in incidents(e)] == ["thermal", "target_down"]


def test_a_rack_losing_coolant_is_one_incident_titled_by_its_cooling() -> None:
    e = engine()
    # The first GPU crosses before the rack as a whole: a one-GPU problem, for now.
    e.apply([hot_gpu("n0", 0, 0)], at(1))
    (first,) = incidents(e)
    assert first.scope == {"cluster": "c0", "host": "n0"} and first.causes[0].cause == "thermal"
    # The rack warms together: the same page widens to the rack, nothing new opens.
    later = [rack_warms(60, now_s=61), hot_gpu("n0", 0, 0, Cause.COOLING, 25, now_s=61)]
    later += [hot_gpu(f"n{n}", g, 55, Cause.COOLING, 30 + g, now_s=61) for n in range(2)
              for g in range(1, 8)]  # fmt: skip
    later += [throttle(f"n{n}", g, 58, "hbm", Cause.HBM_THERMAL_THROTTLE) for n in (0, 1)
              for g in (2, 3)]  # fmt: skip
    later += [p99("chat", "n0", 1, 59, Cause.COOLING), p99("embed", "n1", 5, 59, Cause.COOLING,
                                                          ratio=1.9)]  # fmt: skip
    e.apply(later, at(61))
    (inc,) = incidents(e, open_only=False)
    assert inc.id == first.id and inc.scope == {"cluster": "c0", "rack": "r0"}
    assert "widened" in [ev.kind for ev in inc.timeline]
    assert len(inc.alerts) == 1 + 15 + 4 + 2
    assert inc.causes[0].cause == "cooling" and inc.causes[0].evidence
    assert inc.causes[0].entity == {"cluster": "c0", "rack": "r0"}  # the rack, not one GPU
    assert inc.title == ("rack r0 (c0) cooling: HBM +37 C on 15 GPUs, p99 up to 2.4x on 2 services")
    # Four minutes on, the figures hold their peak, and the title says over how long.
    e.apply([hot_gpu("n1", 7, 55, Cause.COOLING, 38, now_s=295), rack_warms(60, 22, 295)],
            at(300))  # fmt: skip
    assert e.incidents[inc.id].title.startswith("rack r0 (c0) cooling: HBM +38 C over 4 min")
    e.apply([hot_gpu("n1", 7, 55, Cause.COOLING, 3, now_s=400)], at(400))
    assert e.incidents[inc.id].title.startswith("rack r0 (c0) cooling: HBM +38 C over 4 min")


def test_a_stack_hot_before_its_rack_lost_coolant_stays_its_own_incident() -> None:
    """The detector ranks the stack's own heat over the rack's cooling (it stands out
    beyond what warms with it): two problems, two incidents, and the rack's is titled by
    its cooling."""
    e = engine()
    e.apply([hot_gpu("n0", 7, 0, rise=40)], at(1))
    (stack,) = incidents(e)
    own = (RankedCause(Cause.THERMAL, 0.7, (), "one HBM stack runs 35 C hotter"),
           RankedCause(Cause.COOLING, 0.3, (), "rack r0 warms alone in c0"))  # fmt: skip
    evidence = (ev(temp("n0", 7), "rise_over_load_baseline_c", 45, 0, 300),)
    still_own = found(FindingKind.THERMAL_EXCURSION, gpu("r0", "n0", 7), 0, own,
                      evidence=evidence, now_s=300)  # fmt: skip
    e.apply([still_own], at(300))
    later = [still_own, rack_warms(290, now_s=320)]
    later += [hot_gpu("n0", g, 300, Cause.COOLING, 10, now_s=320) for g in range(7)]
    e.apply(later, at(320))
    rack = next(i for i in incidents(e) if i.id != stack.id)
    assert e.incidents[stack.id].scope == {"cluster": "c0", "host": "n0"}
    assert e.incidents[stack.id].causes[0].cause == "thermal"
    assert rack.scope == {"cluster": "c0", "rack": "r0"} and rack.causes[0].cause == "cooling"
    assert stack.alerts[0] in e.incidents[stack.id].alerts
    assert stack.alerts[0] not in rack.alerts


def test_a_noisy_neighbour_and_a_power_cap_on_two_hosts_are_two_incidents() -> None:
    e = engine()
    e.apply([p99("chat", "a", 2, 0, Cause.CO_TENANT, ratio=3.1)], at(1))
    e.apply([throttle("b", 1, 30), p99("embed", "b", 1, 31, Cause.POWER_CAP, ratio=1.6)], at(32))
    e.apply([p99("rerank", "a", 2, 40, Cause.CO_TENANT, ratio=2.0)], at(41))
    noisy, power = incidents(e)
    assert noisy.scope == {"cluster": "c0", "host": "a"} and power.scope["host"] == "b"
    assert noisy.causes[0].cause == "co_tenant" and power.causes[0].cause == "power_cap"
    assert all(c.cause != "thermal" for c in noisy.causes[:1])
    assert noisy.title == "host a (c0) co_tenant: p99 up to 3.1x on 2 services"
    assert power.title == (
        "host b (c0) power_cap: power throttling 45% of the time on b gpu 1, p99 1.6x on embed/e2e"
    )
    assert members(e, power) == {"GPUThrottling", "P99LatencyRegression"}


def test_a_regression_joins_the_hardware_problem_its_top_cause_names() -> None:
    e = engine()
    e.apply([throttle("b", 1, 0)], at(1))
    e.apply([p99("chat", "b", 1, 5, Cause.POWER_CAP)], at(6))  # named: gpu 1 of host b
    (inc,) = incidents(e)
    assert members(e, inc) == {"GPUThrottling", "P99LatencyRegression"}
    # A regression with no cause found is its own page, about its service ...
    e.apply([p99("search", "c", 0, 10, Cause.NONE)], at(11))
    power, own = incidents(e)
    assert own.scope == {"cluster": "c0", "service": "search"} and own.causes[0].cause == "none"
    # ... until its cause is found: then it is the power cap's page.
    e.apply([p99("search", "c", 0, 10, Cause.POWER_CAP, now_s=40, named=("b", 1))], at(41))
    (inc,) = incidents(e)
    assert inc.id == power.id and len(inc.alerts) == 3
    merged = e.incidents[own.id]
    assert merged.state is IncidentState.RESOLVED
    assert merged.timeline[-1].text == f"merged into {power.id}"


def test_two_hot_gpus_on_two_hosts_of_a_rack_are_two_incidents_until_the_rack_explains_them(
) -> None:  # fmt: skip
    e = engine()
    e.apply([hot_gpu("n0", 0, 0), hot_gpu("n1", 0, 10)], at(11))
    assert len(incidents(e)) == 2
    e.apply([rack_warms(20), hot_gpu("n0", 0, 0, Cause.COOLING, now_s=21),
             hot_gpu("n1", 0, 10, Cause.COOLING, now_s=21)], at(21))  # fmt: skip
    (inc,) = incidents(e)
    assert inc.scope == {"cluster": "c0", "rack": "r0"} and inc.causes[0].cause == "cooling"
    assert len(inc.alerts) == 3


def test_a_cause_without_evidence_is_not_shown_as_confident() -> None:
    e = engine()
    bare = RankedCause(Cause.CO_TENANT, 0.8, (), "another workload")
    reg = found(FindingKind.P99_REGRESSION, {"service": "chat", "host": "a", "gpu": "0"}, 0,
                (RankedCause(Cause.POWER_CAP, 0.6, (ev("gpu_power_watts{host=\"a\"}", "m", 1),)),
                 bare))  # fmt: skip
    e.apply([reg], at(1))
    (inc,) = incidents(e)
    by = {c.cause: c for c in inc.causes}
    assert by["co_tenant"].confidence == UNEVIDENCED_MAX and NO_EVIDENCE in by["co_tenant"].summary
    assert inc.causes[0].cause == "power_cap" and inc.causes[0].confidence == 0.6
    # A finding's own evidence stands for its top cause (a GPU warming: its heat).
    e.apply([hot_gpu("n5", 0, 0)], at(2))
    hot = next(i for i in incidents(e) if i.causes[0].cause == "thermal")
    assert hot.causes[0].evidence[0].statistic == "rise_over_load_baseline_c"


def test_the_timeline_is_in_time_order_and_folds_repeats() -> None:
    from hbmwatch.api.incident.timeline import timeline_rows

    e = engine()
    for k in range(12):  # twelve GPUs throttle briefly, one after another
        e.apply([throttle("b", k, 10 * k + 1)], at(10 * k + 1))
        e.apply([throttle("b", k, 10 * k + 1, end_s=10 * k + 5)], at(10 * k + 6))
    e.apply([], at(500))  # past the keep-firing hold: all resolved
    (inc,) = incidents(e, open_only=False)
    times = [ev.at_ms for ev in inc.timeline]
    assert times == sorted(times) and inc.timeline[0].kind == "opened"
    assert inc.timeline[-1].kind == "resolved"
    assert len(inc.timeline) >= 24  # every add and resolve is kept for the API
    rows = timeline_rows(inc.timeline, resolved=True)  # the page's rows
    assert [r.kind for r in rows] == ["opened", "alerts_folded", "resolved"]
    assert rows[1].text.startswith("12 GPUThrottling alerts came and went")


def test_an_info_finding_is_recorded_not_paged_until_it_escalates() -> None:
    e = engine()
    quiet = found(FindingKind.THROTTLE, gpu("r0", "b", 1), 0, severity=Severity.INFO)
    e.apply([quiet], at(1))
    assert not e.alerts and not e.incidents
    loud = found(FindingKind.THROTTLE, gpu("r0", "b", 1), 0, now_s=900)
    e.apply([loud], at(901))
    assert len(e.alerts) == 1 and len(incidents(e)) == 1


def test_a_restarted_engine_keeps_grouping_by_problem() -> None:
    e = engine()
    e.apply([hot_gpu("n0", 0, 0, Cause.COOLING), rack_warms(0)], at(1))
    (inc,) = incidents(e)
    again = engine()
    again.load(e.alerts.values(), e.incidents.values(), e.silences.values(),
               e.findings.values())  # fmt: skip
    again.apply([hot_gpu("n1", 3, 30, Cause.COOLING), target_down("n1", 30)], at(31))
    cooling, down = incidents(again)
    assert cooling.id == inc.id and len(cooling.alerts) == 3
    assert down.causes[0].cause == "target_down"


def test_the_title_comes_from_the_top_cause_not_the_last_alert_that_changed() -> None:
    e = engine()
    cooling = (RankedCause(Cause.COOLING, 0.8, (), "rack r0 warms alone"),)
    rise = ev(temp("n0", 1), "rise_over_load_baseline_c", 21.0, 0, 120)
    hot = found(FindingKind.THERMAL_EXCURSION, gpu("r0", "n0", 1), 0, cooling, evidence=(rise,))
    e.apply([hot], at(121))
    (inc,) = incidents(e)
    assert inc.title == "rack r0 (c0) cooling: HBM +21 C over 2 min on n0 gpu 1"
    # A hotspot alert then changes last, with a falling reading: the title stays.
    spot = 'gpu_hotspot_temperature_celsius{host="n0",gpu="2"}'
    later = found(FindingKind.THERMAL_EXCURSION, gpu("r0", "n0", 2), 130, cooling,
                  evidence=(ev(spot, "temperature_c", 62.0),
                            ev(spot, "rise_over_load_baseline_c", -0.4)),
                  summary="hotspot at 62 C: -0.4 C over its baseline, -34.1 C/min")  # fmt: skip
    e.apply([later], at(131))
    (inc,) = incidents(e)
    assert inc.title == "rack r0 (c0) cooling: HBM +21 C over 2 min on 2 GPUs"
    # A GPU with no rise to state reads its temperature, never a negative rise.
    e = engine()
    e.apply([dataclasses.replace(later, causes=())], at(131))
    assert incidents(e)[0].title == "host n0 (c0) thermal: hotspot at 62 C on n0 gpu 2"
