"""Latency state saved by the code before its module split loads, and carries on as it did.

Why: the runner persists each detector's ``state_dict`` and a restarted service loads it, so
splitting ``detectors/latency.py`` (issue 13: baseline, hold, peers, evidence) must keep the
format.  ``tests/data/latency_state_v1.json`` holds the state that code (commit ab1c435)
saved after ``SAVED_AFTER`` frames of six workloads, and the findings it raised on the
following frames after reloading it.  The current code must load it, save it back
unchanged, and raise the same findings.

Regenerate (only when the format changes on purpose, saying so in the commit) with
``python -m tests.test_latency_split_state``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hbmwatch.detectors.latency import LatencyRegressions
from tests import test_detect_latency as lat
from tests.test_detector_state_compat import same

FIXTURE = Path(__file__).parent / "data" / "latency_state_v1.json"
KEYS = ["chat/ttft", "chat/e2e", "code/ttft", "code/inter_token", "batch/e2e", "train/step"]
FRAMES, SAVED_AFTER = 16, 8


def frames() -> list[Any]:
    """Six workloads for 16 minutes: a 3x and a 9x regression after the save, a 2x one
    across it, one too short to page, and a training job's step time rising."""
    p99 = lat.noisy(FRAMES * lat.CHUNK, workloads=len(KEYS), sigma=0.08, seed=21)
    p99[0, 560:700] *= 3.0
    p99[1, 420:600] *= 2.0
    p99[2, 700:740] *= 9.0
    p99[3, 600:610] *= 1.8
    p99[5, 620:] *= 2.5
    out = []
    for a in range(0, p99.shape[1], lat.CHUNK):
        part = p99[:, a : a + lat.CHUNK]
        f = lat.make_frame(a * 1000, 1000, KEYS, {"p99": part.copy()})
        shape = part.shape
        f.wl.update(p50=np.full(shape, 0.05), res99=np.full(shape, 0.005),
                    window_requests=np.full(shape, 500.0))  # fmt: skip
        out.append(f)
    return out


def run(det: Any, part: list[Any]) -> list[dict[str, Any]]:
    from hbmwatch.records import finding_to_dict

    return [finding_to_dict(f) for frame in part for f in det.update(frame)]


def record(det: Any) -> dict[str, Any]:
    """What ``det`` saves and then raises: the fixture's content."""
    all_frames = frames()
    early = run(det, all_frames[:SAVED_AFTER])
    state = json.loads(json.dumps(det.state_dict()))
    det.load_state_dict(state)
    later = json.loads(json.dumps(run(det, all_frames[SAVED_AFTER:])))
    return {"state": state, "findings": later, "findings_before_save": len(early)}


@pytest.mark.reference_dispatch
def test_latency_state_saved_before_the_split_loads_and_carries_on() -> None:
    saved = json.loads(FIXTURE.read_text())
    det = LatencyRegressions(warmup_s=120.0)
    det.load_state_dict(saved["state"])
    assert same(json.loads(json.dumps(det.state_dict())), saved["state"])
    got = json.loads(json.dumps(run(det, frames()[SAVED_AFTER:])))
    assert len({f["id"] for f in saved["findings"]}) >= 3, "the fixture must exercise findings"
    for finding in got:  # summaries name the peak of an easing regression since (wording)
        finding["summary"] = re.sub(r"peaked [\d.]+x its baseline, now ", "", finding["summary"])
    assert same(got, saved["findings"])


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record(LatencyRegressions(warmup_s=120.0))) + "\n")
