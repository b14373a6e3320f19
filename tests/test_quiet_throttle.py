"""Throttling that hurts nobody is recorded, not paged; residency at the threshold does not flap."""

from __future__ import annotations

import json

import numpy as np

from hbmwatch.detectors.base import make_finding
from hbmwatch.detectors.devices import Throttling
from hbmwatch.detectors.frame import Frame
from hbmwatch.records import Finding, Severity
from hbmwatch.taxonomy import FindingKind
from tests.test_detect_devices import chunks


def regression(host: str, gpu: str, started_s: float, ended_s: float | None = None) -> Finding:
    """An open (or ended) p99 regression of a service on ``host``/``gpu``."""
    entity = {"cluster": "c", "rack": "r0", "host": host, "gpu": gpu, "service": "chat"}
    return make_finding(
        kind=FindingKind.P99_REGRESSION, detector="latency", entity=entity,
        severity=Severity.WARNING, summary="p99 2.4x its baseline",
        started_ms=int(started_s * 1000), raised_ms=int(started_s * 1000),
        updated_ms=int(started_s * 1000),
        ended_ms=None if ended_s is None else int(ended_s * 1000),
    )  # fmt: skip


def peak(n: int, g: int = 1, seed: int = 0, drop: float = 0.03) -> list[Frame]:
    """Power-cap residency around 50% from 30 s on: a daily peak, the clock ``drop`` lower
    while throttled (a cap set far under the load costs a third of it)."""
    rng = np.random.default_rng(seed)
    thr = np.zeros((g, n))
    thr[:, 30:] = np.clip(rng.normal(0.5, 0.1, (g, n - 30)), 0, 1)
    clock = np.where(np.arange(n) >= 30, 1980 * (1 - drop), 1980) + rng.normal(0, 3, (g, n))
    return chunks(0, n, thr_power=thr, clock=clock)


def run(det: Throttling, frames: list[Frame], open_findings: list[Finding] = ()) -> list[Finding]:
    out: list[Finding] = []
    for f in frames:
        f.open_findings = list(open_findings)
        out += det.update(f)
    return out


def test_peak_throttling_that_barely_slows_the_clock_never_pages() -> None:
    found = run(Throttling(page_after_s=60), peak(900))
    assert found and {f.severity for f in found} == {Severity.INFO}
    assert "no workload slower" in found[-1].summary


def test_throttling_that_costs_clock_pages_once_past_its_budget() -> None:
    found = run(Throttling(page_after_s=120), peak(300, drop=0.35))
    assert len({f.id for f in found}) == 1
    info = [f for f in found if f.severity is Severity.INFO]
    pages = [f for f in found if f.severity is Severity.WARNING]
    assert info and pages, [f.severity for f in found]
    assert max(f.updated_ms for f in info) < min(f.updated_ms for f in pages)
    first_page = min(pages, key=lambda f: f.updated_ms)
    assert 120_000 <= first_page.updated_ms - first_page.started_ms <= 150_000
    assert "no workload slower" in info[0].summary
    assert "budget 2 min" in first_page.summary


def test_default_budget_is_five_minutes_of_lost_clock() -> None:
    det = Throttling()
    assert (det.page_after_s, det.page_clock_drop) == (300.0, 0.1)
    found = run(det, peak(320, drop=0.35))
    assert found and {f.severity for f in found} == {Severity.INFO}  # under 5 min so far
    found += run(det, chunks(320, 60, thr_power=np.ones(60), clock=np.full(60, 1300.0)))
    assert found[-1].severity is Severity.WARNING


def test_a_regression_on_that_gpu_makes_it_page_at_once() -> None:
    found = run(Throttling(), peak(120), [regression("h0", "0", 40)])
    assert found and {f.severity for f in found} == {Severity.WARNING}
    assert "p99_regression on chat on this GPU" in found[0].summary


def test_a_regression_elsewhere_or_ended_does_not() -> None:
    others = [regression("h0", "1", 40), regression("h1", "0", 40), regression("h0", "0", 5, 20)]
    found = run(Throttling(), peak(120), others)
    assert found and {f.severity for f in found} == {Severity.INFO}


def test_once_paging_the_episode_keeps_paging_across_a_restart() -> None:
    frames = peak(240)
    det = Throttling()
    run(det, frames[:4], [regression("h0", "0", 40)])
    again = Throttling()
    again.load_state_dict(json.loads(json.dumps(det.state_dict())))
    found = run(again, frames[4:])  # the regression is over; the page is not taken back
    assert found and {f.severity for f in found} == {Severity.WARNING}


def test_residency_hovering_at_the_threshold_is_one_episode_not_flaps() -> None:
    """A daily peak: residency swings over and under the threshold every minute or two."""
    rng = np.random.default_rng(3)
    g, n = 8, 1200
    t = np.arange(n)
    level = 0.2 + 0.12 * np.sin(2 * np.pi * t / rng.uniform(60, 150, (g, 1)))
    thr = (rng.random((g, n)) < level).astype(float)
    found = run(Throttling(), chunks(0, n, thr_power=thr, clock=1980 - 100 * thr))
    per_gpu = {}
    for f in found:
        per_gpu.setdefault(f.entity["gpu"], set()).add(f.id)
    assert per_gpu and max(len(ids) for ids in per_gpu.values()) == 1, per_gpu


def test_the_settings_reach_the_detectors() -> None:
    from hbmwatch.detectors import default_detectors
    from hbmwatch.settings import DetectionSettings

    made = {d.name: d for d in default_detectors()}
    assert (made["throttle"].page_after_s, made["quality"].first_up_grace_s) == (300.0, 60.0)
    settings = DetectionSettings(throttle_page_after_seconds=60, target_first_up_grace_seconds=5)
    made = {d.name: d for d in default_detectors(settings)}
    assert (made["throttle"].page_after_s, made["quality"].first_up_grace_s) == (60.0, 5.0)
