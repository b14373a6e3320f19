"""A GPU error explains its services' regressions: ranked first, one incident, one page.

Root cause on constructed histories (as ``tests/test_detect_rootcause.py`` builds them),
then the findings through the alert engine, then the data-quality detector beside it.
"""

from __future__ import annotations

import numpy as np

from hbmwatch.alerts.engine import AlertEngine
from hbmwatch.detectors.base import make_finding
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.gpu_errors import GpuErrors
from hbmwatch.detectors.quality import DataQuality
from hbmwatch.detectors.rootcause import RootCause
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.gpu_errors import lookup
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.settings import AlertSettings
from hbmwatch.taxonomy import Cause, FindingKind
from tests.test_detect_rootcause import GPU, ONSET, T, healthy, history, ramp, rank, regression

GKEY = "c/h1/2"


def xid(code: str, signal: str, at_s: int) -> Finding:
    """The ``gpu_errors`` detector's finding for one event of ``code`` at ``at_s``."""
    t0 = at_s - at_s % 60
    gpus = Entities()
    gpus.add(GKEY, GPU)
    f = Frame(t0 * 1000, 1000, 60, gpus, Entities(), Entities(), {},
              np.full((1, MAX_STACKS, 60), np.nan), {}, {}, {}, {}, {})  # fmt: skip
    f.gpu[signal] = np.zeros((1, 60))
    f.gpu[signal][0, at_s - t0] = 1.0
    f.gpu_errors = {GKEY: {code: 1.0}}
    det = GpuErrors(storm_events=1)
    (found,) = det.update(f)
    return found


def off_the_bus(s: dict[str, np.ndarray], at_s: int) -> dict[str, np.ndarray]:
    """Every signal of the GPU stops at ``at_s``: it reads sentinels, which are dropped."""
    return {k: np.where(np.arange(T) >= at_s, np.nan, v) for k, v in s.items()}


def test_a_gpu_that_fell_off_the_bus_is_the_top_cause_with_its_code_and_meaning() -> None:
    s = off_the_bus(healthy(np.random.default_rng(11)), ONSET - 5)
    causes = rank(history(s), [xid("xid:79", "err_fatal", ONSET - 5)])
    top = causes[0]
    assert top.cause == Cause.GPU_ERROR and top.confidence >= 0.8
    assert dict(top.entity) == {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2"}
    assert top.summary.startswith(f"XID 79 on h1 GPU 2: {lookup('xid', 79).meaning} (fatal)")
    assert "started 5 s before the regression" in top.summary
    ev = top.evidence[0]
    assert 'code="79"' in ev.series and lookup("xid", 79).meaning in ev.note


def test_a_reset_code_outranks_link_errors_that_came_with_it() -> None:
    s = healthy(np.random.default_rng(12))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET - 10, 400.0)
    causes = rank(history(s), [xid("xid:95", "err_reset", ONSET - 20)])
    assert [c.cause for c in causes[:2]] == [Cause.GPU_ERROR, Cause.PCIE]
    assert lookup("xid", 95).meaning in causes[0].summary


def test_an_error_after_the_regression_is_not_its_cause() -> None:
    s = healthy(np.random.default_rng(13))
    s["bw_dev"] = s["bw_dev"] + ramp(ONSET - 5, 0.09)
    causes = rank(history(s), [xid("xid:79", "err_fatal", ONSET + 200)])
    names = [c.cause for c in causes]
    assert names[0] == Cause.CO_TENANT and Cause.GPU_ERROR in names
    late = causes[names.index(Cause.GPU_ERROR)]
    assert "it started after the regression" in late.summary


def test_a_benign_storm_or_another_gpus_error_explains_nothing() -> None:
    s = healthy(np.random.default_rng(14))
    storm = xid("xid:13", "err_benign", ONSET - 30)
    assert storm.severity is Severity.WARNING
    elsewhere = make_finding(
        kind=FindingKind.GPU_ERRORS, detector="gpu_errors",
        entity={**{k: GPU[k] for k in ("cluster", "rack", "host")}, "gpu": "5"},
        severity=Severity.CRITICAL, summary="XID 79 on h1 GPU 5", started_ms=(ONSET - 30) * 1000,
        raised_ms=(ONSET - 30) * 1000, updated_ms=T * 1000,
    )  # fmt: skip
    causes = rank(history(s), [storm, elsewhere])
    assert causes[0].cause == Cause.NONE
    assert Cause.GPU_ERROR not in [c.cause for c in causes]


