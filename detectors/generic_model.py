"""The generic series model: an anomaly score in [0, 1] for any one-dimensional series.

For series hbmwatch knows nothing about (a user's own, through the ``mapped`` source or
``score-file``): built from the scorers the domain detectors use (``scorers.py``), causal
(each sample is scored before it is learned) and vectorised over entities, each entity with
its own timestamps.  ``SeriesAnomalies`` (``generic.py``) turns the scores into findings.

This first version is a two-sided level-and-trend baseline; issue 19 grows it (daily
profile, change points, a scale relative to the series).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hbmwatch.detectors.scorers import TrendBaseline


class SeriesModel:
    """Streaming scores for many series at once; ``update`` scores, then learns.

    >>> m = SeriesModel()
    >>> rows = m.rows(["queue"])
    >>> t = 1_800_000_000_000
    >>> s = [float(m.update(rows, np.array([t + i * 60_000]), np.array([10.0]))[0])
    ...      for i in range(300)]
    >>> max(s) < 0.5, float(m.update(rows, np.array([t + 300 * 60_000]), np.array([90.0]))[0])
    (True, 1.0)
    """

    def __init__(self, *, threshold_z: float = 6.0, warmup_samples: int = 30) -> None:
        self.threshold_z = threshold_z
        self.warmup_samples = warmup_samples
        self.baseline = TrendBaseline(
            level_half_life_s=3_600.0, trend_half_life_s=6 * 3_600.0,
            scale_half_life_s=6 * 3_600.0, min_scale=1e-9, warmup_s=0.0,
        )  # fmt: skip

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        return self.baseline.rows(keys)

    def update(self, rows: np.ndarray, t_ms: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Score each row's new value ``x`` at ``t_ms`` (NaN: none, score NaN), then learn it."""
        n = self.baseline.table["n_"][rows]
        z = np.abs(self.baseline.deviation(rows, x, t_ms)) / self.baseline.scale(rows)
        score = np.clip(np.nan_to_num(z, nan=0.0) / self.threshold_z, 0.0, 1.0)
        score = np.where(n < self.warmup_samples, 0.0, score)
        self.baseline.learn_one(rows, x, t_ms)
        return np.where(np.isnan(x), np.nan, score)

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])


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
