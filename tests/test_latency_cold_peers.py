"""A GPU seen for the first time is judged against its warm peers while its baseline warms.

Peers: the same service, model and phase on other GPUs of the same SKU.  A newcomer at 3x
their p99 is regressed from its first samples (its own first 20 s would have been learned
as normal); a newcomer like them opens nothing; a whole fleet seen cold keeps the
own-first-seconds rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.latency import LatencyRegressions
from hbmwatch.records import Finding
from hbmwatch.taxonomy import FindingKind
from tests import test_detect_latency as lat

PEERS = 4
JOIN = 240  # s: the peers' baselines are warm (180 s), the newcomer's is not
CHUNK = 60


def frames(p99: np.ndarray, skus: list[str]) -> list[Frame]:
    """One workload ``chat/ttft`` (model m) per GPU ``h<i>/0`` of SKU ``skus[i]``."""
    gpus, wls = Entities(), Entities()
    for i, sku in enumerate(skus):
        place = {"cluster": "c1", "rack": "r1", "host": f"h{i}", "gpu": "0"}
        gpus.add(f"c1/h{i}/0", {**place, "sku": sku})
        wls.add(f"h{i}/chat/ttft", {**place, "service": "chat", "model": "m", "phase": "ttft"})
    out = []
    for a in range(0, p99.shape[1], CHUNK):
        part = p99[:, a : a + CHUNK]
        n = part.shape[1]
        f = Frame(a * 1000, 1000, n, gpus, wls, Entities(), {}, np.zeros((len(skus), 8, n)),
                  {}, {}, {}, {}, {})  # fmt: skip
        f.wl.update(
            p99=part.copy(), p50=np.full(part.shape, 0.05), res99=np.full(part.shape, 0.005),
            window_requests=np.full(part.shape, 500.0),
        )  # fmt: skip
        out.append(f)
    return out


def newcomer_opened(factor: float, *, steps: int = 600, join: int = JOIN,
                    skus: list[str] | None = None) -> list[Finding]:  # fmt: skip
    """Four peers from 0 s, a fifth GPU from ``join`` at ``factor`` times their p99: the
    newcomer's p99 findings (every statement)."""
    p99 = lat.noisy(steps, workloads=PEERS + 1, seed=11)
    p99[PEERS, :join] = np.nan
    p99[PEERS] *= factor
    det = LatencyRegressions()
    found = [f for fr in frames(p99, skus or ["H200"] * (PEERS + 1)) for f in det.update(fr)]
    return [f for f in found if f.entity["host"] == f"h{PEERS}"]


def test_a_newcomer_at_3x_its_warm_peers_is_regressed() -> None:
    """It pages within its hold (3x: 20 s) of its first sample, against its peers' median,
    and stays open after its own warm-up ends (its baseline started from theirs)."""
    found = newcomer_opened(3.0)
    first = lat.opened(found)
    assert len(first) == 1
    f = first[0]
    assert f.kind == FindingKind.P99_REGRESSION
    assert f.started_ms >= JOIN * 1000 and f.raised_ms <= (JOIN + 30) * 1000
    note = {e.statistic: e.note for e in f.evidence}["p99_seconds"]
    assert "median of 4 warm peers" in note
    assert all(s.ended_ms is None for s in found)  # still open at 600 s, 360 s after joining


def test_a_newcomer_like_its_peers_opens_nothing() -> None:
    assert newcomer_opened(1.15) == []


def test_peers_of_another_sku_are_no_reference() -> None:
    """A newcomer on an MI300X among H200 peers: no warm peer of its SKU, its own first 20 s
    are its provisional level, so a constant 3x is its normal."""
    assert newcomer_opened(3.0, skus=["H200"] * PEERS + ["MI300X"]) == []


@pytest.mark.parametrize("factor", [1.0, 5.0])
def test_a_whole_fleet_seen_cold_keeps_its_own_first_seconds(factor: float) -> None:
    """All five GPUs seen at once: no warm peers; the newcomer's own first 20 s judge it, so
    a 5x rise 60 s in opens, and no rise opens nothing."""
    p99 = lat.with_fault(lat.noisy(300, workloads=PEERS + 1, seed=12), 60, 300, 1.0)
    p99[PEERS, 60:] *= factor
    det = LatencyRegressions()
    found = lat.opened([f for fr in frames(p99, ["H200"] * (PEERS + 1)) for f in det.update(fr)])
    assert [f.entity["host"] for f in found] == ([f"h{PEERS}"] if factor > 1 else [])
