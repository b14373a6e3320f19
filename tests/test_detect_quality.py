"""The data-quality detector on hand-built frames."""

from __future__ import annotations

import json

import numpy as np

from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.quality import DataQuality
from hbmwatch.records import Finding, Severity

STEP_MS = 1000


def make_frame(
    t0_s: float,
    steps: int,
    n_gpus: int = 1,
    targets: dict[str, np.ndarray] | None = None,
    stacks: np.ndarray | None = None,
    **signals: np.ndarray,
) -> Frame:
    """GPUs ``c/h{i//8}/{i%8}`` with (G, T) signals; one target ``h{j}:5000`` per host."""
    gpus, tgts = Entities(), Entities()
    for i in range(n_gpus):
        host, gpu = f"h{i // 8}", str(i % 8)
        gpus.add(f"c/{host}/{gpu}", {"cluster": "c", "rack": "r0", "host": host, "gpu": gpu})
    f = Frame(
        int(t0_s * 1000), STEP_MS, steps, gpus, Entities(), tgts, {},
        np.full((n_gpus, 8, steps), np.nan) if stacks is None else stacks, {}, {}, {}, {}, {},
    )  # fmt: skip
    for name, value in signals.items():
        f.gpu[name] = np.broadcast_to(np.asarray(value, dtype=float), (n_gpus, steps)).copy()
        for key in gpus.keys:
            host, gpu = key.split("/")[1:]
            f.series[("gpu", key, name)] = f'{name}_series{{gpu="{gpu}",host="{host}"}}'
    for name, value in (targets or {}).items():
        value = np.atleast_2d(np.asarray(value, dtype=float))
        for j in range(value.shape[0]):
            key = f"h{j}:5000"
            tgts.add(key, {"cluster": "c", "rack": "r0", "host": f"h{j}", "target": key})
            f.series[("tgt", key, name)] = f'{name}_series{{target="{key}"}}'
        f.tgt[name] = value.copy()
    return f


def chunks(n: int, size: int = 30, **kw: np.ndarray) -> list[Frame]:
    """Split (G, n) GPU signals, ``stacks`` (G, 8, n) and ``targets`` into frames."""
    frames = []
    for a in range(0, n, size):
        b = min(n, a + size)
        part = {k: np.atleast_2d(v)[:, a:b] for k, v in kw.items() if k not in ("stacks", "tgt")}
        stacks = kw["stacks"][:, :, a:b] if "stacks" in kw else None
        tgt = {k: np.atleast_2d(v)[:, a:b] for k, v in kw.get("tgt", {}).items()}
        g = next(iter(part.values())).shape[0] if part else 0
        frames.append(make_frame(a, b - a, g, targets=tgt, stacks=stacks, **part))
    return frames


def run(det: DataQuality, frames: list[Frame]) -> list[Finding]:
    out: list[Finding] = []
    for f in frames:
        out += det.update(f)
    return out


def busy_gpu(n: int, seed: int = 0, g: int = 1) -> dict[str, np.ndarray]:
    """A loaded GPU whose load and temperatures move (rounded, noisy sensors)."""
    rng = np.random.default_rng(seed)
    load = 0.5 + 0.4 * np.sin(np.arange(n) / 20.0 + rng.uniform(0, 6, (g, 1)))
    return {
        "power": 250 + 400 * load + rng.normal(0, 5, (g, n)),
        "bw": np.clip(load + rng.normal(0, 0.02, (g, n)), 0, 1),
        "mem_temp": np.round(55 + 10 * load + rng.normal(0, 0.4, (g, n))),
        "hot_temp": np.round(50 + 15 * load + rng.normal(0, 0.4, (g, n))),
        "clock": np.full((g, n), 1980.0),
        "util": np.clip(load, 0, 1),
    }


def by_check(found: list[Finding], check: str) -> list[Finding]:
    return [f for f in found if f.entity["check"] == check]


# -- stuck sensors ---------------------------------------------------------------------------
def test_stuck_memory_sensor_on_a_busy_gpu_opens_and_closes() -> None:
    sig = busy_gpu(400)
    sig["mem_temp"][:, 60:300] = 63.0  # held from 60 s to 300 s
    found = run(DataQuality(), chunks(400, **sig))
    assert len({f.id for f in found}) == 1
    f = found[0]
    assert (f.kind, f.top_cause, f.entity["check"], f.entity["signal"]) == (
        "data_quality", "sensor", "stuck", "mem_temp",
    )  # fmt: skip
    assert f.entity["host"] == "h0" and f.entity["gpu"] == "0"
    assert f.started_ms == 60_000 and f.raised_ms == 180_000
    held, power, _ = f.evidence
    assert held.series == 'mem_temp_series{gpu="0",host="h0"}'
    assert held.statistic == "unchanged_for_s" and held.threshold == 120.0
    assert held.window_start_ms == 60_000 and "63" in held.note
    assert power.series.startswith("power_series") and power.value >= power.threshold
    assert found[-1].ended_ms == 300_000


