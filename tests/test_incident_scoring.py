"""Incident-level scoring on hand-built alerts, incidents, pages and ground truth."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from hbmwatch.alerts.delivery import webhook_alert
from hbmwatch.evaluation.incident_report import score_incidents
from hbmwatch.evaluation.incident_scoring import names_cause, pages, score_run
from hbmwatch.evaluation.pager import Notification, PagerRecord
from hbmwatch.evaluation.run import EVAL_START, start_time
from hbmwatch.records import (
    Alert,
    AlertState,
    Evidence,
    Incident,
    IncidentEvent,
    IncidentState,
    RankedCause,
    Severity,
)
from hbmwatch.simulator.scenario import FAULT_SPECS, FaultKind

T0 = 1_800_000_000.0
CAUSES = {"coolant_degradation": "cooling", "noisy_neighbour": "co_tenant",
          "power_cap": "power_cap", "degraded_stack": "thermal", "stuck_sensor": "sensor",
          "xid_fatal": "gpu_error", "target_down": "target_down"}  # fmt: skip


def fault(kind: str, gpus: list[tuple[str, str]], onset: float = 600, end: float = 1800,
          rack: str = "r1", i: int = 0) -> dict[str, Any]:  # fmt: skip
    return {
        "id": f"fault-{i}", "kind": kind, "onset_unix": T0 + onset, "end_unix": T0 + end,
        "affected_gpus": [{"cluster": "c", "rack": rack, "host": h, "gpu": g} for h, g in gpus],
        "affected_services": [], "affected_jobs": [],
        "expected_findings": [str(k) for k in FAULT_SPECS[FaultKind(kind)]["findings"]],
        "expected_root_cause": CAUSES[kind],
    }  # fmt: skip


@dataclass
class Run:
    truth: dict[str, Any]
    pager: PagerRecord = field(default_factory=PagerRecord)
    scenario: str = "test"
    seed: int = 0
    simulated_seconds: float = 3600.0

    def alert(self, name: str, entity: dict[str, str], fired: float, incident: str,
              kind: str = "thermal_excursion", severity: str = "warning") -> Alert:  # fmt: skip
        labels = {"cluster": "c", **entity, "alertname": name, "kind": kind,
                  "severity": severity, "incident": incident}  # fmt: skip
        ms = int((T0 + fired) * 1000)
        a = Alert(
            id=f"{name}-{len(self.pager.alerts)}",
            fingerprint=f"fp{len(self.pager.alerts)}",
            labels=labels,
            annotations={},
            state=AlertState.FIRING,
            severity=Severity(severity),
            finding_id="f",
            started_ms=ms,
            updated_ms=ms,
            firing_ms=ms,
            incident_id=incident,
        )
        self.pager.alerts[a.id] = a
        return a

    def incident(self, inc_id: str, at: float, title: str, causes: tuple[str, ...] = (),
                 series: str = "") -> None:  # fmt: skip
        evidence = (Evidence(series, "corr", 0.9),) if series else ()
        ranked = tuple(RankedCause(c, 1.0 - i / 10, evidence if i == 0 else ())
                       for i, c in enumerate(causes))  # fmt: skip
        ms = int((T0 + at) * 1000)
        inc = Incident(
            id=inc_id,
            title=title,
            scope={"cluster": "c"},
            state=IncidentState.OPEN,
            severity=Severity.WARNING,
            opened_ms=ms,
            updated_ms=ms,
            causes=ranked,
        )
        self.pager.incidents.setdefault(inc_id, []).append((ms, inc))

    def page(self, at: float, *alerts: Alert) -> None:
        ms = int((T0 + at) * 1000)
        body = tuple(webhook_alert(a, ms, "http://x") for a in alerts)
        self.pager.notifications.append(Notification(ms, alerts[0].incident_id or "", body))


def truth(*faults: dict[str, Any], gpus: int = 64, evaluated_s: float = 3600) -> dict[str, Any]:
    return {"start_unix": T0, "gpus": gpus, "evaluated_s": evaluated_s, "faults": list(faults)}


COOLANT = fault("coolant_degradation", [("n1", "0"), ("n1", "1"), ("n2", "0")])
SERIES = 'gpu_memory_temperature_celsius{cluster="c",host="n1",gpu="0"}'


def test_one_incident_right_cause_entity_evidence_and_page_delay() -> None:
    run = Run(truth(COOLANT))
    a = run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 620, "inc-1")
    run.incident("inc-1", 620, "rack r1 cooling: HBM +20 C over 4 min", ("cooling", "thermal"),
                 SERIES)  # fmt: skip
    run.page(625, a)
    (out,) = score_run(run).outcomes
    assert out.incidents == ["inc-1"] and out.one_incident and not out.merged_with
    assert out.page_delay_s == pytest.approx(25.0)
    assert (out.top1, out.top3, out.title_right) == (True, True, True)
    assert (out.names_entity, out.has_evidence) == (True, True)
    scored = score_run(run)
    assert (scored.pages, scored.unexplained_pages, scored.unexplained_incidents) == (1, [], [])


def test_entity_from_another_gpu_and_no_evidence_are_scored_so() -> None:
    run = Run(truth(COOLANT))
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 620, "inc-1")
    run.incident("inc-1", 620, "rack r1: hotspot at 62 C", ("thermal", "cooling"),
                 'gpu_memory_temperature_celsius{cluster="c",host="n9",gpu="5"}')  # fmt: skip
    (out,) = score_run(run).outcomes
    assert (out.top1, out.top3, out.title_right, out.names_entity) == (False, True, False, False)
    assert out.page_delay_s is None  # no page was sent
    run.incident("inc-1", 630, "rack r1 cooling", ("cooling",))
    (out,) = score_run(run).outcomes  # judged at the fault's end: the last version
    assert (out.top1, out.has_evidence) == (True, False)


def test_two_incidents_for_one_fault_is_not_one() -> None:
    run = Run(truth(COOLANT))
    run.alert("HBMThermalExcursion", {"rack": "r1", "host": "n1", "gpu": "0"}, 610, "inc-1")
    run.alert("HBMThermalExcursion", {"rack": "r1", "host": "n2", "gpu": "0"}, 615, "inc-2")
    run.incident("inc-1", 610, "a", ("cooling",))
    run.incident("inc-2", 615, "b", ("cooling",))
    (out,) = score_run(run).outcomes
    assert out.incidents == ["inc-1", "inc-2"] and not out.one_incident
    assert out.judged == "inc-1"  # the incident of the first alert to fire


def test_merge_of_different_causes_counts_against_both() -> None:
    noisy = fault("noisy_neighbour", [("n1", "3")], i=0)
    cap = fault("power_cap", [("n2", "1")], i=1)
    stack = fault("degraded_stack", [("n3", "0")], rack="r2", i=2)
    stack2 = fault("degraded_stack", [("n4", "0")], rack="r2", i=3)
    run = Run(truth(noisy, cap, stack, stack2))
    run.alert("P99LatencyRegression", {"rack": "r1", "host": "n1", "gpu": "3"}, 700, "inc-1",
              kind="p99_regression")  # fmt: skip
    run.alert("GPUThrottling", {"rack": "r1", "host": "n2", "gpu": "1"}, 705, "inc-1",
              kind="throttle")  # fmt: skip
    run.alert("HBMThermalExcursion", {"rack": "r2", "host": "n3", "gpu": "0"}, 700, "inc-2")
    run.alert("HBMThermalExcursion", {"rack": "r2", "host": "n4", "gpu": "0"}, 710, "inc-2")
    run.incident("inc-1", 700, "rack r1: power cap", ("power_cap",))
    run.incident("inc-2", 700, "rack r2: thermal", ("thermal",))
    outs = {o.fault_id: o for o in score_run(run).outcomes}
    assert outs["fault-0"].merged_with == ["fault-1"] and not outs["fault-0"].one_incident
    assert outs["fault-1"].merged_with == ["fault-0"] and not outs["fault-1"].one_incident
    assert outs["fault-1"].top1 and not outs["fault-0"].top1
    # Two faults of one cause may share an incident.
    assert outs["fault-2"].one_incident and outs["fault-3"].one_incident


def test_an_alert_covers_only_faults_that_raise_its_kind() -> None:
    """A rack's cooling alert is not about a stuck sensor on one of its GPUs, nor a host's
    target-down alert about an XID on one of its GPUs: right incidents stay right."""
    coolant = fault("coolant_degradation", [("n1", "0"), ("n1", "1")], i=0)
    stuck = fault("stuck_sensor", [("n1", "1")], onset=700, end=800, i=1)
    down = fault("target_down", [("n2", "0"), ("n2", "1")], onset=900, end=950, i=2)
    xid = fault("xid_fatal", [("n2", "1")], onset=905, end=1500, i=3)
    run = Run(truth(coolant, stuck, down, xid))
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 650, "inc-cool")
    run.alert("SensorStuck", {"rack": "r1", "host": "n1", "gpu": "1"}, 710, "inc-dq",
              kind="data_quality")  # fmt: skip
    run.alert("HbmwatchTargetDown", {"rack": "r1", "host": "n2"}, 910, "inc-down",
              kind="data_quality")  # fmt: skip
    run.alert("GPUErrors", {"rack": "r1", "host": "n2", "gpu": "1"}, 955, "inc-xid",
              kind="gpu_errors")  # fmt: skip
    run.incident("inc-cool", 650, "rack r1: cooling", ("cooling",))
    run.incident("inc-dq", 710, "n1: sensor", ("sensor",))
    run.incident("inc-down", 910, "n2: target_down", ("target_down",))
    run.incident("inc-xid", 955, "n2: gpu_error", ("gpu_error",))
    outs = {o.fault_id: o for o in score_run(run).outcomes}
    assert [outs[f"fault-{i}"].incidents for i in range(4)] == [
        ["inc-cool"], ["inc-dq"], ["inc-down"], ["inc-xid"]]  # fmt: skip
    assert all(o.one_incident and o.top1 for o in outs.values())


def test_a_rack_wide_alert_does_not_cover_one_gpus_fault() -> None:
    stack = {**fault("degraded_stack", [("n1", "7")]), "target": {"host": "n1", "gpu": 7}}
    coolant = {**fault("coolant_degradation", [("n1", "7"), ("n1", "6")], onset=900, i=1),
               "target": {"rack": "r1"}}  # fmt: skip
    run = Run(truth(stack, coolant))
    run.alert("HBMThermalExcursion", {"rack": "r1", "host": "n1", "gpu": "7"}, 640, "inc-gpu")
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 950, "inc-rack")
    run.alert("HBMThermalExcursion", {"rack": "r1", "host": "n1", "gpu": "6"}, 960, "inc-rack")
    run.incident("inc-gpu", 640, "n1: thermal", ("thermal",))
    run.incident("inc-rack", 950, "rack r1: cooling", ("cooling",))
    outs = {o.fault_id: o for o in score_run(run).outcomes}
    assert outs["fault-0"].incidents == ["inc-gpu"] and outs["fault-0"].one_incident
    assert outs["fault-1"].incidents == ["inc-rack"] and outs["fault-1"].one_incident


@pytest.mark.parametrize(("change_at", "right"), [(680, True), (700, False)])
def test_incident_is_judged_a_minute_after_its_page(change_at: float, right: bool) -> None:
    run = Run(truth(COOLANT))
    a = run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 620, "inc-1")
    run.incident("inc-1", 620, "rack r1: target down", ("target_down",))
    run.incident("inc-1", change_at, "rack r1 cooling", ("cooling",))
    run.page(625, a)  # read at 685 s
    (out,) = score_run(run).outcomes
    assert out.top1 is right


def test_cover_window_is_onset_minus_30_to_end_plus_60() -> None:
    run = Run(truth(COOLANT))
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 569, "inc-early")
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 1861, "inc-late")
    run.incident("inc-early", 569, "x")
    run.incident("inc-late", 1861, "x")
    (out,) = score_run(run).outcomes
    assert out.incidents == []
    run.alert("HBMRackThermalExcursion", {"rack": "r1"}, 571, "inc-ok")
    assert score_run(run).outcomes[0].incidents == ["inc-ok"]


def test_unexplained_pages_and_incidents_per_healthy_gpu_hour() -> None:
    run = Run(truth(COOLANT, gpus=64, evaluated_s=3600))
    hot = run.alert("GPUThrottling", {"rack": "r9", "host": "n9", "gpu": "0"}, 100, "inc-9",
                    kind="throttle")  # fmt: skip
    quiet = run.alert("GPUThrottling", {"rack": "r9", "host": "n9", "gpu": "1"}, 110, "inc-9",
                      kind="throttle", severity="info")  # fmt: skip
    # data quality on the faulty rack: a coolant fault does not explain it
    dq = run.alert("HbmwatchDataQuality", {"rack": "r1", "host": "n1", "gpu": "0"}, 700,
                   "inc-dq", kind="data_quality")  # fmt: skip
    run.incident("inc-9", 100, "rack r9: throttle")
    run.incident("inc-dq", 700, "host n1: data")
    run.page(100, hot)
    run.page(160, hot, quiet)  # a repeat and an info alert: not a page
    run.page(700, dq)
    scored = score_run(run)
    assert scored.pages == 2
    assert scored.unexplained_pages == [pytest.approx(T0 + 100), pytest.approx(T0 + 700)]
    assert scored.unexplained_incidents == ["inc-9", "inc-dq"]
    faulty_h = 3 * 1200 / 3600
    assert scored.healthy_gpu_hours == pytest.approx(64 - faulty_h)
    report = score_incidents([run])
    assert report.unexplained_pages_per_1000_gpu_h == pytest.approx(2 / (64 - faulty_h) * 1000)
    assert report.checks["unexplained_pages"] is False


def test_start_up_pages_count_from_the_first_second() -> None:
    run = Run(truth(COOLANT))
    down = run.alert("HbmwatchTargetDown", {"host": "n5", "target": "http://n5"}, 0, "inc-5",
                     kind="data_quality")  # fmt: skip
    run.incident("inc-5", 0, "host n5: target down")
    run.page(1, down)
    assert len(score_run(run).unexplained_pages) == 1


def test_noisy_neighbour_titled_or_ranked_thermal_is_blamed_on_heat() -> None:
    for title, causes, blamed in [
        ("host n1: p99 3x, co-tenant", ("co_tenant",), False),
        ("host n1: HBM thermal excursion", ("co_tenant",), True),
        ("host n1: p99 3x", ("cooling", "co_tenant"), True),
    ]:
        run = Run(truth(fault("noisy_neighbour", [("n1", "3")])))
        run.alert("P99LatencyRegression", {"host": "n1", "gpu": "3"}, 700, "inc-1",
                  kind="p99_regression")  # fmt: skip
        run.incident("inc-1", 700, title, causes)
        (out,) = score_run(run).outcomes
        assert out.blamed_heat is blamed, title
        assert out.title_right is (not blamed)


def test_title_names_cause_as_words() -> None:
    assert names_cause("rack r0 (c0): power-cap at 700 W", "power_cap")
    assert names_cause("Co_Tenant on n1", "co_tenant")
    assert not names_cause("rack r0: hotspot at 62 C", "cooling")
    assert not names_cause("pcie_replays_total", "pcie replays total extra")


def test_pages_need_a_new_firing_alert_of_paging_severity() -> None:
    run = Run(truth())
    a = run.alert("GPUThrottling", {"host": "n1", "gpu": "0"}, 10, "inc-1", kind="throttle")
    run.page(10, a)
    run.page(20, a)
    resolved = dataclasses.replace(a, state=AlertState.RESOLVED, resolved_ms=a.firing_ms)
    ms = int((T0 + 30) * 1000)
    run.pager.notifications.append(Notification(ms, "inc-1", (webhook_alert(resolved, ms, ""),)))
    assert [p.at_s for p in pages(run.pager.notifications)] == [pytest.approx(T0 + 10)]


def test_report_table_json_and_checks() -> None:
    good = Run(truth(COOLANT))
    a = good.alert("HBMRackThermalExcursion", {"rack": "r1"}, 620, "inc-1")
    good.incident("inc-1", 620, "rack r1 cooling", ("cooling",), SERIES)
    good.page(640, a)
    missed = Run(truth(COOLANT), scenario="other", seed=1)
    report = score_incidents([good, missed])
    assert [(g.scenario, g.kind, g.n) for g in report.by_scenario] == [
        ("other", "coolant_degradation", 1), ("test", "coolant_degradation", 1)]  # fmt: skip
    cool = report.by_kind["coolant_degradation"]
    assert (cool.n, cool.one_incident, cool.paged, cool.top1) == (2, 0.5, 0.5, 0.5)
    assert cool.page_median_s == pytest.approx(40.0)
    assert report.thermal_page_median_s == float("inf")  # the missed one counts as never
    assert report.checks["one_incident:coolant_degradation"] is False
    assert report.checks["thermal_page_median"] is False and not report.passed
    data = json.loads(json.dumps(report.to_json()))
    assert data["thermal_page_median_s"] is None and data["passed"] is False
    assert len(data["faults"]) == 2 and data["faults"][0]["page_delay_s"] == pytest.approx(40.0)
    rows = report.rows()
    assert rows[0][0] == "other" and rows[-1][:3] == ("all", "passed", "NO")
    assert {len(r) for r in rows} == {12}
    assert report.table().row_count == len(rows)


def test_start_hours() -> None:
    assert start_time("x", 1) is None
    at = start_time("x", 1, hour=14 + 50 / 60)
    assert at == pytest.approx(EVAL_START.replace(hour=14, minute=50).timestamp())
    drawn = start_time("healthy", 101, random_hour=True)
    assert drawn == start_time("healthy", 101, random_hour=True)  # reruns agree
    assert drawn != start_time("healthy", 102, random_hour=True)
    midnight = EVAL_START.replace(hour=0).timestamp()
    assert drawn is not None and midnight <= drawn < midnight + 86_400 and drawn % 60 == 0
    with pytest.raises(ValueError, match="not in"):
        start_time("x", 1, hour=24)


def test_eval_start_options_are_checked_before_any_run() -> None:
    from typer.testing import CliRunner

    from hbmwatch.cli import app

    both = CliRunner().invoke(app, ["eval", "healthy", "--start-hour", "3", "--random-start"])
    assert both.exit_code == 2 and "choose one" in both.output
    late = CliRunner().invoke(app, ["eval", "healthy", "--start-hour", "24"])
    assert late.exit_code == 2 and "Traceback" not in late.output


def test_an_incident_merged_into_another_is_not_unexplained() -> None:
    """Its alerts moved to the incident it merged into; it is judged there, not counted as
    an incident no fault explains."""
    run = Run(truth(COOLANT))
    hot = run.alert("HBMTemperatureHigh", {"rack": "r1", "host": "n1", "gpu": "0"}, 610, "inc-a")
    run.incident("inc-a", 610, "rack r1 cooling", ("cooling",), SERIES)
    run.incident("inc-b", 605, "host n1 thermal", ("thermal",), SERIES)
    (ms, merged), *_ = run.pager.incidents["inc-b"]
    event = IncidentEvent(ms + 5_000, "merged", "merged into inc-a")
    run.pager.incidents["inc-b"].append(
        (ms + 5_000, dataclasses.replace(merged, state=IncidentState.RESOLVED, timeline=(event,)))
    )
    run.page(610, hot)
    assert score_run(run).unexplained_incidents == []
