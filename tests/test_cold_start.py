"""Cold starts and short regressions: a GPU seen for the first time, and large short effects.

Latency: a workload is judged against its own first ``cold_min_s`` (20 s) of data while its
baseline warms, at ``cold_ratio`` (2.5x); the hold scales with the effect.  Thermal: the SKU's
limit, twice the peer / sibling threshold and a prior load slope apply before the own
baselines are learned, and a young baseline's rise is no excursion far under the limit.
"""

from __future__ import annotations

import numpy as np
import pytest

from hbmwatch.detectors.latency import LatencyRegressions
from hbmwatch.detectors.thermal import ThermalExcursions
from hbmwatch.taxonomy import FindingKind
from tests import test_detect_latency as lat
from tests import test_detect_thermal as th

MS = 1e-3


def cold_capture(before_s: int, factor: float, during_s: int, after_s: int = 60) -> np.ndarray:
    """A workload's first ``before_s`` seconds at 2.3 ms, ``during_s`` at ``factor`` times
    that, then back: a capture that starts cold, seconds before its regression."""
    p99 = lat.noisy(before_s + during_s + after_s, sigma=0.05, seed=3) / lat.BASE * 2.3 * MS
    return lat.with_fault(p99, before_s, before_s + during_s, factor)


@pytest.mark.parametrize(
    ("factor", "during_s", "hold_s"),
    [(7.7 / 2.3, 40, 15), (122 / 2.4, 20, 5)],
    ids=["2.3-to-7.7ms-for-40s", "2.4-to-122ms-for-20s"],
)
def test_a_regression_in_a_cold_capture_pages(factor: float, during_s: int, hold_s: float) -> None:
    """The real cold captures' regressions (2.3 -> 7.7 ms, 2.4 -> 122 ms) came 30-60 s in,
    inside the 180 s warm-up: they page after the hold their size needs."""
    p99 = cold_capture(30, factor, during_s)
    found = lat.opened(lat.feed(LatencyRegressions(), p99, res99=0.1 * MS))
    assert len(found) == 1
    f = found[0]
    assert f.kind == FindingKind.P99_REGRESSION
    assert 30_000 <= f.started_ms <= 32_000
    assert hold_s - 2 <= (f.raised_ms - f.started_ms) / 1000 <= hold_s + 5
    ratio = {e.statistic: e for e in f.evidence}["p99_over_baseline_ratio"]
    assert float(ratio.note.split()[1].rstrip("x")) == pytest.approx(factor, rel=0.2)  # peak


def test_a_cold_workload_is_not_judged_on_its_first_seconds() -> None:
    """Fewer than ``cold_min_s`` of data is no baseline: a 5x value at 10 s is not judged."""
    p99 = cold_capture(10, 5.0, 60)
    assert lat.feed(LatencyRegressions(), p99, res99=0.1 * MS) == []


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_cold_workloads_under_noise_or_a_2x_rise_stay_quiet(factor: float) -> None:
    """While cold only a large effect counts: 20 noisy workloads, or a 2x rise, open nothing."""
    keys = [f"svc{i}/e2e" for i in range(20)]
    p99 = lat.noisy(240, workloads=len(keys), sigma=0.15, seed=4)
    p99 = lat.with_fault(p99, 60, 180, factor)
    assert lat.feed(LatencyRegressions(), p99, keys=keys) == []


# -- thermal ----------------------------------------------------------------------------------