def test_root_cause_reads_the_error_opened_in_the_same_cycle() -> None:
    """The detectors' order: gpu_errors states its finding before rootcause ranks."""
    ctx = history(off_the_bus(healthy(np.random.default_rng(15)), ONSET - 5))
    frame = Frame((T - 60) * 1000, 1000, 60, Entities(), Entities(), Entities(), {},
                  np.zeros((0, MAX_STACKS, 60)), {}, {}, {}, {}, {})  # fmt: skip
    frame.context = ctx
    frame.open_findings = [regression(), xid("xid:79", "err_fatal", ONSET - 5)]
    (out,) = RootCause().update(frame)
    assert out.causes[0].cause == Cause.GPU_ERROR


# -- incidents ------------------------------------------------------------------------------
def at(seconds: float) -> int:
    return int((1_800_000_000 + seconds) * 1000)


PLACE = {"cluster": "c0", "rack": "r0", "host": "r0-node1", "gpu": "3"}
XID79 = Evidence('gpu_error_events_total{cluster="c0",rack="r0",host="r0-node1",gpu="3",'
                 'scheme="xid",code="79"}', "error_events", 1.0, 1.0,
                 note="XID 79: GPU has fallen off the bus; action: fatal")  # fmt: skip


def gpu_error(start_s: float) -> Finding:
    summary = "XID 79 on r0-node1 GPU 3: GPU has fallen off the bus (fatal)"
    return make_finding(
        kind=FindingKind.GPU_ERRORS, detector="gpu_errors", entity=PLACE,
        severity=Severity.CRITICAL, summary=summary, started_ms=at(start_s),
        raised_ms=at(start_s), updated_ms=at(start_s), evidence=(XID79,),
        causes=(RankedCause(Cause.GPU_ERROR, 0.95, (XID79,), summary, PLACE),),
    )  # fmt: skip


def p99(start_s: float, service: str = "chat") -> Finding:
    cause = RankedCause(Cause.GPU_ERROR, 0.9, (XID79,), "XID 79 on r0-node1 GPU 3", PLACE)
    return make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency",
        entity={**PLACE, "service": service, "phase": "e2e"}, severity=Severity.WARNING,
        summary="p99 5x", started_ms=at(start_s), raised_ms=at(start_s), updated_ms=at(start_s),
        evidence=(Evidence(f'vllm_p99{{service="{service}"}}', "p99_over_baseline_ratio", 5.0),),
        causes=(cause, RankedCause(Cause.CLOCK_DROP, 0.1)),
    )  # fmt: skip


def test_the_xid_and_its_services_regressions_are_one_critical_incident_named_by_the_code() -> None:
    e = AlertEngine(AlertSettings())
    e.apply([gpu_error(0)], at(1))
    e.apply([p99(10), p99(12, "embed")], at(13))
    (inc,) = [i for i in e.incidents.values() if i.open]
    assert inc.severity is Severity.CRITICAL and len(inc.alerts) == 3
    assert inc.causes[0].cause == Cause.GPU_ERROR
    assert inc.title == (
        f"host r0-node1 (c0) gpu_error: XID 79 ({lookup('xid', 79).meaning}, fatal) on r0-node1 "
        "gpu 3, p99 up to 5.0x on 2 services"
    )
    names = {e.alerts[a].labels["alertname"] for a in inc.alerts}
    assert names == {"GPUErrors", "P99LatencyRegression"}
    page = next(a for a in e.alerts.values() if a.labels["alertname"] == "GPUErrors")
    assert page.labels["severity"] == "critical"
    assert "fallen off the bus" in page.annotations["summary"]
    assert "drain the node" in page.annotations["runbook"]


