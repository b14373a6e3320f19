"""Detector state saved by earlier code loads, and carries on as that code did.

Why: the runner persists each detector's ``state_dict`` and a restarted service loads it,
so a refactor (issue 13 split thermal, quality, outliers and the frame into modules of one
concept) must keep the format.  ``tests/data/detector_state_v1.json`` holds, per detector,
the state the code before that split saved after ``SAVED_AFTER`` frames of a small fleet,
and the findings it raised on the following frames after reloading that state.  The
current code must load it, save it back unchanged, and raise the same findings.

Regenerate (only when a format changes on purpose, saying so in the commit) with
``python -m tests.test_detector_state_compat``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.outliers import FleetOutliers
from hbmwatch.detectors.quality import DataQuality
from hbmwatch.detectors.thermal import ThermalExcursions
from hbmwatch.records import finding_to_dict

FIXTURE = Path(__file__).parent / "data" / "detector_state_v1.json"
GPUS, PER_RACK, STACKS, STEPS, FRAMES, SAVED_AFTER = 16, 8, 8, 60, 14, 8


def detectors() -> dict[str, Any]:
    """Each detector with settings that make a 14-minute fleet open and close findings."""
    return {
        "thermal": ThermalExcursions(warmup_s=60.0, min_on_s=3.0, min_off_s=20.0),
        "quality": DataQuality(first_up_grace_s=30.0),
        "outliers": FleetOutliers(every_s=120.0),
    }


def fleet_frames() -> list[Frame]:
    """Two racks of eight H200 / MI300X GPUs: rack r1 warms, one GPU runs hot then cools,
    one stack runs hot, one memory sensor sticks, one target goes down, sentinels come."""
    rng = np.random.default_rng(13)
    total = STEPS * FRAMES
    t = np.arange(total)
    bw = np.clip(0.5 + 0.2 * np.sin(t / 90.0) + rng.normal(0, 0.03, (GPUS, total)), 0, 1)
    mem = 55 + 15 * (bw - 0.5) + rng.normal(0, 0.4, (GPUS, total))
    mem[PER_RACK:] += np.clip((t - 300) / 120.0, 0, 1) * 4.0  # rack r1 loses coolant
    mem[3, 240:600] += 11.0
    mem[5, 200:] = np.round(mem[5, 200])  # stuck while the load moves
    stacks = mem[:, None, :] + rng.normal(0, 0.4, (GPUS, STACKS, total))
    stacks[:PER_RACK] = np.nan  # the H200 rack has no stack sensors
    stacks[10, 2, 360:] += 9.0
    signals = {
        "mem_temp": np.round(mem),
        "hot_temp": np.round(mem + 8 + rng.normal(0, 0.5, (GPUS, total))),
        "power": 300 + 300 * bw + rng.normal(0, 10, (GPUS, total)),
        "power_limit": np.full((GPUS, total), 700.0),
        "bw": bw,
        "util": np.clip(0.8 + rng.normal(0, 0.02, (GPUS, total)), 0, 1),
        "clock": 1.98e9 + rng.normal(0, 5e6, (GPUS, total)),
    }
    signals["clock"][7] *= 0.9  # a straggler
    up = np.ones((2, total))
    up[1, 420:520] = 0.0
    sentinel = np.zeros((2, total))
    sentinel[0, 100:400:20] = 3.0
    out = []
    for k in range(FRAMES):
        sl = slice(k * STEPS, (k + 1) * STEPS)
        gpu = {n: v[:, sl] for n, v in signals.items()}
        tgt = {"up": up[:, sl], "sentinel": sentinel[:, sl]}
        out.append(_frame(k * STEPS, gpu, stacks[:, :, sl], tgt))
    return out


def _frame(t0: int, signals: dict[str, np.ndarray], stacks: np.ndarray,
           tgt: dict[str, np.ndarray]) -> Frame:  # fmt: skip
    gpus, targets = Entities(), Entities()
    for i in range(GPUS):
        r = i // PER_RACK
        gpus.add(f"c/h{r}/{i % PER_RACK}", {"cluster": "c", "rack": f"r{r}", "host": f"h{r}",
                                            "gpu": str(i % PER_RACK),
                                            "sku": ("H200", "MI300X")[r]})  # fmt: skip
    for r in range(2):
        targets.add(f"h{r}:9400", {"cluster": "c", "rack": f"r{r}", "host": f"h{r}"})
    f = Frame(t0 * 1000, 1000, STEPS, gpus, Entities(), targets, {}, stacks.copy(),
              {}, {}, {}, {}, {})  # fmt: skip
    f.gpu.update({k: v.copy() for k, v in signals.items()})
    f.tgt.update({k: v.copy() for k, v in tgt.items()})
    return f


def run(det: Any, frames: list[Frame]) -> list[dict[str, Any]]:
    return [finding_to_dict(f) for frame in frames for f in det.update(frame)]


def record() -> dict[str, Any]:
    """What the current code saves and then raises: the fixture's content."""
    out: dict[str, Any] = {}
    for name, det in detectors().items():
        frames = fleet_frames()
        early = run(det, frames[:SAVED_AFTER])
        state = json.loads(json.dumps(det.state_dict()))
        det.load_state_dict(state)
        out[name] = {"state": state, "findings": run(det, frames[SAVED_AFTER:]),
                     "findings_before_save": len(early)}  # fmt: skip
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (states hold NaN for values not seen yet)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def known(state: Any, saved: Any) -> Any:
    """``state`` less what ``saved`` has no key for: state added since (the thermal
    detector's usual gap at load, calm load range and load lag) starts afresh on load."""
    if isinstance(state, dict) and isinstance(saved, dict):
        return {k: known(v, saved[k]) for k, v in state.items() if k in saved}
    return state


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.mark.reference_dispatch
@pytest.mark.parametrize("name", ["thermal", "quality", "outliers"])
def test_state_saved_by_earlier_code_loads_and_carries_on(saved: dict, name: str) -> None:
    entry = saved[name]
    det = detectors()[name]
    det.load_state_dict(entry["state"])
    assert same(known(json.loads(json.dumps(det.state_dict())), entry["state"]), entry["state"])
    got = json.loads(json.dumps(run(det, fleet_frames()[SAVED_AFTER:])))
    assert entry["findings"], "the fixture must exercise findings"
    assert same(got, entry["findings"])


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(record(), sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
