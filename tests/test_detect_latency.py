"""LatencyRegressions on hand-built frames: what opens a p99 finding and what must not."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from hbmwatch.detectors.context import Context
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.latency import LatencyRegressions
from hbmwatch.records import Finding, Severity
from hbmwatch.taxonomy import FindingKind

BASE = 0.2  # seconds
CHUNK = 60  # steps per frame, as the runner's cycles


def p99_series(key: str) -> str:
    service, phase = key.split("/")
    return f'workload_latency_seconds{{phase="{phase}",quantile="0.99",service="{service}"}}'


def make_frame(t0: int, step_ms: int, keys: Sequence[str], signals: dict[str, np.ndarray]) -> Frame:
    n = signals["p99"].shape[1]
    wls = Entities()
    for key in keys:
        service, phase = key.split("/")
        wls.add(key, {"cluster": "c1", "rack": "r1", "host": "h1", "gpu": "0",
                      "service": service, "model": "m", "phase": phase})  # fmt: skip
    f = Frame(t0, step_ms, n, Entities(), wls, Entities(), {}, np.zeros((0, 8, n)),
              {}, {}, {}, {}, {})  # fmt: skip
    f.wl.update(signals)
    f.series.update({("wl", k, "p99"): p99_series(k) for k in keys})
    return f


def feed(
    det: LatencyRegressions,
    p99: np.ndarray,
    *,
    keys: Sequence[str] = ("chat/e2e",),
    start_ms: int = 0,
    step_ms: int = 1000,
    context: Context | None = None,
    **signals: float | np.ndarray,
) -> list[Finding]:
    """Run ``p99`` (W, T) through the detector in frames of CHUNK steps; all findings."""
    p99 = np.atleast_2d(np.asarray(p99, dtype=float))
    full = {"p50": 0.05, "res99": 0.005, "window_requests": 500.0, "requests": 8.0}
    full.update(signals)
    arrays = {k: np.broadcast_to(np.asarray(v, float), p99.shape) for k, v in full.items()}
    arrays["p99"] = p99
    out: list[Finding] = []
    for a in range(0, p99.shape[1], CHUNK):
        part = {k: np.array(v[:, a : a + CHUNK]) for k, v in arrays.items()}
        f = make_frame(start_ms + a * step_ms, step_ms, keys, part)
        f.context = context
        out += det.update(f)
    return out


def noisy(steps: int, workloads: int = 1, sigma: float = 0.05, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return BASE * np.exp(rng.normal(0.0, sigma, (workloads, steps)))


def opened(findings: Sequence[Finding]) -> list[Finding]:
    """The first statement of each finding (the one that opened it)."""
    first: dict[str, Finding] = {}
    for f in findings:
        first.setdefault(f.id, f)
    return list(first.values())


def with_fault(p99: np.ndarray, start: int, stop: int, factor: float) -> np.ndarray:
    p99 = p99.copy()
    p99[:, start:stop] *= factor
    return p99


def test_sustained_3x_step_fires_and_names_the_p99_series_and_window() -> None:
    det = LatencyRegressions()
    ctx = Context(resolution_s=5.0, horizon_s=900.0)
    p99 = with_fault(noisy(960), 600, 960, 3.0)
    found = feed(det, p99, context=ctx)
    assert len(opened(found)) == 1
    f = found[-1]
    assert f.open and f.kind == FindingKind.P99_REGRESSION and f.detector == "latency"
    assert f.severity is Severity.CRITICAL or f.severity is Severity.WARNING
    assert f.entity == {"cluster": "c1", "rack": "r1", "host": "h1", "gpu": "0",
                        "service": "chat", "model": "m", "phase": "e2e"}  # fmt: skip
    assert f.causes == ()
    assert f.summary.startswith("p99 of chat/e2e 3.")
    assert 600_000 <= f.started_ms <= 605_000  # onset within the CUSUM's few steps
    assert 15_000 <= f.raised_ms - f.started_ms <= 25_000  # held hold_s(3x), about 20 s
    ev = {e.statistic: e for e in f.evidence}
    ratio = ev["p99_over_baseline_ratio"]
    assert ratio.series == p99_series("chat/e2e")
    assert 2.6 < ratio.value < 3.5 and ratio.threshold == 1.5
    assert (ratio.window_start_ms, ratio.window_end_ms) == (f.started_ms, f.updated_ms)
    # p50 stayed flat while p99 tripled: the tail ratio says so.
    assert ev["p99_over_p50_ratio"].value > 2.5 * BASE / 0.05
    assert ev["p50_seconds"].value == pytest.approx(0.05)
    assert ev["window_requests"].threshold == 20
    # Root-cause ranking can look back at the excess.
    _, excess = ctx.window("wl", ["chat/e2e"], "lat_excess", 900_000, 960_000)
    assert np.nanmean(excess) == pytest.approx(np.log(3.0), abs=0.15)


def test_quiet_on_noise_across_many_workloads() -> None:
    det = LatencyRegressions()
    keys = [f"svc{i}/{p}" for i in range(10) for p in ("ttft", "e2e")]
    p99 = noisy(3600, workloads=len(keys), sigma=0.15, seed=1)
    assert feed(det, p99, keys=keys) == []


def test_a_learned_daily_pattern_is_quiet_but_a_new_fault_is_not() -> None:
    period, step_ms = 3600, 10_000
    det = LatencyRegressions(season_period_s=period, season_bins=12, season_min_days=2)
    per_day = period * 1000 // step_ms  # 360 steps, 30 per bin
    days = 4
    p99 = noisy(days * per_day, sigma=0.05, seed=2)
    for day in range(days):  # every day, bin 3 (15-20 min) runs at 2.5x: a batch hour
        p99 = with_fault(p99, day * per_day + 90, day * per_day + 120, 2.5)
    fault = 3 * per_day + 210  # day 4, bin 7: something new
    p99 = with_fault(p99, fault, fault + 30, 3.0)
    found = opened(feed(det, p99, step_ms=step_ms))
    day_of = [f.started_ms // (period * 1000) for f in found]
    assert 0 in day_of  # the first sighting of the batch hour is a regression
    assert 2 not in day_of  # once learned it is the day's shape
    assert [f.started_ms // step_ms for f in found if f.started_ms >= 2 * period * 1000] == [fault]


def test_a_p99_from_three_requests_never_opens() -> None:
    det = LatencyRegressions()
    ctx = Context()
    p99 = with_fault(noisy(960), 600, 960, 10.0)
    win = np.where(np.arange(960) < 600, 500.0, 3.0)[None, :]
    assert feed(det, p99, window_requests=win, context=ctx) == []
    _, excess = ctx.window("wl", ["chat/e2e"], "lat_excess", 600_000, 960_000)
    assert np.isnan(excess).all()


def test_too_few_requests_neither_opens_nor_closes() -> None:
    det = LatencyRegressions()
    p99 = with_fault(noisy(1200), 600, 700, 3.0)  # recovers at 700 s ...
    win = np.where((np.arange(1200) >= 700) & (np.arange(1200) < 900), 3.0, 500.0)[None, :]
    found = feed(det, p99, window_requests=win)  # ... but with 3 requests until 900 s
    assert len(opened(found)) == 1
    ended = [f.ended_ms for f in found if not f.open]
    assert len(ended) == 1 and 960_000 <= ended[0] <= 980_000  # 60 s after 900 s


@pytest.mark.parametrize(("res99", "fires"), [(0.2, False), (0.01, True)])
def test_an_increase_within_bucket_resolution_is_no_evidence(res99: float, fires: bool) -> None:
    det = LatencyRegressions()
    p99 = np.full((1, 900), BASE)
    p99[:, 600:] = 2 * BASE  # 2x, but one bucket of 0.2 s when buckets are that coarse
    assert bool(feed(det, p99, res99=res99)) is fires


@pytest.mark.parametrize(("steps", "factor"), [(1, 10.0), (5, 10.0), (15, 3.0), (60, 1.8)])
def test_a_spike_shorter_than_its_hold_does_not_open(steps: int, factor: float) -> None:
    det = LatencyRegressions()
    p99 = with_fault(noisy(900), 600, 600 + steps, factor)
    assert feed(det, p99) == []


@pytest.mark.parametrize(
    ("factor", "steps", "hold_s"), [(50.0, 8, 5), (3.0, 25, 20), (1.8, 120, 75)]
)
def test_the_hold_scales_with_the_effect(factor: float, steps: int, hold_s: float) -> None:
    """3x for 20 s or 50x for 5 s pages; a 1.8x rise still waits out 75 s (chance tail
    excursions of a few requests reach that)."""
    det = LatencyRegressions()
    p99 = with_fault(noisy(900), 600, 600 + steps, factor)
    found = opened(feed(det, p99))
    assert len(found) == 1
    f = found[0]
    assert 600_000 <= f.started_ms <= 603_000
    assert hold_s - 2 <= (f.raised_ms - f.started_ms) / 1000 <= hold_s + 5


def test_closes_after_recovery_and_not_before() -> None:
    det = LatencyRegressions()
    p99 = with_fault(noisy(1200), 600, 900, 3.0)
    found = feed(det, p99)
    assert len(opened(found)) == 1
    closed = [f for f in found if not f.open]
    assert len(closed) == 1 and closed[0].id == found[0].id
    assert 960_000 <= closed[0].ended_ms <= 970_000  # min_off_s after the recovery
    assert all(f.updated_ms <= closed[0].ended_ms for f in found)


def test_state_round_trips_through_json_with_its_baseline() -> None:
    warm = noisy(600)
    fault = np.full((1, 120), 3 * BASE)
    det = LatencyRegressions()
    feed(det, warm)
    state = json.loads(json.dumps(det.state_dict(), allow_nan=False))
    restored = LatencyRegressions()
    restored.load_state_dict(state)
    expected = feed(det, fault, start_ms=600_000)
    got = feed(restored, fault, start_ms=600_000)
    assert expected and [f.id for f in got] == [f.id for f in expected]
    assert [f.summary for f in got] == [f.summary for f in expected]
    assert feed(LatencyRegressions(), fault, start_ms=600_000) == []  # it would re-warm
    # An open finding survives a restart too, and closes under the same id.
    again = LatencyRegressions()
    again.load_state_dict(json.loads(json.dumps(restored.state_dict(), allow_nan=False)))
    closed = [f for f in feed(again, noisy(120), start_ms=720_000) if not f.open]
    assert [f.id for f in closed] == [expected[0].id]


def test_training_step_phase_is_a_step_time_regression() -> None:
    det = LatencyRegressions()
    keys = ("train/step", "chat/e2e")
    p99 = with_fault(noisy(900, workloads=2), 600, 900, 2.0)
    found = feed(det, p99, keys=keys, window_requests=10.0)  # 10 steps: enough for a job
    assert {f.kind for f in found} == {FindingKind.STEP_TIME_REGRESSION}
    assert {f.entity["phase"] for f in found} == {"step"}
    assert found[0].summary.startswith("p99 step time of train/step 2.")
    assert found[0].severity is Severity.WARNING


def test_a_long_fault_does_not_become_the_baseline() -> None:
    det = LatencyRegressions()
    found = feed(det, with_fault(noisy(4200), 600, 4200, 3.0))  # an hour at 3x
    assert len(opened(found)) == 1 and found[-1].open
    ratio = {e.statistic: e.value for e in found[-1].evidence}["p99_over_baseline_ratio"]
    assert ratio > 2.5


@pytest.mark.parametrize("serving_slower", [False, True])
def test_an_e2e_rise_with_ttft_and_inter_token_steady_is_info(serving_slower: bool) -> None:
    """e2e = first token + output length x time per token: e2e alone rising is longer
    answers, not slower serving, and does not page; with ttft rising too it does."""
    keys = ("chat/e2e", "chat/ttft", "chat/inter_token")
    p99 = noisy(960, workloads=3, seed=4)
    p99[0, 600:] *= 2.5
    if serving_slower:
        p99[1, 590:] *= 2.5
    found = feed(LatencyRegressions(), p99, keys=keys)
    e2e = [f for f in found if f.entity["phase"] == "e2e"]
    assert e2e and e2e[-1].open
    if serving_slower:
        assert e2e[-1].severity in (Severity.WARNING, Severity.CRITICAL)
        assert "longer answers" not in e2e[-1].summary
    else:
        assert all(f.severity is Severity.INFO for f in e2e)
        assert e2e[-1].summary.endswith("longer answers, not slower serving")
        assert not [f for f in found if f.entity["phase"] != "e2e"]


def test_an_e2e_rise_with_nothing_to_compare_with_pages() -> None:
    p99 = with_fault(noisy(960), 600, 960, 2.5)
    found = feed(LatencyRegressions(), p99)
    assert found and found[-1].severity is not Severity.INFO
