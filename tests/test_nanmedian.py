"""The detectors' fast NaN-aware median agrees with numpy's everywhere numpy defines it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hbmwatch.detectors.base import nanmedian, quiet_nan
from hbmwatch.detectors.scorers import group_median


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


@pytest.mark.parametrize("fn", [np.nanmean, np.nanmax, np.nanmin, np.nanmedian])
@pytest.mark.parametrize("shape", [(5,), (7, 3), (4, 8, 6), (0, 3), (3, 0)])
def test_quiet_nan_matches_numpy_without_warnings(fn: object, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape) + 7)
    a = rng.normal(size=shape)
    a[rng.random(shape) < 0.3] = np.nan
    if a.ndim > 1 and a.shape[0] > 1 and a.shape[1] > 0:
        a[:, 0] = np.nan
    for axis in (None, *range(a.ndim)):
        if fn in (np.nanmax, np.nanmin) and a.size == 0 and axis is None:
            continue  # numpy refuses; quiet_nan gives NaN
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                expected = fn(a, axis=axis)  # type: ignore[operator]
            except ValueError:  # numpy refuses a zero-size reduction without identity
                continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # none may escape
            got = quiet_nan(fn, a, axis=axis)
        np.testing.assert_allclose(got, expected, equal_nan=True)