def test_idle_gpu_with_a_constant_temperature_is_not_stuck() -> None:
    rng = np.random.default_rng(1)
    n = 600
    idle = {
        "power": 250 + rng.normal(0, 1.0, n),  # idle: power jitters by a watt or two
        "bw": np.zeros(n),
        "mem_temp": np.full(n, 41.0),
        "hot_temp": np.full(n, 39.0),
        "clock": np.full(n, 1980.0),
    }
    assert run(DataQuality(), chunks(n, **idle)) == []


def test_stuck_stack_names_its_stack_series() -> None:
    n = 300
    sig = busy_gpu(n)
    rng = np.random.default_rng(2)
    stacks = np.full((1, 8, n), np.nan)
    stacks[0, :6] = np.round(sig["mem_temp"] - 1 + rng.normal(0, 0.5, (6, n)))
    stacks[0, 2, 30:] = 60.0
    found = run(DataQuality(), chunks(n, stacks=stacks, **sig))
    assert {f.entity["signal"] for f in found} == {"stack2"}
    assert found[0].evidence[0].series == (
        'gpu_hbm_stack_temperature_celsius{gpu="0",host="h0",stack="2"}'
    )


def test_same_value_after_a_gap_is_not_stuck() -> None:
    sig = busy_gpu(400)
    for v in sig.values():
        v[:, 100:230] = np.nan  # target down for 130 s
    sig["mem_temp"][:, 230] = sig["mem_temp"][:, 99]  # back with the value it left at
    assert run(DataQuality(), chunks(400, **sig)) == []


def test_short_hold_does_not_open() -> None:
    sig = busy_gpu(400)
    sig["mem_temp"][:, 100:200] = 63.0  # 100 s < stuck_s
    assert run(DataQuality(), chunks(400, **sig)) == []


# -- gaps ------------------------------------------------------------------------------------
def test_dropout_while_the_gpu_still_reports_opens_and_closes() -> None:
    sig = busy_gpu(200)
    sig["mem_temp"][:, 60:140] = np.nan
    sig["mem_temp"][:, 20] = np.nan  # a one-step blip
    found = run(DataQuality(), chunks(200, **sig))
    assert len({f.id for f in found}) == 1
    f = found[0]
    assert (f.entity["check"], f.top_cause, "signal" in f.entity) == ("gap", "sensor", False)
    assert f.started_ms == 59_000 and f.raised_ms == 74_000  # last seen at 59 s, + 15 s
    ev = f.evidence[0]
    assert len(f.evidence) == 1 and ev.series == 'mem_temp_series{gpu="0",host="h0"}'
    assert ev.statistic == "missing_for_s" and ev.value >= 15 and ev.threshold == 15.0
    assert found[-1].ended_ms == 140_000 and found[-1].evidence[0].value == 81.0
    assert "mem_temp back after 81 s" in found[-1].summary


def test_a_dropped_memory_sensor_and_its_stacks_are_one_finding() -> None:
    n = 200
    sig = busy_gpu(n)
    stacks = np.full((1, 8, n), np.nan)
    stacks[0] = np.round(sig["mem_temp"] + np.random.default_rng(6).normal(0, 0.5, (8, n)))
    sig["mem_temp"][:, 60:140] = np.nan
    stacks[:, :, 60:140] = np.nan
    found = run(DataQuality(), chunks(n, stacks=stacks, **sig))
    assert len({f.id for f in found}) == 1
    assert len(found[0].evidence) == 9
    assert {e.series.split("{")[0] for e in found[0].evidence} == {
        "mem_temp_series", "gpu_hbm_stack_temperature_celsius",
    }  # fmt: skip


def test_sparse_scrapes_are_not_gaps() -> None:
    sig = busy_gpu(300)
    for v in sig.values():
        v[:, np.arange(300) % 10 != 0] = np.nan  # a 10 s scrape interval
    assert run(DataQuality(), chunks(300, **sig)) == []


def test_a_target_down_is_not_a_gap_but_target_down() -> None:
    n = 200
    sig = busy_gpu(n)
    for v in sig.values():
        v[:, 80:150] = np.nan
    up = np.ones(n)
    up[80:150] = 0.0
    up[30] = 0.0  # one failed scrape
    found = run(DataQuality(), chunks(n, tgt={"up": up}, **sig))
    assert {f.entity["check"] for f in found} == {"target_down"}
    f = found[0]
    assert (f.top_cause, f.entity["target"], f.entity["host"]) == ("target_down", "h0:5000", "h0")
    assert f.started_ms == 80_000 and f.raised_ms == 81_000
    assert f.evidence[0].series == 'up_series{target="h0:5000"}'
    assert f.evidence[0].statistic == "consecutive_down_scrapes"
    assert found[-1].ended_ms == 150_000


def test_a_target_not_yet_up_is_not_down_within_its_grace() -> None:
    """Start-up: exporters that answer only after 40 s are "not yet up", never a page."""
    n = 200
    up = np.zeros((3, n))
    up[0, 40:] = 1.0  # answers after 40 s
    up[1, 59:] = 1.0  # just inside the 60 s grace
    up[2, 5:] = 1.0
    up[2, 120:150] = 0.0  # was up, then stopped answering: still a page, as before
    found = run(DataQuality(), chunks(n, tgt={"up": up}))
    assert {f.entity["target"] for f in found} == {"h2:5000"}
    assert found[0].started_ms == 120_000 and found[0].raised_ms == 121_000