def _dq_frame(t0_s: int, up: bool) -> Frame:
    """The GPU's memory sensor and the host's exporter: reads, or sentinels only."""
    gpus, targets = Entities(), Entities()
    gpus.add("c0/r0-node1/3", PLACE)
    targets.add("r0-node1:9400", {"cluster": "c0", "rack": "r0", "host": "r0-node1",
                                  "target": "r0-node1:9400"})  # fmt: skip
    f = Frame(t0_s * 1000, 1000, 60, gpus, Entities(), targets, {},
              np.full((1, MAX_STACKS, 60), np.nan), {}, {}, {}, {}, {})  # fmt: skip
    f.gpu["power"] = np.full((1, 60), 400.0)
    f.gpu["mem_temp"] = np.full((1, 60), 55.0 if up else np.nan)
    f.tgt["up"] = np.ones((1, 60))
    f.tgt["sentinel"] = np.zeros((1, 60)) if up else np.ones((1, 60))
    return f


def test_sentinels_and_gaps_of_a_gpu_off_the_bus_are_explained_not_paged() -> None:
    quality = DataQuality()
    quality.update(_dq_frame(0, up=True))
    broken = [_dq_frame(60 + 60 * i, up=False) for i in range(6)]
    alone = DataQuality()
    alone.update(_dq_frame(0, up=True))
    without = [x for f in broken for x in alone.update(f)]
    assert {x.entity["check"] for x in without} == {"gap", "sentinel"}
    assert any(x.severity is not Severity.INFO for x in without)  # this test's precondition
    with_xid = []
    for f in broken:
        f.open_findings = [gpu_error(0)]
        with_xid += quality.update(f)
    assert {x.entity["check"] for x in with_xid} == {"gap", "sentinel"}
    assert all(x.severity is Severity.INFO for x in with_xid)
    assert all(x.top_cause == Cause.GPU_ERROR and "explained by XID 79" in x.summary
               for x in with_xid)  # fmt: skip


def test_sentinels_that_outlast_the_gpu_error_stay_explained_to_their_end() -> None:
    """The GPU comes back and its error closes; the exporter's sentinels stop a scrape later.
    That tail is the same outage: it stays at info, not a page of its own."""
    quality = DataQuality()
    quality.update(_dq_frame(0, up=True))
    out = []
    for i in range(6):
        f = _dq_frame(60 + 60 * i, up=False)
        f.open_findings = [gpu_error(0)] if i < 4 else []  # the error closed at minute 5
        out += quality.update(f)
    tail = [x for x in out if x.updated_ms >= 300_000]
    assert tail and all(x.severity is Severity.INFO for x in tail)
    assert all("explained by XID 79" in x.summary for x in tail)


def test_the_incident_of_a_gpu_off_the_bus_keeps_the_xid_as_its_cause() -> None:
    e = AlertEngine(AlertSettings())
    quality = DataQuality()
    quality.update(_dq_frame(0, up=True))
    e.apply([gpu_error(0)], at(1))
    for i in range(6):
        f = _dq_frame(60 + 60 * i, up=False)
        f.open_findings = [gpu_error(0)]
        e.apply([gpu_error(0), p99(10), *quality.update(f)], at(120 + 60 * i))
    (inc,) = [i for i in e.incidents.values() if i.open]
    assert inc.causes[0].cause == Cause.GPU_ERROR
    assert inc.title.startswith("host r0-node1 (c0) gpu_error: XID 79")


def test_the_title_of_a_failed_health_verdict_names_its_codes_not_a_storm() -> None:
    health = Evidence('gpu_health_status{host="r0-node1",gpu="3"}', "health_status", 2.0, 2.0)
    afid = Evidence('gpu_error_events_total{host="r0-node1",gpu="3",scheme="afid",code="30"}',
                    "error_events", 1.0, 10.0)  # fmt: skip
    f = make_finding(
        kind=FindingKind.GPU_ERRORS, detector="gpu_errors", entity=PLACE,
        severity=Severity.CRITICAL, summary="exporter health verdict fail on r0-node1 GPU 3",
        started_ms=at(0), raised_ms=at(0), updated_ms=at(0), evidence=(afid, health),
        causes=(RankedCause(Cause.GPU_ERROR, 0.95, (afid, health), "", PLACE),),
    )  # fmt: skip
    e = AlertEngine(AlertSettings())
    e.apply([f], at(1))
    (inc,) = e.incidents.values()
    assert (
        inc.title == "host r0-node1 (c0) gpu_error: health verdict fail (AFID 30) on r0-node1 gpu 3"
    )
