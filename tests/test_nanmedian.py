"""The detectors' fast NaN-aware median agrees with numpy's everywhere numpy defines it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from detectors.base import nanmedian
from detectors.scorers import group_median


@pytest.mark.parametrize("shape", [(5,), (7, 3), (1, 4), (10, 60), (4, 8, 6), (0, 3), (3, 0)])
def test_nanmedian_matches_numpy(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape) * 100 + sum(shape))
    a = rng.normal(size=shape)
    a[rng.random(shape) < 0.3] = np.nan
    if a.ndim > 1 and a.shape[0] > 1 and a.shape[1] > 0:
        a[:, 0] = np.nan  # an all-NaN slice
    for axis in (None, *range(a.ndim)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(a, axis=axis)
        np.testing.assert_allclose(nanmedian(a, axis=axis), expected, equal_nan=True)


@pytest.mark.parametrize("shape", [(50,), (50, 3), (7, 10), (1,), (64, 2)])
def test_group_median_matches_numpy_per_group(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    for _ in range(10):
        values = rng.normal(size=shape)
        values[rng.random(shape) < 0.3] = np.nan
        groups = rng.integers(0, 5, size=shape[0])
        med, count = group_median(values, groups)
        for g in np.unique(groups):
            members = groups == g
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                expected = np.nanmedian(values[members], axis=0)
            np.testing.assert_allclose(med[members], np.broadcast_to(expected, med[members].shape))
            present = ~np.isnan(values[members]).reshape(members.sum(), -1).all(axis=1)
            assert (count[members] == present.sum()).all()
