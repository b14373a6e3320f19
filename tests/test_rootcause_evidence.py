"""Ranking follows the evidence (issue 13 point 4): heat is named by how far it spreads, a
cause that came after the regression is never first, and every cause names its entity and
carries its evidence; one without evidence is not shown as confident."""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors.base import make_finding
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.rootcause import RootCause
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.records import (
    NO_EVIDENCE,
    UNEVIDENCED_MAX,
    Evidence,
    Finding,
    RankedCause,
    Severity,
    capped_if_unevidenced,
)
from hbmwatch.taxonomy import Cause, FindingKind
from tests.test_detect_rootcause import ONSET, T, healthy, ramp, rank
from tests.test_detect_rootcause import history as one_gpu_history

RACKS = ("r1", "r2", "r3")
HOT = ("h1", "2")  # the regressing GPU: rack r1, host h1, GPU 2


def _labels(rack: str, host: str, gpu: str) -> dict[str, str]:
    return {"cluster": "c", "rack": rack, "host": host, "gpu": gpu, "sku": "H200"}


def fleet_history(warm: dict[tuple[str, str], float]) -> Context:
    """Three racks of 4 GPUs (r1 holds h1, r2 h2, r3 h3); ``warm`` maps (host, gpu) to the
    load-adjusted rise (C) it reaches from 150 s before the regression.  The regressing GPU
    also throttles on HBM heat, so heat is its strongest candidate."""
    ctx = Context()
    gpus, wls = Entities(), Entities()
    keys = []
    for i, rack in enumerate(RACKS, start=1):
        for g in range(4):
            host, gpu = f"h{i}", str(g)
            gpus.add(f"c/{host}/{gpu}", _labels(rack, host, gpu))
            keys.append((host, gpu))
    wls.add("chat/e2e", {**_labels("r1", *HOT), "service": "chat", "phase": "e2e"})
    rng = np.random.default_rng(11)
    signals = [healthy(rng) for _ in keys]
    for k, s in zip(keys, signals, strict=True):
        s["thermal_rise"] = s["thermal_rise"] + ramp(ONSET - 150, warm.get(k, 0.0))
        if k == HOT:
            s["thr_hbm"] = ramp(ONSET - 10, 0.6)
    for start in range(0, T, 60):
        f = Frame(start * 1000, 1000, 60, gpus, wls, Entities(), {},
                  np.full((len(keys), MAX_STACKS, 60), np.nan), {}, {}, {}, {}, {})  # fmt: skip
        for name in signals[0]:
            target = f.derived if name in ("thermal_rise", "bw_dev") else f.gpu
            target[name] = np.stack([s[name][start : start + 60] for s in signals])
        ctx.append(f)
        t = np.arange(start, start + 60)
        excess = np.where(t >= ONSET, 0.9, 0.0) + np.random.default_rng(t[0]).normal(0, 0.05, 60)
        ctx.append_workloads(f, {"lat_excess": excess[None, :], "requests": np.full((1, 60), 5.0)})
    return ctx


def rank_on(ctx: Context, extra: list[Finding] | None = None) -> tuple[RankedCause, ...]:
    frame = Frame((T - 60) * 1000, 1000, 60, Entities(), Entities(), Entities(), {},
                  np.zeros((0, MAX_STACKS, 60)), {}, {}, {}, {}, {})  # fmt: skip
    frame.context = ctx
    reg = make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency",
        entity={**_labels("r1", *HOT), "service": "chat", "phase": "e2e"},
        severity=Severity.WARNING, summary="p99 2.5x", started_ms=ONSET * 1000,
        raised_ms=(ONSET + 30) * 1000, updated_ms=T * 1000,
    )  # fmt: skip
    frame.open_findings = [reg, *(extra or [])]
    return RootCause().update(frame)[0].causes


def per_gpu_thermal_finding() -> Finding:
    """What the thermal detector said of a coolant loss: this GPU alone runs hot."""
    return make_finding(
        kind=FindingKind.THERMAL_EXCURSION, detector="thermal", entity=_labels("r1", *HOT),
        severity=Severity.WARNING, summary="hotspot at 62 C", started_ms=(ONSET - 100) * 1000,
        raised_ms=(ONSET - 90) * 1000, updated_ms=T * 1000,
        causes=[RankedCause(Cause.THERMAL, 0.9, summary="its rack's other GPUs do not")],
    )  # fmt: skip


