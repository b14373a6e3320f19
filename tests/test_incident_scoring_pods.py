"""Issue 18's incident scoring: GPU-error incidents name the pods on the GPU; pod moves stay
quiet; a GPU that fell off the bus explains its data-quality findings."""

from __future__ import annotations

import dataclasses
from typing import Any

from hbmwatch.evaluation.incident_report import score_incidents
from hbmwatch.evaluation.incident_scoring import incident_pods, score_run
from hbmwatch.evaluation.scoring import explains, fault_truth
from hbmwatch.records import Finding, Incident, Severity, Workload
from hbmwatch.taxonomy import FindingKind
from tests.test_incident_scoring import T0, Run, truth

PODS = ["inference/r1-n1-gpu3-abc-x1", "inference/r1-n1-gpu3-abc-y2"]


def gpu_fault(kind: str = "xid_fatal", pods: list[str] | None = None) -> dict[str, Any]:
    return {
        "id": "fault-0", "kind": kind, "onset_unix": T0 + 600, "end_unix": T0 + 1800,
        "affected_gpus": [{"cluster": "c", "rack": "r1", "host": "n1", "gpu": "3"}],
        "affected_services": ["n1-gpu3"], "affected_jobs": [], "affected_pods": pods or [],
        "expected_findings": ["gpu_errors"], "expected_root_cause": "gpu_error",
    }  # fmt: skip


def with_workloads(inc: Incident, pods: list[str]) -> Incident:
    """The incident naming ``pods`` (``namespace/pod``) as alerting records them."""
    made = tuple(
        Workload(namespace="inference", pod=p.split("/")[1], container="vllm", host="n1", gpu="3")
        for p in pods
    )
    return dataclasses.replace(inc, workloads=made)


def paged_run(pods_named: list[str] | None, *, on_the_page: bool = True) -> Run:
    """A paged XID incident naming ``pods_named``, and its page's ``workloads`` annotation
    naming them too (as alerting writes it) unless ``on_the_page`` is False."""
    from hbmwatch.alerts.workloads import describe

    run = Run(truth(gpu_fault(pods=PODS)))
    a = run.alert("HBMGpuErrors", {"rack": "r1", "host": "n1", "gpu": "3"}, 610, "inc-1",
                  kind="gpu_errors", severity="critical")  # fmt: skip
    run.incident("inc-1", 610, "XID 79 on n1 GPU 3: gpu error", ("gpu_error",),
                 'gpu_error_events_total{host="n1",gpu="3",scheme="xid",code="79"}')  # fmt: skip
    if pods_named is not None:
        ms, inc = run.pager.incidents["inc-1"][0]
        named = with_workloads(inc, pods_named)
        run.pager.incidents["inc-1"][0] = (ms, named)
        if on_the_page:
            workloads = {"workloads": describe(named.workloads)}
            a = dataclasses.replace(a, annotations=workloads)
    run.page(615, a)
    return run


def pod_names(pods: list[str]) -> list[str]:
    return [p.split("/")[1] for p in pods]


def test_gpu_error_incident_naming_every_pod_meets_pods_named() -> None:
    run = paged_run(PODS)
    run.truth["faults"][0]["affected_pods"] = pod_names(PODS)
    (out,) = score_run(run).outcomes
    assert out.top1 and out.title_right and out.page_delay_s == 15
    assert out.pods_expected == sorted(pod_names(PODS)) and out.pods_named is True
    report = score_incidents([run])
    assert report.pods_named == 1.0 and report.checks["pods_named"] is True
    assert report.checks["paged:xid_fatal"] is True and report.passed


def test_one_pod_missing_or_no_workloads_at_all_is_not_met() -> None:
    for named in (PODS[:1], None):
        run = paged_run(named)
        run.truth["faults"][0]["affected_pods"] = pod_names(PODS)
        (out,) = score_run(run).outcomes
        assert out.pods_named is False
        report = score_incidents([run])
        assert report.checks["pods_named"] is False and not report.passed


def test_pods_the_incident_names_but_the_page_does_not_are_not_met() -> None:
    """On-call reads the page first: pods named only on the incident are not enough."""
    run = paged_run(PODS, on_the_page=False)
    run.truth["faults"][0]["affected_pods"] = pod_names(PODS)
    (out,) = score_run(run).outcomes
    assert incident_pods(run.pager.incidents["inc-1"][0][1]) == set(pod_names(PODS))
    assert out.pods_named is False


def test_an_unpaged_fatal_fault_fails_its_paged_check() -> None:
    run = Run(truth(gpu_fault(pods=pod_names(PODS))))
    report = score_incidents([run])
    (out,) = report.faults
    assert out.page_delay_s is None and out.pods_named is False
    assert report.checks["paged:xid_fatal"] is False


def test_faults_without_pods_or_of_other_kinds_are_not_scored_for_pods() -> None:
    run = Run(truth(gpu_fault(kind="xid_storm", pods=pod_names(PODS)), gpu_fault()))
    outs = score_run(run).outcomes
    assert [o.pods_named for o in outs] == [None, None]
    assert score_incidents([run]).checks["pods_named"] is None


def test_incident_pods_reads_workloads_and_tolerates_their_absence() -> None:
    _ms, inc = paged_run(None).pager.incidents["inc-1"][0]
    assert incident_pods(inc) == set()
    assert incident_pods(with_workloads(inc, PODS)) == set(pod_names(PODS))


MOVE = {"id": "move-0", "at_unix": T0 + 300,
        "affected_gpus": [{"cluster": "c", "rack": "r1", "host": "n1", "gpu": "1"},
                          {"cluster": "c", "rack": "r1", "host": "n2", "gpu": "6"}]}  # fmt: skip


def test_a_pod_move_is_quiet_until_an_incident_opens_on_its_gpus() -> None:
    quiet = Run({**truth(), "moves": [MOVE]})
    quiet.alert("HBMThermal", {"rack": "r9", "host": "n9", "gpu": "0"}, 400, "inc-9")
    quiet.incident("inc-9", 400, "elsewhere")
    (move,) = score_run(quiet).moves
    assert move.quiet and move.incidents == []
    loud = Run({**truth(), "moves": [MOVE]})
    loud.alert("HBMP99", {"rack": "r1", "host": "n2", "gpu": "6", "service": "s"}, 420,
               "inc-2", kind="p99_regression")  # fmt: skip
    loud.incident("inc-2", 420, "service s: p99 up")
    (move,) = score_run(loud).moves
    assert not move.quiet and move.incidents == ["inc-2"]
    report = score_incidents([quiet, loud])
    assert report.moves_quiet == 0.5 and report.checks["moves_quiet"] is False
    assert score_incidents([quiet]).checks["moves_quiet"] is True


def test_no_moves_means_no_move_check() -> None:
    assert score_incidents([Run(truth())]).checks["moves_quiet"] is None


def test_a_gpu_off_the_bus_explains_its_sentinel_findings_a_sensor_fault_only_did() -> None:
    ms = int((T0 + 640) * 1000)
    sentinel = Finding(
        id="dq", fingerprint="dq", kind=FindingKind.DATA_QUALITY, severity=Severity.WARNING,
        detector="data_quality", entity={"cluster": "c", "host": "n1"},
        summary="sentinel values", started_ms=ms, raised_ms=ms, updated_ms=ms,
    )  # fmt: skip
    assert explains(sentinel, fault_truth(gpu_fault()))
    assert not explains(sentinel, fault_truth(gpu_fault(kind="xid_storm")))
