"""A workload seen for the first time, judged against its warm peers while its baseline warms.

Why.  A GPU that joins a fleet (or restarts) has no baseline of its own for minutes, and one
learned from its own first seconds takes a GPU that starts slow as normal.  Its peers (the
same service, model and phase on other GPUs of the same SKU) already know what its p99
should be: while its own baseline warms, it is judged against the median of their
baselines, so a cold GPU at 3x its warm peers is regressed from its first sample.  The
median of at least ``min_peers`` warm peers keeps one odd or regressed peer from setting
the reference.  A whole fleet seen cold has no warm peers and keeps the own-first-seconds
rule of ``LatencyRegressions``.
"""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors.frame import Frame

PLACE = ("cluster", "host", "gpu")


def peer_groups(frame: Frame) -> np.ndarray:
    """(W,) a group per workload: equal for the same service, model, phase and GPU SKU."""
    sku_of = {tuple(lab.get(k, "") for k in PLACE): lab.get("sku", "") for lab in frame.gpus.labels}
    ids: dict[tuple[str, ...], int] = {}
    out = np.empty(len(frame.workloads), np.int64)
    for row, lab in enumerate(frame.workloads.labels):
        sku = sku_of.get(tuple(lab.get(k, "") for k in PLACE), "")
        key = (lab.get("service", ""), lab.get("model", ""), lab.get("phase", ""), sku)
        out[row] = ids.setdefault(key, len(ids))
    return out


class PeerLevels:
    """The peers' reference level for each cold workload of one frame's workloads.

    >>> levels = PeerLevels(np.array([0, 0, 0, 0, 1]), min_peers=3)
    >>> warm = np.array([False, True, True, True, True])
    >>> ref, n = levels.reference(~warm, warm, np.log([9.0, 1.0, 2.0, 3.0, 5.0]))
    >>> np.exp(ref).round(2).tolist(), n.tolist()
    ([2.0, nan, nan, nan, nan], [3.0, 0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, groups: np.ndarray, min_peers: int) -> None:
        self.min_peers = min_peers
        order = np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        # Only groups large enough to hold a cold member and ``min_peers`` warm ones.
        self.groups = [g for g in np.split(order, cuts) if len(g) > min_peers]

    def reference(
        self, cold: np.ndarray, warm: np.ndarray, level: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The median of the warm peers' ``level`` for each ``cold`` workload (NaN without
        ``min_peers`` of them), and how many peers it is the median of (0 without)."""
        ref = np.full(len(level), np.nan)
        count = np.zeros(len(level))
        for members in self.groups:
            cold_rows = members[cold[members]]
            if not len(cold_rows):
                continue
            known = members[warm[members] & np.isfinite(level[members])]
            if len(known) >= self.min_peers:
                ref[cold_rows] = np.median(level[known])
                count[cold_rows] = len(known)
        return ref, count


def start_from_peers(
    base_state: dict[str, np.ndarray], judged: np.ndarray, level: np.ndarray, t_ms: int
) -> None:
    """A workload judged by its peers with no level yet starts from theirs (``level``, in
    its own de-seasoned log units): learning from there at full rate lands on its first
    value, as before, while a first value already regressed is learned slowly (it is
    suspect), so the warm-up does not end by taking it as normal."""
    fresh = judged & np.isnan(base_state["level_"])
    if fresh.any():
        base_state["level_"][fresh] = level[fresh]
        base_state["last_ms_"][fresh] = t_ms
