"""Streaming and batch scorers, vectorised over entities; higher is more anomalous.

Each keeps its learned state in an ``EntityTable`` (fields ending in ``_`` in the docs
below), takes the rows of the entities a frame holds (``rows(keys)``, once a frame), and
is told the time of each step so irregular data (gaps, late scrapes) decays correctly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hbmwatch.detectors.base import EntityTable, nanmedian

LN2 = np.log(2.0)


def decay(dt_s: np.ndarray | float, half_life_s: float) -> np.ndarray:
    """Weight of the new observation for an exponential average after ``dt_s`` seconds."""
    return 1.0 - np.exp(-LN2 * np.asarray(dt_s, dtype=float) / half_life_s)


class TrendBaseline:
    """A robust level-and-trend baseline per entity (Holt's method with clipped updates).

    The trend term removes the lag a plain moving average has on slow drifts (the daily
    load and inlet swing), so a sudden rise stands out early; clipping each update at
    ``clip`` scales keeps one spike from moving the baseline.  ``score_one`` is the
    standardised excess over the prediction, 0.0 until ``warmup_s`` of data was learned.
    During warm-up the level is a plain average, or with ``warm_half_life_s`` at least an
    average of that half-life, so a sensor still settling (a package soaking up heat from
    a cold start) ends its warm-up where it is, not half a ramp behind.

    >>> b = TrendBaseline(level_half_life_s=60, trend_half_life_s=300, warmup_s=10)
    >>> rows = b.rows(["gpu0"])
    >>> for t in range(1200):  # a slow drift of 0.6 C a minute is learned, not flagged
    ...     b.learn_one(rows, np.array([50.0 + 0.01 * t]), t * 1000)
    >>> round(float(b.score_one(rows, np.array([62.0]), 1_200_000)[0]), 1)
    0.1
    >>> round(float(b.score_one(rows, np.array([68.0]), 1_200_000)[0]), 1)
    12.1
    """

    def __init__(
        self,
        *,
        level_half_life_s: float = 1200.0,
        trend_half_life_s: float = 7200.0,
        scale_half_life_s: float = 1800.0,
        min_scale: float = 0.5,
        warmup_s: float = 120.0,
        clip: float = 4.0,
        warm_half_life_s: float | None = None,
    ) -> None:
        self.level_half_life_s = level_half_life_s
        self.trend_half_life_s = trend_half_life_s
        self.scale_half_life_s = scale_half_life_s
        self.min_scale = min_scale
        self.warmup_s = warmup_s
        self.clip = clip
        self.warm_half_life_s = warm_half_life_s
        self.table = EntityTable(
            {
                "level_": np.nan,
                "trend_": 0.0,
                "scale_": np.nan,
                "seen_s_": 0.0,
                "last_ms_": np.nan,
                "n_": 0.0,
            }
        )

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        return self.table.rows(keys)

    def local(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of these rows' state, for a loop over steps that writes back once.

        The ``*_local`` methods work on such copies: a detector stepping 10,000 sensors 60
        times a frame saves a gather and a scatter per field and step (``store`` writes back).
        """
        return {name: self.table[name][rows] for name in self.table.fields}

    def store(self, rows: np.ndarray, local: Mapping[str, np.ndarray]) -> None:
        for name, values in local.items():
            self.table[name][rows] = values

    def predict(self, rows: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        return self.predict_local(self.local(rows), t_ms)

    @staticmethod
    def predict_local(s: Mapping[str, np.ndarray], t_ms: int | np.ndarray) -> np.ndarray:
        dt = np.nan_to_num((t_ms - s["last_ms_"]) / 1000.0)
        return s["level_"] + s["trend_"] * dt  # type: ignore[no-any-return]

    def scale(self, rows: np.ndarray) -> np.ndarray:
        return self.scale_local({"scale_": self.table["scale_"][rows]})

    def scale_local(self, s: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.fmax(np.nan_to_num(s["scale_"], nan=self.min_scale), self.min_scale)

    def deviation(self, rows: np.ndarray, x: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        """``x`` minus the prediction, NaN during warm-up or without data."""
        return self.deviation_local(self.local(rows), x, t_ms)

    def deviation_local(
        self, s: Mapping[str, np.ndarray], x: np.ndarray, t_ms: int | np.ndarray
    ) -> np.ndarray:
        ready = s["seen_s_"] >= self.warmup_s
        return np.where(ready, x - self.predict_local(s, t_ms), np.nan)

    def score_one(self, rows: np.ndarray, x: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        z = self.deviation(rows, x, t_ms) / self.scale(rows)
        return np.where(np.isnan(x), np.nan, np.nan_to_num(z, nan=0.0))

    def learn_one(
        self,
        rows: np.ndarray,
        x: np.ndarray,
        t_ms: int | np.ndarray,
        learn: np.ndarray | float = 1.0,
        floor: np.ndarray | None = None,
    ) -> None:
        """Learn one step; ``learn`` (0..1 per entity) slows learning, 0 freezes it.

        ``floor`` (per entity) replaces ``min_scale`` for this step: a series of unknown
        units needs a scale floor relative to itself, not one absolute number.
        """
        ok = ~np.isnan(x)
        if not ok.any():
            return
        rows = rows[ok]
        rate = np.broadcast_to(np.asarray(learn, dtype=float), ok.shape)[ok]
        t_now = np.broadcast_to(np.asarray(t_ms, dtype=float), ok.shape)[ok]
        local = self.local(rows)
        self.learn_local(local, x[ok], t_now, rate, None if floor is None else floor[ok])
        self.store(rows, local)

    def learn_local(
        self,
        s: dict[str, np.ndarray],
        x: np.ndarray,
        t_ms: int | np.ndarray,
        learn: np.ndarray | float = 1.0,
        floor: np.ndarray | None = None,
    ) -> None:
        """``learn_one`` on copies from ``local``; entities whose ``x`` is NaN keep theirs.

        Every entity is computed and the NaN ones are put back, which for a fleet where
        nearly all report costs less than picking the reporting ones out first.
        """
        ok = ~np.isnan(x)
        if not ok.any():
            return
        rate = np.asarray(learn, dtype=float)
        t_now = np.asarray(t_ms, dtype=float)
        min_scale = self.min_scale if floor is None else floor
        last, level0, trend0, scale0 = s["last_ms_"], s["level_"], s["trend_"], s["scale_"]
        with np.errstate(invalid="ignore", over="ignore"):
            fresh = np.isnan(last) | np.isnan(level0)
            dt = np.where(fresh, 1.0, np.clip((t_now - last) / 1000.0, 1e-3, 3600.0))
            pred = level0 + trend0 * dt
            scale = np.fmax(np.nan_to_num(scale0, nan=min_scale), min_scale)
            # Warm-up averages plainly (no clipping, no trend), so a first value that is off
            # (a short first window, a cold start) is forgotten by the end of the warm-up.
            warm = s["seen_s_"] < self.warmup_s
            first = 1.0 / (s["n_"] + 1.0)
            if self.warm_half_life_s is not None:
                first = np.fmax(first, decay(dt, self.warm_half_life_s))
            resid = np.where(
                warm, x - pred, np.clip(x - pred, -self.clip * scale, self.clip * scale)
            )
            a_level = decay(dt, self.level_half_life_s)
            a = np.where(warm, np.fmax(a_level, first), a_level) * rate
            b = np.where(warm, 0.0, decay(dt, self.trend_half_life_s)) * rate
            level = np.where(fresh, x, pred + a * resid)
            trend = np.where(fresh, 0.0, trend0 + b * ((level - level0) / dt - trend0))
            a_scale = decay(dt, self.scale_half_life_s)
            c = np.where(warm, np.fmax(a_scale, first), a_scale) * rate
            scale_new = np.where(
                np.isnan(scale0), min_scale, scale0 + c * (1.25 * np.abs(resid) - scale0)
            )
        learned = rate > 0
        s["level_"] = np.where(ok, level, level0)
        s["trend_"] = np.where(ok, trend, trend0)
        s["scale_"] = np.where(ok, scale_new, scale0)
        s["seen_s_"] = np.where(ok, s["seen_s_"] + np.where(fresh, 0.0, dt * learned), s["seen_s_"])
        s["last_ms_"] = np.where(ok, t_now, last)
        s["n_"] = np.where(ok, s["n_"] + learned, s["n_"])

    def state_dict(self) -> dict[str, Any]:
        return self.table.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.table.load_state_dict(state)


class SeasonalProfile:
    """What an entity usually does at this hour of the day, learned over days.

    ``adjust`` removes the learned daily shape once every bin has been seen ``min_days``
    times, so a baseline on the adjusted series does not alarm at the morning ramp it saw
    yesterday; until then it passes values through.

    >>> p = SeasonalProfile(bins=4, period_s=4 * 3600, min_days=1.0, half_life_days=2)
    >>> rows = p.rows(["svc"])
    >>> for day in range(3):
    ...     for hour in range(4):
    ...         value = np.array([1.0 if hour == 2 else 0.0])
    ...         p.learn_one(rows, value, (day * 4 + hour) * 3_600_000)
    >>> p.adjust(rows, np.array([1.0]), 2 * 3_600_000).round(2).tolist()
    [0.25]
    """

    def __init__(
        self,
        *,
        bins: int = 24,
        period_s: float = 86_400.0,
        half_life_days: float = 7.0,
        min_days: float = 1.0,
    ) -> None:
        self.bins = bins
        self.period_s = period_s
        self.half_life_days = half_life_days
        self.min_days = min_days
        self.table = EntityTable(
            {"profile_": 0.0, "weight_": 0.0, "count_": 0.0, "last_bin_": -1.0},
            {"profile_": bins, "weight_": bins, "count_": bins},
        )

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        return self.table.rows(keys)

    def _bin(self, t_ms: int | np.ndarray) -> Any:
        """The bin of ``t_ms``: an int, or an int array for per-entity times."""
        if np.ndim(t_ms):
            t = np.asarray(t_ms, dtype=float) / 1000.0 % self.period_s
            return np.minimum((t / self.period_s * self.bins).astype(np.int64), self.bins - 1)
        return int((t_ms / 1000.0 % self.period_s) / self.period_s * self.bins)

    def ready(self, rows: np.ndarray) -> np.ndarray:
        return self.table["weight_"][rows].min(axis=1) >= self.min_days

    def adjust(self, rows: np.ndarray, x: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        """``x`` less the learned shape at ``t_ms`` (one time, or one per entity)."""
        profile = self.table["profile_"][rows]
        b = self._bin(t_ms)
        at = profile[np.arange(len(rows)), b] if np.ndim(b) else profile[:, b]
        shape = at - profile.mean(axis=1)
        return np.where(self.ready(rows), x - shape, x)

    def learn_one(
        self,
        rows: np.ndarray,
        x: np.ndarray,
        t_ms: int | np.ndarray,
        dt_s: float | np.ndarray = 1.0,
    ) -> None:
        """Learn the value ``x`` (already relative to the entity's level) for this hour.

        A bin's value is the running mean of its samples until its exponential memory
        (``half_life_days`` of the bin's own time) takes over; ``weight_`` counts the days.
        """
        ok = ~np.isnan(x)
        if not ok.any():
            return
        b = self._bin(t_ms)
        b = b[ok] if np.ndim(b) else b
        dt_s = dt_s[ok] if np.ndim(dt_s) else dt_s
        r = rows[ok]
        t = self.table
        # A visit counts once per bin per day: weight counts days, the average is per sample.
        entering = t["last_bin_"][r] != b
        t["weight_"][r, b] += np.where(entering, 1.0, 0.0)
        t["last_bin_"][r] = b
        t["count_"][r, b] += 1.0
        bin_half_life_s = self.half_life_days * self.period_s / self.bins
        a = np.fmax(1.0 / t["count_"][r, b], decay(dt_s, bin_half_life_s))
        t["profile_"][r, b] += a * (x[ok] - t["profile_"][r, b])

    def state_dict(self) -> dict[str, Any]:
        return self.table.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.table.load_state_dict(state)


class Cusum:
    """One-sided CUSUM of standardised scores: ``S = max(0, S + z - k)``.

    >>> c = Cusum(k=0.5)
    >>> rows = c.rows(["svc"])
    >>> [round(float(c.update(rows, np.array([z]))[0]), 1) for z in (0.2, 2.0, 2.0, -3.0)]
    [0.0, 1.5, 3.0, 0.0]
    """

    def __init__(self, *, k: float = 0.5, cap: float = 1e6) -> None:
        self.k = k
        self.cap = cap
        self.table = EntityTable({"s_": 0.0})

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        return self.table.rows(keys)

    def update(self, rows: np.ndarray, z: np.ndarray) -> np.ndarray:
        s = self.table["s_"][rows]
        s = np.where(np.isnan(z), s, np.clip(s + np.nan_to_num(z) - self.k, 0.0, self.cap))
        self.table["s_"][rows] = s
        return s

    def reset(self, rows: np.ndarray) -> None:
        self.table["s_"][rows] = 0.0

    def state_dict(self) -> dict[str, Any]:
        return self.table.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.table.load_state_dict(state)


def group_median(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each entity's peer median and peer count (NaN-aware), for groups of integer labels.

    The groups are laid side by side in one NaN-padded array, so one median call serves
    them all (a fleet has dozens of groups and this runs every step).

    >>> med, n = group_median(np.array([1.0, 2.0, 9.0, 5.0]), np.array([0, 0, 0, 1]))
    >>> med.tolist(), n.tolist()
    ([2.0, 2.0, 2.0, 5.0], [3, 3, 3, 1])
    """
    if len(values) == 0:
        return np.full(values.shape, np.nan), np.zeros(0, dtype=np.int64)
    padded, inverse = _by_group(values, groups)
    present = ~np.isnan(padded).reshape(*padded.shape[:2], -1).all(axis=2)
    count = present.sum(axis=1)[inverse]
    return nanmedian(padded, axis=1)[inverse], count


def group_median_columns(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``group_median`` of each column of ``values`` (entities x steps) on its own.

    The peer median and count per entity and step, for a whole frame in one call instead of
    one call a step; the medians are the very numbers each column's call would give.

    >>> med, n = group_median_columns(np.array([[1.0, 4.0], [3.0, np.nan]]), np.array([0, 0]))
    >>> med.tolist(), n.tolist()
    ([[2.0, 4.0], [2.0, 4.0]], [[2, 1], [2, 1]])
    """
    if len(values) == 0:
        return np.full(values.shape, np.nan), np.zeros(values.shape, dtype=np.int64)
    padded, inverse = _by_group(values, groups)
    count = (~np.isnan(padded)).sum(axis=1)[inverse]
    return nanmedian(padded, axis=1)[inverse], count


def group_padded(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as (groups, largest group, ...) padded with NaN, and each entity's group:
    for per-group arithmetic (medians, fits) of every group at once."""
    return _by_group(values, groups)


def _by_group(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as (groups, largest group, ...) padded with NaN, and each entity's group."""
    labels, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    position = np.arange(len(order)) - np.repeat(starts, sizes)
    padded = np.full((len(labels), int(sizes.max()), *values.shape[1:]), np.nan)
    padded[inverse[order], position] = values[order]
    return padded, inverse


def robust_z(values: np.ndarray, groups: np.ndarray, min_scale: float) -> np.ndarray:
    """Distance from the peer median in peer MADs (scaled to sigma), higher = further above.

    >>> robust_z(np.array([10.0, 10.5, 9.5, 20.0]), np.array([0, 0, 0, 0]), 0.1).round(1).tolist()
    [-0.3, 0.3, -1.0, 13.2]
    """
    med, _ = group_median(values, groups)
    mad, _ = group_median(np.abs(values - med), groups)
    return (values - med) / np.fmax(1.4826 * mad, min_scale)