def h200_load_step(steps: int, at: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """One H200 idle until ``at``, then copying at 0.85 of its bandwidth and 450 W, warming
    as the real one did (memory 42 -> 60 C, hotspot 41 -> 51 C within seconds)."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    on = t >= at
    warm = np.where(on, 1.0 - np.exp(-(t - at) / 3.0), 0.0)
    return {
        "mem": np.round(42 + 18 * warm + rng.normal(0, 0.3, steps))[None, :],
        "hot_temp": np.round(41 + 10 * warm + rng.normal(0, 0.3, steps))[None, :],
        "bw": np.where(on, 0.85, 0.01)[None, :] + rng.normal(0, 0.003, (1, steps)),
        "power": np.where(on, 450.0, 125.0)[None, :] + rng.normal(0, 2, (1, steps)),
        "power_limit": np.full((1, steps), 700.0),
    }


@pytest.mark.parametrize("at", [200, 480])
def test_a_first_load_on_an_idle_gpu_is_not_an_excursion(at: int) -> None:
    """An idle GPU's first copy warms it 18 C: the load explains it (its SKU's prior slope),
    whether the baseline is young (200 s) or not (480 s)."""
    sig = h200_load_step(at + 120, at)
    found = th.feed(ThermalExcursions(), sig.pop("mem"), **sig)
    assert found == []


def test_a_package_soaking_up_heat_through_its_warm_up_is_not_an_excursion() -> None:
    """A GPU seen from a cold start warms 40 -> 56 C over its first 200 s at constant load,
    then holds: its warm-up ends where it is, not half a ramp behind (which read as +8 C
    1 s after the warm-up ended)."""
    t = np.arange(900)
    mem = np.round(40 + np.clip(t / 200.0, 0.0, 1.0) * 16)[None, :]
    assert th.feed(ThermalExcursions(), mem, bw=0.5) == []


@pytest.mark.parametrize(("at", "opens"), [(200, False), (500, True)])
def test_a_young_baseline_is_no_reason_to_page_far_under_the_limit(at: int, opens: bool) -> None:
    """A 60 s bump of +10 C to 52 C (43 C under the limit) at constant load: while the
    baseline is young (200 s) it is not an excursion; once learned (500 s) it is."""
    mem = th.noisy(1, at + 120, level=42.0, seed=7)
    mem[:, at : at + 60] += 10
    assert bool(th.gpu_findings(th.feed(ThermalExcursions(), mem, bw=0.5))) is opens


def test_a_young_baseline_rising_near_the_limit_is_an_excursion() -> None:
    """The same young baseline, a fast +25 C to 67 C (28 C under the 95 C limit), opens."""
    mem = th.noisy(1, 300, level=42.0)
    mem[:, 200:] += 25
    found = th.gpu_findings(th.feed(ThermalExcursions(), mem, bw=0.5))
    assert len(found) == 1 and 200_000 <= found[0].started_ms <= 206_000


def test_a_stack_far_over_its_siblings_from_the_first_sample_opens_in_warm_up() -> None:
    """A GPU seen for the first time with one stack 12 C over its siblings: no usual gap is
    learned from it, it is found well inside the 180 s warm-up."""
    stacks = np.full((1, 8, 120), np.nan)
    stacks[0, :6] = th.noisy(6, 120, level=55.0, seed=5)
    stacks[0, 2] += 12
    found = th.gpu_findings(th.feed(ThermalExcursions(), np.nanmax(stacks, axis=1), stacks=stacks))
    assert len(found) == 1
    f = found[0]
    assert f.raised_ms <= 30_000 and "stack2" in f.summary


def test_stacks_with_a_small_gap_from_the_first_sample_open_nothing() -> None:
    """Manufacturing spread (a stack 4 C over its siblings) is not a degraded stack."""
    stacks = np.full((1, 8, 300), np.nan)
    stacks[0, :6] = th.noisy(6, 300, level=55.0, seed=6)
    stacks[0, 2] += 4
    assert th.feed(ThermalExcursions(), np.nanmax(stacks, axis=1), stacks=stacks) == []


@pytest.mark.parametrize(("factor", "hold_s"), [(1.8, 75), (3.0, 20)])
def test_the_hold_is_time_not_steps_when_p99_comes_every_5_s(factor: float, hold_s: float) -> None:
    """Latency pages are scraped every 5 s: the steps between have no p99.  The hold is
    seconds of time over the threshold, not steps with data (which made 75 s into 375 s)."""
    p99 = lat.with_fault(lat.noisy(1000), 600, 1000, factor)
    p99[:, np.arange(1000) % 5 != 0] = np.nan
    found = lat.opened(lat.feed(LatencyRegressions(), p99))
    assert len(found) == 1
    f = found[0]
    assert 600_000 <= f.started_ms <= 610_000
    assert hold_s - 2 <= (f.raised_ms - f.started_ms) / 1000 <= hold_s + 5
