"""The chunk codec is lossless for any finite floats, reads both versions and rejects blobs
it did not write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmwatch.store import codec

finite = st.floats(allow_nan=False, allow_infinity=False)
VERSIONS = (codec.VERSION, codec.VERSION_PCO)


@settings(max_examples=300, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 3_599_999), min_size=1, max_size=200, unique=True),
    values=st.lists(finite, min_size=200, max_size=200),
    start=st.integers(0, 2**42).map(lambda x: x - x % 60_000),
    version=st.sampled_from(VERSIONS),
)
def test_round_trip_bit_exact(
    offsets: list[int], values: list[float], start: int, version: int
) -> None:
    ts = np.array(sorted(offsets), dtype=np.int64) + start
    v = np.array(values[: len(ts)], dtype=np.float64)
    t2, v2 = codec.decode(codec.encode(start, ts, v, version), start)
    assert t2.tolist() == ts.tolist()
    assert v2.view(np.uint64).tolist() == v.view(np.uint64).tolist()  # -0.0 and all


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 3600),
    first=st.integers(0, 999),
    step=st.sampled_from([0, 1, 1000, 15_000]),
    values=st.lists(st.decimals(-1e9, 1e9, places=2, allow_nan=False), min_size=1),
)
def test_regular_timestamps_round_trip(n: int, first: int, step: int, values: list) -> None:
    """The collector's regular 1 s ticks (three numbers in version 2), any length."""
    ts = first + step * np.arange(n, dtype=np.int64)
    v = np.resize(np.array([float(x) for x in values]), n)
    t2, v2 = codec.decode(codec.encode(0, ts, v), 0)
    assert t2.tolist() == ts.tolist() and v2.tolist() == v.tolist()


def test_version_1_blobs_still_read() -> None:
    """Blobs written by the zlib codec before version 2 (hex from that release)."""
    ts = np.array([0, 1000, 2000, 3500]) + 60_000
    old = {
        "0103780163b8c0f082819d81990107987081412a9e9d419e918181039b1200aa0a03cb": [
            45.0, 46.0, 46.0, 312.125,
        ],
        "01ff780163b8c0f082819d8199010798c5368761e69b528699331918660a7630cc5c6ac330b3f609c3ce3e"
        "631e7bc77d0d00367a0e15": [0.1, 1e300, -2.5, 3.0],
    }  # fmt: skip
    for blob, values in old.items():
        t, v = codec.decode(bytes.fromhex(blob), 60_000)
        assert t.tolist() == ts.tolist() and v.tolist() == values
        assert codec.encode(60_000, ts, np.array(values), codec.VERSION).hex() == blob


def test_pcodec_wins_on_counters_and_zlib_keeps_flat_minutes() -> None:
    """Version 2 picks the smaller value coding per chunk: never much above version 1."""
    ts = np.arange(60, dtype=np.int64) * 1000
    energy = np.cumsum(np.round(np.random.default_rng(0).normal(550, 8, 60), 3))
    flat = np.full(60, 192e9)
    for v in (energy, flat):
        new, old = codec.encode(0, ts, v), codec.encode(0, ts, v, codec.VERSION)
        assert len(new) <= len(old)
    assert len(codec.encode(0, ts, energy)) < 0.7 * len(codec.encode(0, ts, energy, 1))


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
        b"\x02\x00\x01\x80",  # version 2: ends inside a length
        b"\x02\x00\x00\x05\x10not pcodec",
        b"\x02\x0c\x01\x01\x00\x00",
        b"\x02\x00\x03\x02\x00\xe8\x07not pcodec",
        b"\x02\x00\x01\x03\x00\xe8\x07" + __import__("zlib").compress(b"\x00" * 16),
    ],
)
def test_corrupt_blobs_raise(blob: bytes) -> None:
    with pytest.raises(codec.CorruptChunk):
        codec.decode(blob, 0)


def test_decode_many_is_decode_of_each() -> None:
    """The batched decoder gives back every chunk's samples bit for bit, whatever its kind:
    flat, decimal, raw floats, counters, irregular timestamps, version 1."""
    rng = np.random.default_rng(0)
    blobs, starts, want = [], [], []
    for k in range(600):
        n = int(rng.integers(1, 80))
        start = int(rng.integers(0, 10**12))
        values = [
            np.full(n, 45.0),
            np.round(rng.normal(300, 20, n), 3),
            rng.normal(0, 1, n),
            np.cumsum(rng.integers(0, 10**9, n)).astype(float),
            np.round(rng.normal(1, 0.01, n), 9),
        ][k % 5]
        offsets = np.sort(rng.choice(60_000, n, replace=False)) if k % 7 == 0 else np.arange(n)
        ts = (start + offsets * (1 if k % 7 == 0 else 1000)).astype(np.int64)
        blobs.append(codec.encode(start, ts, values, version=1 if k % 11 == 0 else 2))
        starts.append(start)
        want.append((ts, values))
    ts, values, counts = codec.decode_many(blobs, starts)
    assert counts.tolist() == [len(t) for t, _ in want]
    assert np.array_equal(ts, np.concatenate([t for t, _ in want]))
    expected = np.concatenate([v for _, v in want])
    assert np.array_equal(values.view(np.uint64), expected.view(np.uint64))
    with pytest.raises(codec.CorruptChunk):
        codec.decode_many([blobs[1][:-3] + b"\x00\x00\x00"], [starts[1]])
