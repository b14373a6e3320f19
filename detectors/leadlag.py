"""How a candidate cause moved against a regression: its change, its onset, its lead.

The statistics root-cause ranking (``detectors/rootcause.py``) computes on the context ring,
apart from the ranking itself: each is plain numpy over (GPUs x slots) windows.
"""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors.base import quiet_nan


def resolution(times: np.ndarray) -> int:
    return int(np.median(np.diff(times))) if len(times) > 1 else 5000


def change(stat: str, base: np.ndarray, inc: np.ndarray) -> np.ndarray:
    b = quiet_nan(np.nanmean, base, axis=1)
    if stat == "max":
        return quiet_nan(np.nanmax, inc, axis=1) - np.fmax(np.nan_to_num(b), 0.0)
    m = quiet_nan(np.nanmean, inc, axis=1)
    if stat == "drop":
        return np.where(b > 0, (b - quiet_nan(np.nanmin, inc, axis=1)) / b, np.nan)
    if stat == "level":
        return m - 0.85
    return m - np.nan_to_num(b)


def onset(
    times: np.ndarray, series: np.ndarray, base: np.ndarray, ref: float, stat: str
) -> int | None:
    """First slot where the candidate moved half its reference size away from its baseline."""
    b = float(np.nan_to_num(quiet_nan(np.nanmean, base[None, :], axis=1)[0]))
    moved = (b - series) / max(b, 1e-9) if stat == "drop" else series - b
    hits = np.flatnonzero(np.nan_to_num(moved) >= ref / 2)
    return int(times[hits[0]]) if len(hits) else None


def lagged_corr(x: np.ndarray, y: np.ndarray, max_lag: int) -> tuple[float, int]:
    """Best Pearson correlation of ``x`` leading ``y`` by 0..max_lag slots, and that lag.

    Every lag at once, on a (lags x slots) layout padded with NaN (ranking runs it for
    every candidate of every open regression, each cycle).  Pairs with a NaN are left out;
    a lag needs four pairs and some variation on both sides.
    """
    n = min(len(x), len(y))
    lags = np.arange(max(0, min(max_lag, n - 3)) + 1)
    if n == 0:
        return 0.0, 0
    i = np.arange(n)
    j = i[None, :] + lags[:, None]  # y's index for x's slot i at each lag
    inside = j < n
    a = np.where(inside, x[:n][None, :], np.nan)
    b = np.where(inside, y[np.minimum(j, n - 1)], np.nan)
    ok = ~(np.isnan(a) | np.isnan(b))
    k = ok.sum(axis=1)
    a, b = np.where(ok, a, 0.0), np.where(ok, b, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        da = np.where(ok, a - a.sum(axis=1, keepdims=True) / k[:, None], 0.0)
        db = np.where(ok, b - b.sum(axis=1, keepdims=True) / k[:, None], 0.0)
        den = np.sqrt((da * da).sum(axis=1) * (db * db).sum(axis=1))
        r = np.clip((da * db).sum(axis=1) / den, -1.0, 1.0)
    r = np.where((k >= 4) & (den > 1e-12), r, -np.inf)
    best = int(np.argmax(r))
    return (float(r[best]), best) if r[best] > 0 else (0.0, 0)
