"""The chunk codec is lossless for any finite floats and rejects blobs it did not write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmwatch.store import codec

finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 59_999), min_size=1, max_size=200, unique=True),
    values=st.lists(finite, min_size=200, max_size=200),
    start=st.integers(0, 2**42).map(lambda x: x - x % 60_000),
)
def test_round_trip_bit_exact(offsets: list[int], values: list[float], start: int) -> None:
    ts = np.array(sorted(offsets), dtype=np.int64) + start
    v = np.array(values[: len(ts)], dtype=np.float64)
    t2, v2 = codec.decode(codec.encode(start, ts, v), start)
    assert t2.tolist() == ts.tolist()
    assert v2.view(np.uint64).tolist() == v.view(np.uint64).tolist()  # -0.0 and all


def test_negative_zero_round_trips_bit_exact() -> None:
    """A decimal scale read -0.0 as the integer 0 (found by the test above, on CI)."""
    for values in ([-0.0], [1.5, -0.0, 2.0], [0.0, -0.0]):
        v = np.array(values)
        ts = np.arange(len(v), dtype=np.int64) * 1000
        _, v2 = codec.decode(codec.encode(0, ts, v), 0)
        assert v2.view(np.uint64).tolist() == v.view(np.uint64).tolist()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.decimals(-1e6, 1e6, places=3, allow_nan=False), min_size=1, max_size=60),
        min_size=1,
        max_size=20,
    )
)
def test_many_segments_at_once(segments: list[list]) -> None:
    lengths = [len(s) for s in segments]
    values = np.array([float(x) for s in segments for x in s])
    ts = np.concatenate([np.arange(n, dtype=np.int64) * 1000 for n in lengths])
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    enc = codec.encode_segments(np.zeros(len(segments), dtype=np.int64), ts, values, starts)
    for i, seg in enumerate(segments):
        _t, v = codec.decode(enc.blobs[i], 0)
        assert v.tolist() == [float(x) for x in seg]
        assert enc.count[i] == len(seg)
        assert enc.max[i] == max(float(x) for x in seg)


def test_sensor_shaped_values_compress_well() -> None:
    ts = np.arange(60, dtype=np.int64) * 1000
    temps = np.array([45.0] * 30 + [46.0] * 30)
    assert len(codec.encode(0, ts, temps)) / 60 < 1.0


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x09\x00abc",
        b"\x01\x00not zlib",
        b"\x01\x0c" + __import__("zlib").compress(b"\x00" * 16),
    ],
)
def test_corrupt_blobs_raise(blob: bytes) -> None:
    with pytest.raises(codec.CorruptChunk):
        codec.decode(blob, 0)
