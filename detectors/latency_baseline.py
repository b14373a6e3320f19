"""What a workload's p99 usually is: a log-p99 level and trend that knows the day.

Why.  Latency is multiplicative, so everything works on log(p99): a robust level and trend
(``TrendBaseline``) on the series with its learned daily shape removed (``SeasonalProfile``),
so a morning ramp seen on earlier days is not a regression.  The daily shape is relative to
a period-long average (``slow_``); the p50 baseline (``p50_``) is kept for the evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hbmwatch.detectors.base import EntityTable
from hbmwatch.detectors.scorers import SeasonalProfile, TrendBaseline, decay

#: The per-workload columns the baseline keeps in its detector's table.
BASELINE_FIELDS = {"slow_": np.nan, "p50_": np.nan, "ready_": 0.0}


class LatencyBaseline:
    """The log-p99 baseline and daily profile of every workload.

    ``warmup_s`` of data are learned before its own baseline judges; ``level_half_life_s``
    / ``trend_half_life_s`` / ``scale_half_life_s`` / ``min_scale`` set the level and trend,
    ``season_*`` the daily profile.  ``base`` and ``season`` are the state tables.
    """

    def __init__(
        self,
        *,
        warmup_s: float,
        level_half_life_s: float,
        trend_half_life_s: float,
        scale_half_life_s: float,
        min_scale: float,
        season_bins: int,
        season_period_s: float,
        season_half_life_days: float,
        season_min_days: float,
    ) -> None:
        self.level_half_life_s = level_half_life_s
        self.season_period_s = season_period_s
        self.season_bins = season_bins
        self.base = TrendBaseline(
            level_half_life_s=level_half_life_s,
            trend_half_life_s=trend_half_life_s,
            scale_half_life_s=scale_half_life_s,
            min_scale=min_scale,
            warmup_s=warmup_s,
            clip=3.0,
        )
        self.season = SeasonalProfile(
            bins=season_bins,
            period_s=season_period_s,
            half_life_days=season_half_life_days,
            min_days=season_min_days,
        )

    def bin(self, t_ms: int) -> int:
        """The daily profile's bin at ``t_ms`` (as ``SeasonalProfile`` bins time)."""
        period = self.season_period_s
        return int((t_ms / 1000.0 % period) / period * self.season_bins)

    def daily_shape(
        self,
        table: EntityTable,
        rows: tuple[np.ndarray, np.ndarray],
        base_state: dict[str, np.ndarray],
        t_ms: int,
    ) -> np.ndarray:
        """The learned daily shape at ``t_ms`` (0 until learned), in log units.

        ``rows`` are the workloads' rows in the profile and in ``table``.
        """
        season_rows, wrows = rows
        shape = -self.season.adjust(season_rows, np.zeros(len(season_rows)), t_ms)
        ready = self.season.ready(season_rows)
        # When the shape first applies, move the level with it so the prediction stays put.
        starts = ready & (table["ready_"][wrows] == 0)
        if starts.any():
            base_state["level_"][starts] -= shape[starts]
        table["ready_"][wrows] = ready.astype(float)
        return shape

    def learn_levels(
        self,
        table: EntityTable,
        rows: tuple[np.ndarray, np.ndarray],
        logs: tuple[np.ndarray, np.ndarray],
        t_ms: int,
        learn: np.ndarray,
        dt_s: float,
    ) -> None:
        """The period-long level, the daily shape relative to it, and the p50 baseline.

        ``logs`` are log p99 (NaN without evidence) and log p50 at this step.
        """
        season_rows, wrows = rows
        x, x50 = logs
        ok = ~np.isnan(x)
        slow = table["slow_"][wrows]
        a = decay(dt_s, self.season_period_s) * learn
        slow = np.where(ok, np.where(np.isnan(slow), x, slow + a * (x - slow)), slow)
        table["slow_"][wrows] = slow
        # The shape learns from every step: a fault recurring at one hour every day is
        # the daily pattern; one that did not recur is averaged over ``season_min_days``.
        self.season.learn_one(season_rows, x - slow, t_ms, dt_s)
        p50 = table["p50_"][wrows]
        ok50 = ok & ~np.isnan(x50)
        b = decay(dt_s, self.level_half_life_s) * learn
        table["p50_"][wrows] = np.where(
            ok50, np.where(np.isnan(p50), x50, p50 + b * (x50 - p50)), p50
        )

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict(), "season": self.season.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.base.load_state_dict(state.get("base", {}))
        self.season.load_state_dict(state.get("season", {}))