def test_a_target_that_never_answers_is_down_after_the_grace_since_its_first_scrape() -> None:
    n = 200
    found = run(DataQuality(first_up_grace_s=90), chunks(n, tgt={"up": np.zeros(n)}))
    assert {f.entity["check"] for f in found} == {"target_down"}
    assert found[0].started_ms == 0 and found[0].raised_ms == 90_000
    assert found[-1].ended_ms is None  # still down


# -- counter resets --------------------------------------------------------------------------
def reset_frames(cycles_with_resets: list[int], n_cycles: int = 40) -> list[Frame]:
    frames = []
    for c in range(n_cycles):
        f = make_frame(c * 30, 30, 1, **busy_gpu(30, seed=c))
        if c in cycles_with_resets:
            f.resets["c/h0/0"] = 12  # every counter series of the GPU
        frames.append(f)
    return frames


def test_counter_reset_storm_opens_and_closes_after_the_window() -> None:
    found = by_check(run(DataQuality(), reset_frames([3, 4, 5, 6, 7])), "counter_resets")
    assert len({f.id for f in found}) == 1
    f = found[0]
    assert f.raised_ms == 6 * 30_000 + 29_000  # the fourth cycle with resets
    assert f.evidence[0].statistic == "cycles_with_counter_resets"
    assert f.evidence[0].value == 4 and f.evidence[0].threshold == 3
    assert "48 counter series" in f.evidence[0].note
    assert found[-1].ended_ms is not None  # old cycles leave the 600 s window


def test_one_exporter_restart_is_not_a_storm() -> None:
    assert run(DataQuality(), reset_frames([5])) == []
    assert run(DataQuality(), reset_frames([2, 12, 22, 32])) == []  # spread out


# -- sentinels -------------------------------------------------------------------------------
def test_sentinels_are_info_then_warning_when_sustained() -> None:
    n = 600
    drops = np.zeros(n)
    drops[40] = 1.0  # once: nothing
    drops[100:450:5] = 2.0  # every scrape for 350 s
    found = run(DataQuality(), chunks(n, tgt={"up": np.ones(n), "sentinel": drops}))
    assert {f.entity["check"] for f in found} == {"sentinel"}
    assert len({f.id for f in found}) == 1
    assert found[0].severity == Severity.INFO and found[0].started_ms == 100_000
    assert found[0].raised_ms == 110_000  # the third scrape with sentinels
    assert found[0].evidence[0].series == 'sentinel_series{target="h0:5000"}'
    assert any(f.severity == Severity.WARNING for f in found)
    assert found[-1].ended_ms == 445_000 + 60_000


# -- fleet -----------------------------------------------------------------------------------
def test_quiet_on_a_noisy_healthy_fleet() -> None:
    n, g = 600, 64
    sig = busy_gpu(n, seed=3, g=g)
    rng = np.random.default_rng(4)
    stacks = np.round(sig["mem_temp"][:, None, :] + rng.normal(0, 0.5, (g, 8, n)))
    drops = np.zeros((8, n))
    drops[3, 200] = 1.0
    targets = {"up": np.ones((8, n)), "sentinel": drops}
    assert run(DataQuality(), chunks(n, stacks=stacks, tgt=targets, **sig)) == []


def test_state_survives_json_round_trip() -> None:
    sig = busy_gpu(400)
    sig["mem_temp"][:, 60:300] = 63.0
    sig["hot_temp"][:, 200:260] = np.nan
    frames = chunks(400, **sig)
    whole = run(DataQuality(), frames)
    first = DataQuality()
    part = run(first, frames[:5])  # mid-way through the held value
    second = DataQuality()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    part += run(second, frames[5:])
    assert [(f.id, f.updated_ms, f.ended_ms) for f in part] == [
        (f.id, f.updated_ms, f.ended_ms) for f in whole
    ]
    assert {f.entity["check"] for f in part} == {"stuck", "gap"}
    assert any(f.ended_ms is not None for f in part)


def test_params_stored_as_given_and_checked() -> None:
    det = DataQuality(stuck_s=60, gap_s=0)
    assert (det.stuck_s, det.gap_s, det.min_down_scrapes, det.first_up_grace_s) == (60, 0, 2, 60)
    try:
        det.update(make_frame(0, 1, 1, power=np.ones(1)))
    except ValueError:
        pass
    else:
        raise AssertionError("gap_s=0 should be rejected")


def test_1024_healthy_gpus_over_minutes_raise_nothing() -> None:
    """A fleet's scale, not its speed: `hbmwatch bench detect` measures the speed."""
    g = 1024
    sig = busy_gpu(60, seed=5, g=g)
    stacks = np.repeat(sig["mem_temp"][:, None, :], 8, axis=1)
    targets = {"up": np.ones((128, 60)), "sentinel": np.zeros((128, 60))}
    det = DataQuality()
    raised = []
    for k in range(4):
        raised += det.update(make_frame(60 * k, 60, g, targets=targets, stacks=stacks, **sig))
    assert raised == []
