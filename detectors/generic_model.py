"""The generic series model: an anomaly score in [0, 1] for any one-dimensional series.

For series hbmwatch knows nothing about (a user's own, through the ``mapped`` source or
``score-file``, and the public NAB corpus): built from the scorers the domain detectors use
(``scorers.py``), causal (each sample is scored before it is learned) and vectorised over
entities, each entity with its own timestamps.  ``SeriesAnomalies`` (``generic.py``) turns
the scores into findings.

Per sample, in the series' own units and cadence (nothing here is in seconds or in units):

1. a daily profile (``SeasonalProfile``) is removed once every hour of the day has been
   seen, and only when the series is sampled at least twice an hour;
2. a level-and-trend baseline (``TrendBaseline``) on a clock of samples (half-lives in
   samples, so a 5-minute and a 1-second series behave alike) predicts the value; its
   scale has a floor relative to the series' own long-run spread and level;
3. two one-sided CUSUMs of the standardised residual find level shifts: the shift is
   surprising where it starts, then the baseline jumps to it (the new normal);
4. the surprise (residual and CUSUM, in scales) is judged against the series' own history
   of surprises (like HTM's anomaly likelihood): a series that is always jumpy scores its
   jumps low, and a second jump soon after a first is less surprising than the first.

The score is the Gaussian tail of that judgement on a log scale, ``d = -log10(tail)``,
squashed into [0, 1) as ``d / (d + 5)`` (0.5 is a 1-in-100,000 surprise for this series,
0.7 one in 10^11.7) and damped where the surprise is no larger than the recent largest;
the score never saturates, so the largest surprises still rank.  ``alert_score`` (0.6) is
where a sample is called anomalous; the ``refractory`` samples after it score 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import log_ndtr

from hbmwatch.detectors.base import EntityTable
from hbmwatch.detectors.scorers import Cusum, SeasonalProfile, TrendBaseline

LN10 = np.log(10.0)


@dataclass(frozen=True)
class SeriesConfig:
    """The one fixed configuration (counts are samples of the series itself)."""

    level_half_life: float = 6.0
    trend_half_life: float = 60.0
    scale_half_life: float = 200.0
    long_half_life: float = 2_000.0
    surprise_half_life: float = 3_000.0
    short_half_life: float = 1.0
    warmup: int = 30
    floor_spread: float = 0.05
    floor_level: float = 1e-3
    cusum_k: float = 1.0
    cusum_h: float = 150.0
    surprise_cap: float = 12.0
    half_decades: float = 5.0
    record_half_life: float = 1_000.0
    record_power: float = 2.0
    seasonal_min_days: float = 1.0
    seasonal_max_step_s: float = 1_800.0
    #: Samples after an alert onset whose scores read 0: one anomaly is news once (NAB
    #: counts a window's first detection and charges every later one outside it).
    refractory: int = 50


class SeriesModel:
    """Streaming scores for many series at once; ``update`` scores, then learns.

    >>> m = SeriesModel()
    >>> rows = m.rows(["queue"])
    >>> t = 1_800_000_000_000
    >>> rng = np.random.default_rng(0)
    >>> s = [float(m.update(rows, np.array([t + i * 60_000]), 10 + rng.normal(size=1))[0])
    ...      for i in range(300)]
    >>> max(s) < m.alert_score
    True
    >>> float(m.update(rows, np.array([t + 300 * 60_000]), np.array([90.0]))[0]) >= m.alert_score
    True
    """

    # Where a sample is called anomalous, and a refractory period starts: chosen with the
    # refractory on NAB's development half (docs/detection.md); Gaussian noise stays below it.
    alert_score: float = 0.6

    def __init__(self, config: SeriesConfig | None = None) -> None:
        c = self.config = config or SeriesConfig()
        self.baseline = TrendBaseline(
            level_half_life_s=c.level_half_life, trend_half_life_s=c.trend_half_life,
            scale_half_life_s=c.scale_half_life, min_scale=1e-12, warmup_s=float(c.warmup),
        )  # fmt: skip
        self.profile = SeasonalProfile(min_days=c.seasonal_min_days, half_life_days=7.0)
        self.up = Cusum(k=c.cusum_k)
        self.down = Cusum(k=c.cusum_k)
        self.table = EntityTable(
            {"n_": 0.0, "last_ms_": np.nan, "step_s_": np.nan, "mean_": 0.0, "spread_": 0.0,
             "short_": 0.0, "s_mean_": 0.0, "s_var_": 0.0, "record_": 0.0, "quiet_": 0.0}
        )  # fmt: skip

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        rows = self.table.rows(keys)
        for part in (self.baseline, self.profile, self.up, self.down):
            part.rows(keys)
        return rows

    def update(self, rows: np.ndarray, t_ms: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Score each row's new value ``x`` at ``t_ms`` (NaN: none, score NaN), then learn it."""
        x = np.asarray(x, dtype=float)
        t_ms = np.asarray(t_ms, dtype=float)
        ok = ~np.isnan(x)
        t_int = np.nan_to_num(t_ms).astype(np.int64)  # a row with no sample may have no time
        s = {name: self.table[name][rows] for name in self.table.fields}
        clock = (s["n_"] + 1.0) * 1000.0  # a clock of samples: half-lives in samples
        seasonal = self.profile.ready(rows) & (s["step_s_"] <= self.config.seasonal_max_step_s)
        xa = np.where(seasonal, self.profile.adjust(rows, x, t_int), x)
        floor = self._floor(s)
        z = self.baseline.deviation(rows, xa, clock) / np.fmax(self.baseline.scale(rows), floor)
        z = np.clip(np.where(ok, z, np.nan), -self.config.surprise_cap, self.config.surprise_cap)
        up = self.up.update(rows, z)
        down = self.down.update(rows, -z)
        shift = np.fmax(up, down) >= self.config.cusum_h
        surprise = np.fmax(np.abs(np.nan_to_num(z)), np.fmax(up, down) / self.config.cusum_h * 4)
        surprise = np.fmin(surprise, self.config.surprise_cap)
        score = self._refractory(s, self._judge(s, surprise, ok), ok)
        self._learn(rows, s, x, xa, (t_ms, t_int), clock, floor, ok, shift)
        return np.where(ok, score, np.nan)

    def _floor(self, s: Mapping[str, np.ndarray]) -> np.ndarray:
        """The least scale: a share of the long-run spread and of the level (units unknown)."""
        c = self.config
        rel = np.fmax(c.floor_spread * s["spread_"], c.floor_level * np.abs(s["mean_"]))
        return np.fmax(rel, 1e-9)

    def _refractory(
        self, s: dict[str, np.ndarray], score: np.ndarray, ok: np.ndarray
    ) -> np.ndarray:
        """0 for ``refractory`` samples after a score reached ``alert_score``."""
        quiet = s["quiet_"]
        hushed = quiet > 0
        onset = ok & ~hushed & (score >= self.alert_score)
        left = np.where(onset, float(self.config.refractory), np.fmax(quiet - 1.0, 0.0))
        s["quiet_"] = np.where(ok, left, quiet)
        return np.where(hushed, 0.0, score)  # type: ignore[no-any-return]

    def _judge(self, s: dict[str, np.ndarray], surprise: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Surprise against this series' own history of surprise -> score in [0, 1]."""
        c = self.config
        a = _weight(s["n_"], c.short_half_life)
        short = s["short_"] + a * (surprise - s["short_"])
        sd = np.sqrt(s["s_var_"]) + 0.05
        z = (short - s["s_mean_"]) / sd
        decades = -log_ndtr(-z) / LN10
        decades = np.fmax(decades, 0.0)
        score = decades / (decades + c.half_decades)
        # A surprise no larger than the recent largest is a repeat, not news.
        ratio = np.clip(short / np.fmax(s["record_"], 1e-9), 0.0, 1.0)
        score = score * ratio**c.record_power
        fade = np.exp(-np.log(2.0) / c.record_half_life)
        s["record_"] = np.where(ok, np.fmax(short, s["record_"] * fade), s["record_"])
        score = np.where(s["n_"] < 2 * c.warmup, 0.0, score)
        b = _weight(s["n_"], c.surprise_half_life)
        delta = short - s["s_mean_"]
        s["s_mean_"] = np.where(ok, s["s_mean_"] + b * delta, s["s_mean_"])
        s["s_var_"] = np.where(ok, (1 - b) * (s["s_var_"] + b * delta**2), s["s_var_"])
        s["short_"] = np.where(ok, short, s["short_"])
        return score  # type: ignore[no-any-return]

    def _learn(
        self,
        rows: np.ndarray,
        s: dict[str, np.ndarray],
        x: np.ndarray,
        xa: np.ndarray,
        times: tuple[np.ndarray, np.ndarray],
        clock: np.ndarray,
        floor: np.ndarray,
        ok: np.ndarray,
        shift: np.ndarray,
    ) -> None:
        """Learn ``x`` after it was scored; a level shift restarts the level at the new value."""
        c = self.config
        t_ms, t_int = times
        self.baseline.learn_one(rows, np.where(ok, xa, np.nan), clock, floor=floor)
        jump = ok & shift
        if jump.any():
            r = rows[jump]
            self.baseline.table["level_"][r] = xa[jump]
            self.baseline.table["trend_"][r] = 0.0
            self.up.reset(r)
            self.down.reset(r)
        step = np.where(np.isnan(s["last_ms_"]), np.nan, (t_ms - s["last_ms_"]) / 1000.0)
        s["step_s_"] = np.where(
            ok & ~np.isnan(step),
            np.where(np.isnan(s["step_s_"]), step, np.fmin(s["step_s_"] * 1.01, step)),
            s["step_s_"],
        )
        a = _weight(s["n_"], c.long_half_life)
        mean = s["mean_"] + a * (x - s["mean_"])
        spread = s["spread_"] + a * (np.abs(x - mean) - s["spread_"])
        gap = np.nan_to_num(step, nan=1.0)
        self.profile.learn_one(rows, np.where(ok, x - mean, np.nan), t_int, np.fmax(gap, 1e-3))
        s["mean_"] = np.where(ok, mean, s["mean_"])
        s["spread_"] = np.where(ok, spread, s["spread_"])
        s["last_ms_"] = np.where(ok, t_ms, s["last_ms_"])
        s["n_"] = np.where(ok, s["n_"] + 1.0, s["n_"])
        for name, values in s.items():
            self.table[name][rows] = values

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "table": self.table.state_dict(),
            "baseline": self.baseline.state_dict(),
            "profile": self.profile.state_dict(),
            "up": self.up.state_dict(),
            "down": self.down.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.table.load_state_dict(state["table"])
        self.baseline.load_state_dict(state["baseline"])
        self.profile.load_state_dict(state["profile"])
        self.up.load_state_dict(state["up"])
        self.down.load_state_dict(state["down"])


def _weight(n: np.ndarray, half_life: float) -> np.ndarray:
    """An exponential average's weight for the next sample: a plain mean until it is full."""
    return np.fmax(1.0 / (n + 1.0), 1.0 - np.exp(-np.log(2.0) / half_life))  # type: ignore[no-any-return]


def score_series(
    t_ms: np.ndarray, values: np.ndarray, model: SeriesModel | None = None
) -> np.ndarray:
    """One series, sample by sample, through a fresh (or the given) model: scores in [0, 1]."""
    model = model or SeriesModel()
    rows = model.rows(["series"])
    out = np.empty(len(values))
    for i, (t, x) in enumerate(zip(t_ms.tolist(), values.tolist(), strict=True)):
        out[i] = model.update(rows, np.array([t], dtype=float), np.array([x], dtype=float))[0]
    return out
