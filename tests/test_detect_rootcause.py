"""Root-cause ranking on constructed histories: the right cause first, with its evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hbmwatch.detectors.base import make_finding
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.leadlag import lagged_corr as _lagged_corr
from hbmwatch.detectors.rootcause import RootCause
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.records import RankedCause, Severity
from hbmwatch.taxonomy import Cause, FindingKind

GPU = {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2", "sku": "H200"}
WL = {"cluster": "c", "rack": "r1", "host": "h1", "gpu": "2", "service": "chat", "phase": "e2e"}
T = 900  # seconds of history
ONSET = 600  # the regression starts here


def healthy(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = T
    return {
        "mem_temp": 60 + rng.normal(0, 0.4, n),
        "hot_temp": 55 + rng.normal(0, 0.4, n),
        "power": 450 + rng.normal(0, 5, n),
        "power_limit": np.full(n, 700.0),
        "clock": 1.98e9 + rng.normal(0, 1e6, n),
        "bw": 0.5 + rng.normal(0, 0.01, n),
        "util": 0.6 + rng.normal(0, 0.01, n),
        "thr_thermal": np.zeros(n),
        "thr_hbm": np.zeros(n),
        "thr_power": np.zeros(n),
        "pcie_replays": rng.poisson(0.01, n).astype(float),
        "fabric_errors": np.zeros(n),
        "thermal_rise": rng.normal(0, 0.3, n),
        "bw_dev": rng.normal(0, 0.01, n),
    }


def history(signals: dict[str, np.ndarray], lat_from: int = ONSET) -> Context:
    """A context holding ``signals`` for one GPU and a latency excess from ``lat_from``."""
    ctx = Context()
    gpus, wls = Entities(), Entities()
    gpus.add("c/h1/2", GPU)
    wls.add("chat/e2e", WL)
    for start in range(0, T, 60):
        f = Frame(start * 1000, 1000, 60, gpus, wls, Entities(), {},
                  np.full((1, MAX_STACKS, 60), np.nan), {}, {}, {}, {}, {})  # fmt: skip
        for name, values in signals.items():
            target = f.derived if name in ("thermal_rise", "bw_dev") else f.gpu
            target[name] = values[None, start : start + 60]
        ctx.append(f)
        t = np.arange(start, start + 60)
        excess = np.where(t >= lat_from, 0.9, 0.0) + np.random.default_rng(t[0]).normal(0, 0.05, 60)
        ctx.append_workloads(f, {"lat_excess": excess[None, :], "requests": np.full((1, 60), 5.0)})
    return ctx


def regression(causes: tuple[RankedCause, ...] = ()) -> object:
    return make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency", entity=WL,
        severity=Severity.WARNING, summary="p99 of chat/e2e 2.5x its baseline",
        started_ms=ONSET * 1000, raised_ms=(ONSET + 30) * 1000, updated_ms=T * 1000,
        causes=causes,
    )  # fmt: skip


def rank(ctx: Context, extra: list[object] | None = None) -> tuple[RankedCause, ...]:
    frame = Frame((T - 60) * 1000, 1000, 60, Entities(), Entities(), Entities(), {},
                  np.zeros((0, MAX_STACKS, 60)), {}, {}, {}, {}, {})  # fmt: skip
    frame.context = ctx
    frame.open_findings = [regression(), *(extra or [])]
    out = RootCause().update(frame)
    assert len(out) == 1 and out[0].kind == FindingKind.P99_REGRESSION
    return out[0].causes


def ramp(n_before: int, level: float, n: int = T) -> np.ndarray:
    return np.where(np.arange(n) >= n_before, level, 0.0)


def test_power_cap_first_with_the_throttle_series_as_evidence() -> None:
    s = healthy(np.random.default_rng(1))
    s["thr_power"] = ramp(ONSET - 20, 0.8)
    s["power_limit"] = np.where(np.arange(T) >= ONSET - 20, 385.0, 700.0)
    s["clock"] = np.where(np.arange(T) >= ONSET - 20, 1.3e9, 1.98e9)
    causes = rank(history(s))
    assert causes[0].cause == Cause.POWER_CAP
    assert causes[0].confidence > 0.4
    assert any("gpu_throttle_seconds_total" in e.series for e in causes[0].evidence)
    assert "no thermal cause" in causes[0].summary
    # the clock drop is a mechanism: it ranks under the cap that explains it
    assert [c.cause for c in causes].index(Cause.CLOCK_DROP) > 0


def test_co_tenant_is_not_blamed_on_heat_though_memory_warms_a_little() -> None:
    s = healthy(np.random.default_rng(2))
    s["bw_dev"] = s["bw_dev"] + ramp(ONSET - 5, 0.09)
    s["bw"] = s["bw"] + ramp(ONSET - 5, 0.09)
    s["mem_temp"] = s["mem_temp"] + ramp(ONSET - 5, 1.5)  # warms with the copy, no excursion
    s["thermal_rise"] = s["thermal_rise"] + ramp(ONSET - 5, 0.6)
    causes = rank(history(s))
    assert causes[0].cause == Cause.CO_TENANT
    assert "no thermal cause" in causes[0].summary
    assert not Cause(causes[0].cause).is_thermal


def test_rack_cooling_named_from_the_open_rack_finding() -> None:
    s = healthy(np.random.default_rng(3))
    s["thermal_rise"] = s["thermal_rise"] + np.clip((np.arange(T) - 450) / 20, 0, 9)
    s["thr_hbm"] = ramp(ONSET - 10, 0.5)
    rack = make_finding(
        kind=FindingKind.THERMAL_EXCURSION, detector="thermal",
        entity={"cluster": "c", "rack": "r1"}, severity=Severity.WARNING,
        summary="rack r1 warms alone", started_ms=460_000, raised_ms=470_000,
        updated_ms=T * 1000, causes=[RankedCause(Cause.COOLING, 0.8)],
    )  # fmt: skip
    causes = rank(history(s), [rack])
    assert causes[0].cause == Cause.COOLING
    assert dict(causes[0].entity) == {"cluster": "c", "rack": "r1"}  # the rack, not the GPU
    names = {e.series for e in causes[0].evidence}
    assert any(n.startswith("load-adjusted rise of gpu_memory_temperature_celsius") for n in names)


def test_hbm_throttle_without_a_thermal_finding() -> None:
    s = healthy(np.random.default_rng(4))
    s["thermal_rise"] = s["thermal_rise"] + ramp(ONSET - 60, 7.0)
    s["thr_hbm"] = ramp(ONSET - 30, 0.6)
    causes = rank(history(s))
    assert causes[0].cause == Cause.HBM_THERMAL_THROTTLE


def test_pcie_replays_leading_the_regression() -> None:
    s = healthy(np.random.default_rng(5))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET - 10, 400.0)
    causes = rank(history(s))
    assert causes[0].cause == Cause.PCIE
    ev = causes[0].evidence[0]
    assert ev.value > 300 and ev.threshold == 20.0 and ev.lag_seconds is not None


def test_nothing_changed_says_no_cause_found() -> None:
    causes = rank(history(healthy(np.random.default_rng(6))))
    assert causes[0].cause == Cause.NONE
    assert "no thermal cause" in causes[0].summary


def test_a_cause_that_starts_after_the_regression_is_discounted() -> None:
    s = healthy(np.random.default_rng(7))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET + 200, 400.0)
    s["bw_dev"] = s["bw_dev"] + ramp(ONSET - 5, 0.09)
    causes = rank(history(s))
    assert causes[0].cause == Cause.CO_TENANT


def test_state_keeps_rankings_across_a_restart() -> None:
    s = healthy(np.random.default_rng(8))
    s["pcie_replays"] = s["pcie_replays"] + ramp(ONSET - 10, 400.0)
    ctx = history(s)
    det = RootCause(rank_for_s=60)
    frame = Frame((T - 60) * 1000, 1000, 60, Entities(), Entities(), Entities(), {},
                  np.zeros((0, MAX_STACKS, 60)), {}, {}, {}, {}, {})  # fmt: skip
    frame.context, frame.open_findings = ctx, [regression()]
    first = det.update(frame)[0].causes
    restored = RootCause(rank_for_s=60)
    restored.load_state_dict(json.loads(json.dumps(det.state_dict())))
    frame.context = Context()  # after a restart the ring is empty; the ranking is kept
    again = restored.update(frame)[0].causes
    assert again == first


@pytest.mark.parametrize("entity_gpu", ["2", None])
def test_a_training_job_looks_at_every_gpu_of_its_node(entity_gpu: str | None) -> None:
    s = healthy(np.random.default_rng(9))
    s["fabric_errors"] = ramp(ONSET - 30, 40.0)
    ctx = history(s)
    entity = {"cluster": "c", "rack": "r1", "host": "h1", "service": "pretrain", "phase": "step"}
    if entity_gpu:
        entity["gpu"] = entity_gpu
    reg = make_finding(
        kind=FindingKind.STEP_TIME_REGRESSION, detector="latency", entity=entity,
        severity=Severity.WARNING, summary="step time", started_ms=ONSET * 1000,
        raised_ms=ONSET * 1000, updated_ms=T * 1000,
    )  # fmt: skip
    frame = Frame((T - 60) * 1000, 1000, 60, Entities(), Entities(), Entities(), {},
                  np.zeros((0, MAX_STACKS, 60)), {}, {}, {}, {}, {})  # fmt: skip
    frame.context, frame.open_findings = ctx, [reg]
    out = RootCause().update(frame)
    assert out[0].causes[0].cause == Cause.FABRIC


def _lagged_corr_by_numpy(x: np.ndarray, y: np.ndarray, max_lag: int) -> tuple[float, int]:
    """The definition, one lag at a time with np.corrcoef."""
    best, best_lag = 0.0, 0
    n = min(len(x), len(y))
    for lag in range(max(0, min(max_lag, n - 3)) + 1):
        a, b = x[: n - lag], y[lag:n]
        ok = ~np.isnan(a) & ~np.isnan(b)
        if ok.sum() < 4 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
            continue
        r = float(np.corrcoef(a[ok], b[ok])[0, 1])
        if r > best:
            best, best_lag = r, lag
    return best, best_lag


def test_lagged_correlation_matches_numpy_at_every_lag() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        n1, n2 = rng.integers(0, 40, size=2)
        x, y = rng.normal(size=n1), rng.normal(size=n2)
        m, lag = min(n1, n2), int(rng.integers(0, 5))
        if m > lag and rng.random() < 0.5:  # y follows x by lag slots
            y[lag:m] = x[: m - lag] + rng.normal(scale=0.1, size=m - lag)
        x[rng.random(n1) < 0.2] = np.nan
        y[rng.random(n2) < 0.2] = np.nan
        if rng.random() < 0.1:
            x[:] = 1.0  # no variation: no correlation
        max_lag = int(rng.integers(0, 10))
        r, at = _lagged_corr(x, y, max_lag)
        expected, expected_at = _lagged_corr_by_numpy(x, y, max_lag)
        assert r == pytest.approx(expected, abs=1e-9) and at == expected_at
