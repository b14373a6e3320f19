"""FleetOutliers on synthetic fleets: hot at the same load is an outlier, busy is not."""

from __future__ import annotations

import json

import numpy as np

from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.outliers import FleetOutliers
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.taxonomy import Cause, FindingKind

STEP_MS = 10_000


def fleet(n: int, sku: str = "H200") -> Entities:
    gpus = Entities()
    for i in range(n):
        host, gpu = f"h{i // 8}", str(i % 8)
        labels = {"cluster": "c", "rack": f"r{i // 32}", "host": host, "gpu": gpu, "sku": sku}
        gpus.add(f"c/{host}/{gpu}", labels)
    return gpus


def frame(
    gpus: Entities,
    start_ms: int,
    steps: int,
    rng: np.random.Generator,
    *,
    bw: np.ndarray | None = None,
    extra_temp: np.ndarray | None = None,
    clock_factor: np.ndarray | None = None,
) -> Frame:
    """Memory temperature follows bandwidth (20 C per unit of ratio) plus sensor noise."""
    n = len(gpus)
    f = Frame(
        start_ms, STEP_MS, steps, gpus, Entities(), Entities(), {},
        np.full((n, MAX_STACKS, steps), np.nan), {}, {}, {}, {}, {},
    )  # fmt: skip
    base_bw = np.full(n, 0.5) if bw is None else bw
    load = base_bw[:, None] + rng.normal(0, 0.02, (n, steps))
    f.gpu["bw"] = load
    f.gpu["util"] = np.clip(0.4 + load, 0, 1)
    temp = 55 + 20 * load + rng.normal(0, 0.5, (n, steps))
    f.gpu["mem_temp"] = temp + (0 if extra_temp is None else extra_temp[:, None])
    f.gpu["hot_temp"] = 50 + 30 * load + rng.normal(0, 0.5, (n, steps))
    f.gpu["power"] = 300 + 400 * load + rng.normal(0, 5, (n, steps))
    clock = 1.98e9 + rng.normal(0, 5e6, (n, steps))
    f.gpu["clock"] = clock * (1 if clock_factor is None else clock_factor[:, None])
    return f


def run(det: FleetOutliers, minutes: int, seed: int = 0, **kw: np.ndarray) -> list:
    """Feed ``minutes`` of data in one-minute frames; all findings, in order."""
    rng = np.random.default_rng(seed)
    gpus = fleet(len(next(iter(kw.values()))) if kw else 32)
    out = []
    for m in range(minutes):
        out += det.update(frame(gpus, m * 60_000, 6, rng, **kw))
    return out


def test_hot_gpu_at_same_load_is_flagged_with_temperature_named_first() -> None:
    extra = np.zeros(32)
    extra[13] = 8.0
    findings = run(FleetOutliers(), 11, extra_temp=extra)
    assert findings, "an 8 C hotter GPU at the same load must be flagged"
    assert {f.entity["host"] + "/" + f.entity["gpu"] for f in findings} == {"h1/5"}
    first = findings[0]
    assert first.kind == FindingKind.FLEET_OUTLIER
    assert first.raised_ms == 600_000  # the second evaluation: hysteresis over two
    assert first.top_cause == Cause.THERMAL
    assert "temp" in first.evidence[0].statistic
    assert "robust z" in first.evidence[0].note
    assert any(e.statistic == "isolation_score" for e in first.evidence)
    assert "hot" in first.summary


def test_one_outlying_evaluation_is_not_enough() -> None:
    extra = np.zeros(32)
    extra[13] = 8.0
    assert run(FleetOutliers(), 6, extra_temp=extra) == []  # only one evaluation so far


def test_healthy_noisy_fleet_has_no_finding() -> None:
    for seed in range(3):
        bw = np.random.default_rng(100 + seed).uniform(0.2, 0.9, 32)
        assert run(FleetOutliers(), 21, seed=seed, bw=bw) == []


def test_gpu_hot_because_busy_like_its_busy_peers_is_not_flagged() -> None:
    bw = np.full(32, 0.3)
    bw[:8] = 0.9  # eight busy GPUs run 12 C hotter than the idle ones, as load explains
    assert run(FleetOutliers(), 21, bw=bw) == []


def test_slow_gpu_is_a_clock_drop() -> None:
    factor = np.ones(32)
    factor[3] = 0.9
    findings = run(FleetOutliers(), 11, clock_factor=factor)
    assert [(f.entity["host"], f.entity["gpu"]) for f in findings] == [("h0", "3")]
    assert findings[0].top_cause == Cause.CLOCK_DROP
    assert "clock" in findings[0].evidence[0].statistic


def test_too_few_peers_are_not_scored() -> None:
    extra = np.zeros(6)
    extra[2] = 10.0
    assert run(FleetOutliers(min_peers=8), 11, extra_temp=extra) == []


def test_finding_closes_after_two_healthy_evaluations() -> None:
    det = FleetOutliers()
    extra = np.zeros(32)
    extra[13] = 8.0
    rng = np.random.default_rng(0)
    gpus = fleet(32)
    findings = []
    for m in range(26):
        hot = extra if m < 10 else np.zeros(32)
        findings += det.update(frame(gpus, m * 60_000, 6, rng, extra_temp=hot))
    ended = [f for f in findings if f.ended_ms is not None]
    assert len(ended) == 1 and ended[0].ended_ms == 1_200_000  # under at 900 s and 1200 s
    assert len({f.id for f in findings}) == 1
    assert ended[0].top_cause == Cause.THERMAL  # the close still says what it was


def test_state_round_trips_through_json() -> None:
    extra = np.zeros(32)
    extra[13] = 8.0
    rng = np.random.default_rng(0)
    gpus = fleet(32)
    a = FleetOutliers()
    for m in range(8):  # one outlying evaluation behind it, mid-window
        a.update(frame(gpus, m * 60_000, 6, rng, extra_temp=extra))
    b = FleetOutliers()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert json.dumps(b.state_dict()) == json.dumps(a.state_dict())
    later = [frame(gpus, m * 60_000, 6, rng, extra_temp=extra) for m in range(8, 11)]
    out_a = [f.id for fr in later for f in a.update(fr)]
    out_b = [f.id for fr in later for f in b.update(fr)]
    assert out_a == out_b and out_a


def test_fleet_of_1024_evaluates() -> None:
    """Speed is `hbmwatch bench detect`'s to measure (a timed assert fails on a busy machine);
    here the evaluation of a 1,024-GPU fleet runs and its findings are well formed."""
    rng = np.random.default_rng(0)
    gpus = fleet(1024)
    bw = rng.uniform(0.2, 0.9, 1024)
    det = FleetOutliers()
    for m in range(4):
        det.update(frame(gpus, m * 60_000, 6, rng, bw=bw))
    last = frame(gpus, 4 * 60_000, 6, rng, bw=bw)  # closes minute 4: the evaluation
    findings = det.update(last)
    assert all(f.entity.get("host") for f in findings)
