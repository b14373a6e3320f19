"""Counter arithmetic across resets and wraps, on real-shaped counters."""

from __future__ import annotations

import numpy as np
import pytest

from hbmwatch.query import Aggregation
from hbmwatch.store.aggregate import Partials, aggregate, bucket_increase, counter_increments


def test_nvml_pcie_counter_wrapping_at_2_32_at_10hz() -> None:
    # On the real H200 the NVML PCIe byte counter wrapped within minutes at 10 Hz:
    # about 25 MB per 100 ms of traffic, a 32-bit register.
    rng = np.random.default_rng(3)
    true_increments = rng.integers(20_000_000, 30_000_000, 3000).astype(float)
    true_total = np.cumsum(true_increments)
    register = np.r_[0.0, true_total] % 2**32
    inc = counter_increments(register, (32, 64))
    assert inc.sum() == pytest.approx(true_total[-1])
    assert (inc > 0).all()


def test_64bit_wrap() -> None:
    v = np.array([2.0**64 - 3e9, 2.0**64 - 1e9, 1e9])
    assert counter_increments(v, (32, 64)).tolist() == pytest.approx([2e9, 2e9])


def test_reset_is_not_mistaken_for_a_wrap() -> None:
    # A 32-bit counter in its top half that restarts at a small value after a driver reload,
    # when its pace is small: the wrapped "increase" would be ~1.3e9, far beyond its pace.
    v = np.array([3.0e9, 3.0e9 + 1000, 3.0e9 + 2000, 500.0, 1500.0])
    assert counter_increments(v, (32,)).tolist() == [1000, 1000, 500, 1000]


def test_amd_accumulator_reset_mid_series() -> None:
    # AMD's gauge-typed throttle accumulators restart from zero on a GPU reset.
    v = np.array([585613, 585700, 585800, 0, 120, 260], dtype=float)
    assert counter_increments(v, ()).tolist() == [87, 100, 0, 120, 140]


def test_increase_buckets_sum_to_the_total() -> None:
    t = np.arange(0, 600_000, 10_000)
    v = np.cumsum(np.full(len(t), 7.0))
    _buckets, inc = bucket_increase(t, v, 60_000, ())
    assert inc.sum() == v[-1] - v[0]


def test_aggregate_from_mixed_partials() -> None:
    minute = Partials(
        np.array([0]),
        np.array([60]),
        np.array([1.0]),
        np.array([9.0]),
        np.array([300.0]),
        np.array([4.0]),
    )
    raw = Partials.of_samples(np.array([60_000, 61_000]), np.array([10.0, 20.0]))
    both = Partials.concat([raw, minute])
    assert aggregate(both, 120_000, Aggregation.AVG)[1].tolist() == [330 / 62]
    assert aggregate(both, 120_000, Aggregation.LAST)[1].tolist() == [20.0]
    assert aggregate(both, 120_000, Aggregation.MAX)[1].tolist() == [20.0]
    assert aggregate(both, 120_000, Aggregation.COUNT)[1].tolist() == [62.0]
