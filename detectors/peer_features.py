"""Peer features for fleet outliers: window means, residuals against peers at the same load.

Why a module of its own: what makes a GPU stand out from its same-SKU peers (features, the
residual against the peers at its load, robust z, the isolation score) is arithmetic on
one evaluation's window means, apart from the detector's minute bookkeeping and hysteresis
(``detectors/outliers.py``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import IsolationForest

from hbmwatch.detectors.base import nanmedian, quiet_nan
from hbmwatch.detectors.frame import Frame

#: Per-minute raw signals, in the order of the accumulator columns.
RAW = ("mem_temp", "hot_temp", "power", "clock", "bw", "util")
#: Feature names (what Evidence reports), raw means first, then the peer residuals.
FEATURES = (
    "mem_temp_c", "hot_temp_c", "power_w", "clock_hz", "bw_ratio", "util_ratio",
    "mem_temp_vs_peers_at_load_c", "hot_temp_vs_peers_at_load_c",
    "power_vs_peers_at_load_w", "clock_vs_peers_at_load_ratio",
)  # fmt: skip
#: Smallest robust scale per feature, so a very quiet fleet does not turn 0.1 C into z=10.
MIN_SCALE = np.array([0.5, 0.5, 5.0, np.nan, 0.02, 0.02, 0.5, 0.5, 5.0, 0.005])
MIN_SCALE_CLOCK_FRACTION = 0.005  # of the group's median clock
MEM_RESID, HOT_RESID, POWER_RESID, CLOCK_RESID = 6, 7, 8, 9


@dataclass
class GroupScores:
    """One evaluation's numbers for the GPUs of one peer group."""

    keys: list[str]
    group: str
    values: np.ndarray  # (n, F)
    medians: np.ndarray  # (F,)
    z: np.ndarray  # (n, F)
    iso: np.ndarray  # (n,)


def score_group(
    group: str, keys: list[str], raw: np.ndarray, *, neighbours: int, n_estimators: int
) -> GroupScores | None:
    """Features, robust z and isolation score of one peer group's GPUs (rows of ``raw``).

    ``neighbours``: peers at nearest load whose median a residual is taken against (at
    least 5% of the group); ``n_estimators``: the forest's trees.
    """
    load = fill_missing(raw[:, 4:6])
    near = nearest_at_load(load, max(neighbours, math.ceil(0.05 * len(keys))))
    with np.errstate(all="ignore"):
        clock = raw[:, 3] / nanmedian(raw[:, 3]) - 1.0  # a fraction
    ys = (raw[:, 0], raw[:, 1], raw[:, 2], clock)
    resid = np.stack([peer_residual(y, load, near) for y in ys], axis=1)
    values = np.concatenate([raw, resid], axis=1)
    usable = ~np.isnan(values).all(axis=0)
    medians = nanmedian(values, axis=0)
    scale = 1.4826 * nanmedian(np.abs(values - medians), axis=0)
    floor = MIN_SCALE.copy()
    floor[3] = MIN_SCALE_CLOCK_FRACTION * abs(float(np.nan_to_num(medians[3], nan=1.0)))
    z = (values - medians) / np.fmax(np.nan_to_num(scale), floor)
    X = np.nan_to_num(fill_missing(values[:, usable]))
    if X.shape[1] == 0:
        return None
    forest = IsolationForest(
        n_estimators=n_estimators, max_samples=min(256, len(X)), random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        iso = -forest.fit(X).score_samples(X)
    return GroupScores(keys, group, values, medians, z, iso)


def hot_column(z: np.ndarray) -> int:
    """Memory or hotspot: whichever residual stands further out decides "hot"."""
    return MEM_RESID if np.nan_to_num(z[MEM_RESID]) >= np.nan_to_num(z[HOT_RESID]) else HOT_RESID


def raw_signals(frame: Frame) -> np.ndarray:
    """(G, R, T); memory temperature falls back to the hottest HBM stack where absent."""
    mem = frame.g("mem_temp")
    if frame.stacks.size:
        stack_max = quiet_nan(np.nanmax, frame.stacks, axis=1)
        mem = np.where(np.isnan(mem), stack_max, mem)
    return np.stack([mem, *(frame.g(name) for name in RAW[1:])], axis=1)


def fill_missing(values: np.ndarray) -> np.ndarray:
    """Missing values take their column's median (0 where a whole column is missing)."""
    med = np.nan_to_num(nanmedian(values, axis=0))
    return np.where(np.isnan(values), med[None, :], values)


def nearest_at_load(load: np.ndarray, k: int) -> np.ndarray:
    """Rows of the ``k`` peers whose load (bandwidth, utilisation) is nearest, self excluded.

    Nearest in load rather than a straight line through the group: bandwidth heats HBM
    non-linearly, and a median of neighbours is not pulled by the outlier itself.
    """
    n = len(load)
    dist = np.zeros((n, n))
    for c in range(load.shape[1]):
        dist += np.abs(load[:, None, c] - load[None, :, c])
    dist[np.arange(n), np.arange(n)] = np.inf
    k = min(k, n - 1)
    return np.argpartition(dist, k - 1, axis=1)[:, :k]


def peer_residual(y: np.ndarray, load: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """What the peers at this GPU's load do not explain about ``y``.

    Two stages: a robust straight line through the group (so GPUs at the ends of the load
    range, whose nearest peers all sit on one side, are not pushed out), then the median of
    the nearest peers' leftovers (so a curve the line misses is not blamed on the GPU).
    """
    if np.isnan(y).all():
        return np.full(len(y), np.nan)
    r = robust_line_residual(y, load)
    return r - nanmedian(r[nearest], axis=1)


def robust_line_residual(y: np.ndarray, load: np.ndarray, rounds: int = 3) -> np.ndarray:
    """Residual of a least-squares line on ``load`` refit without points past 3 MADs."""
    X = np.column_stack([np.ones(len(y)), load])
    keep = ~np.isnan(y)
    r = y - nanmedian(y)
    for _ in range(rounds):
        if keep.sum() < X.shape[1] + 3:
            break
        beta = np.linalg.lstsq(X[keep], y[keep], rcond=None)[0]
        r = y - X @ beta
        mad = 1.4826 * float(nanmedian(np.abs(r[keep])))
        keep = ~np.isnan(y) & (np.abs(r) <= 3.0 * max(mad, 1e-9))
    return r


def feature_series(frame: Frame, key: str, column: int) -> str:
    """The series a feature comes from: a residual's is its raw signal's."""
    return frame.series_of("gpu", key, RAW[column if column < len(RAW) else column - len(RAW)])