def test_a_rack_rising_together_is_cooling_not_thermal_though_a_finding_says_thermal() -> None:
    rack = {("h1", str(g)): 9.0 for g in range(4)}
    causes = rank_on(fleet_history(rack), [per_gpu_thermal_finding()])
    top = causes[0]
    assert top.cause == Cause.COOLING, causes
    assert dict(top.entity) == {"cluster": "c", "rack": "r1"}
    assert top.evidence[0].series.startswith("load-adjusted rise of")
    assert 'rack="r1"' in top.evidence[0].series and top.evidence[0].value == 1.0
    assert Cause.THERMAL not in [c.cause for c in causes]


def test_several_racks_rising_together_is_ambient() -> None:
    room = {(f"h{i}", str(g)): 8.0 for i in (1, 2, 3) for g in range(4)}
    top = rank_on(fleet_history(room))[0]
    assert top.cause == Cause.AMBIENT
    assert dict(top.entity) == {"cluster": "c"}


def test_one_gpu_rising_alone_stays_its_own() -> None:
    top = rank_on(fleet_history({HOT: 9.0}))[0]
    assert top.cause == Cause.HBM_THERMAL_THROTTLE
    assert dict(top.entity) == {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2"}


def test_a_cause_that_came_after_the_regression_is_never_first() -> None:
    """The real H200 capture: a copy slowed the requests, a GEMM hit the power cap 60 s
    later and its throttle (strong, well correlated) was ranked level with the copy."""
    s = healthy(np.random.default_rng(12))
    s["bw_dev"] = s["bw_dev"] + ramp(ONSET - 5, 0.03)  # a modest copy
    s["thr_power"] = ramp(ONSET + 60, 1.0)  # the cap: full residency, a minute later
    s["power_limit"] = np.full(T, 700.0)
    causes = rank(one_gpu_history(s))
    assert causes[0].cause == Cause.CO_TENANT, causes
    cap = next(c for c in causes if c.cause == Cause.POWER_CAP)
    assert "after the regression" in cap.summary
    assert cap.confidence < causes[0].confidence


def test_only_a_late_cause_means_no_cause_first() -> None:
    s = healthy(np.random.default_rng(13))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET + 120, 400.0)
    causes = rank(one_gpu_history(s))
    assert causes[0].cause == Cause.NONE
    assert causes[1].cause == Cause.PCIE and "after the regression" in causes[1].summary


def test_every_cause_names_its_entity_and_evidence() -> None:
    s = healthy(np.random.default_rng(14))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET - 10, 400.0)
    s["thr_power"] = ramp(ONSET - 20, 0.3)
    for c in rank(one_gpu_history(s)):
        assert dict(c.entity) == {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2"}
        assert c.summary.startswith("h1 GPU 2: ")
        assert c.evidence, c
        for e in c.evidence:
            assert e.series and e.window_start_ms is not None and e.window_end_ms is not None
            assert e.lag_seconds is not None and e.strength is not None


def test_no_cause_has_no_evidence_and_is_not_confident() -> None:
    causes = rank(one_gpu_history(healthy(np.random.default_rng(15))))
    top = causes[0]
    assert top.cause == Cause.NONE and not top.evidence
    assert top.confidence <= UNEVIDENCED_MAX
    assert NO_EVIDENCE in top.summary
    assert dict(top.entity) == {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2"}


def test_merged_causes_without_evidence_are_capped() -> None:
    ev = Evidence(series="x", statistic="mean", value=1.0)
    out = [
        capped_if_unevidenced(c)
        for c in (RankedCause(Cause.THERMAL, 0.9), RankedCause(Cause.PCIE, 0.9, (ev,)))
    ]
    assert out[0].confidence == UNEVIDENCED_MAX and NO_EVIDENCE in out[0].summary
    assert out[1].confidence == 0.9
