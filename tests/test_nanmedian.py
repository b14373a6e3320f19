"""The detectors' fast NaN-aware median agrees with numpy's everywhere numpy defines it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from detectors.base import nanmedian


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
