"""How long a latency regression must last to page: a hold that shrinks with its size.

Why.  Chance tail excursions of a few requests reach 1.5-2x, so up to ``fast_ratio`` a
regression must last ``min_on_s`` (75 s, longer than the 60 s quantile window).  Larger
effects are rarely chance: a GPU captured cold showed real regressions of 20-60 s
(2.3 -> 7.7 ms, 2.4 -> 122 ms) that a fixed 75 s never saw, so past ``fast_ratio`` the hold
shrinks as ``(log fast_ratio / log ratio) ** hold_power``, not under ``min_hold_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmwatch.detectors.base import EntityTable

#: The per-workload columns this rule keeps in its detector's table (since_, at_, earned_).
HOLD_FIELDS = {"since_": np.nan, "at_": np.nan, "earned_": 0.0}


@dataclass(frozen=True)
class HoldRule:
    """The hold's parameters (see the module docstring)."""

    min_on_s: float = 75.0
    fast_ratio: float = 2.0
    hold_power: float = 2.9
    min_hold_s: float = 5.0

    def hold_s(self, ratio: np.ndarray | float) -> np.ndarray:
        """How long a regression of ``ratio`` times its baseline must last to page.

        >>> HoldRule().hold_s(np.array([1.5, 2.0, 2.5, 3.0, 10.0])).round(1).tolist()
        [75.0, 75.0, 33.4, 19.7, 5.0]
        """
        with np.errstate(all="ignore"):
            part = np.log(self.fast_ratio) / np.log(np.fmax(ratio, self.fast_ratio))
            hold = self.min_on_s * np.nan_to_num(part, nan=1.0) ** self.hold_power
        return np.clip(hold, min(self.min_hold_s, self.min_on_s), self.min_on_s)

    def persist(
        self,
        table: EntityTable,
        rows: np.ndarray,
        score: np.ndarray,
        dev: np.ndarray,
        is_open: np.ndarray,
        t_ms: int,
    ) -> np.ndarray:
        """The score, held under 1 until it has been over 1 for the hold its effect needs.

        Each second over 1 earns ``1 / hold_s(ratio)`` of the hold (the first step starts the
        clock; steps without data neither earn nor stop it, the next one earns the time
        since), so a constant effect pages after exactly ``hold_s`` and a varying one after
        the time its effects add up to.  Open workloads pass through: closing is hysteresis.
        The ratio is p99 over its baseline (``dev`` is its log): the bucket gate decides
        whether a rise counts, not how large it is, since vLLM's coarse buckets (2.5-5 s)
        read a 22x first-token p99 as under 2 buckets, which held it 75 s like a 1.9x one.
        ``table`` holds ``HOLD_FIELDS`` at ``rows``; its ``since_`` is when the score last
        went over 1, ``at_`` its last step over 1, ``earned_`` the share of the hold earned.
        """
        since, at, earned = table["since_"][rows], table["at_"][rows], table["earned_"][rows]
        known = ~np.isnan(score)
        over = known & (score >= 1.0) & ~is_open
        ratio = np.exp(np.fmax(np.nan_to_num(dev), 0.0))
        elapsed = np.nan_to_num((t_ms - at) / 1000.0)  # 0 on the first step over
        earned = np.where(over, earned + elapsed / self.hold_s(ratio), np.where(known, 0.0, earned))
        since = np.where(over, np.where(np.isnan(since), t_ms, since),
                         np.where(known, np.nan, since))  # fmt: skip
        at = np.where(over, t_ms, np.where(known, np.nan, at))
        table["since_"][rows], table["at_"][rows], table["earned_"][rows] = since, at, earned
        waiting = over & (earned < 1.0 - 1e-9)
        return np.where(waiting, np.fmin(score, 0.999), score)
