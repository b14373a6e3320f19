"""Compressed per-series chunks: how one minute of one series is kept at rest.

Layout of a chunk blob (version 1)::

    byte 0   version
    byte 1   value mode: 0..9 = decimal scale k (values are integers / 10**k), 255 = raw float64
    rest     zlib( shuffle(zigzag(delta-of-delta of timestamps))
                 + shuffle(zigzag(delta of scaled values)) )        # or of XORed float bits

Timestamps are milliseconds after the chunk's start.  Decimal scaling is VictoriaMetrics'
trick: sensor values are short decimals (45 C, 312.125 W), so they become small integers
whose deltas are smaller still; the byte shuffle puts the zero high bytes together for zlib.
A value is only scaled when ``int / 10**k`` gives back the very same float, so the codec is
lossless.  Encoding is vectorised over many segments at once, because compaction encodes a
hundred thousand series a minute.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

VERSION = 1
RAW_FLOAT = 255
MAX_SCALE = 9
_MAX_EXACT_INT = float(2**53)
_POW10 = 10.0 ** np.arange(MAX_SCALE + 1)


class CorruptChunk(ValueError):
    """A blob this codec did not write (or a damaged one)."""


@dataclass(frozen=True, slots=True)
class EncodedSegments:
    """Blobs and minute statistics for consecutive segments of sorted samples."""

    blobs: list[bytes]
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    last: np.ndarray


def _zigzag(x: np.ndarray) -> np.ndarray:
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)).view(np.int64)) ^ -((u & np.uint64(1)).view(np.int64))


def _shuffle(u: np.ndarray) -> bytes:
    return u.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unshuffle(raw: bytes, n: int) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).reshape(8, n).T.copy().view(np.uint64).ravel()


@np.errstate(over="ignore", invalid="ignore")
def _segment_scales(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Smallest decimal scale that round-trips every value of each segment, or RAW_FLOAT."""
    scale = np.full(len(starts), RAW_FLOAT, dtype=np.int64)
    undecided = np.ones(len(starts), dtype=bool)
    signed_zero = (values == 0) & np.signbit(values)  # -0.0 == 0.0, but an integer has no -0
    for k in range(MAX_SCALE + 1):
        scaled = np.rint(values * _POW10[k])
        exact = (scaled / _POW10[k] == values) & (np.abs(scaled) < _MAX_EXACT_INT) & ~signed_zero
        seg_ok = np.logical_and.reduceat(exact, starts)
        pick = seg_ok & undecided
        scale[pick] = k
        undecided &= ~pick
        if not undecided.any():
            break
    return scale


@np.errstate(over="ignore", invalid="ignore")
def encode_segments(
    chunk_start_ms: np.ndarray, ts_ms: np.ndarray, values: np.ndarray, starts: np.ndarray
) -> EncodedSegments:
    """Encode segments ``[starts[i], starts[i+1])`` of samples sorted by time within each.

    ``chunk_start_ms`` holds each segment's chunk start; timestamps must not precede it.

    >>> ts = np.array([1000, 2000, 3000, 500, 1500], dtype=np.int64)
    >>> vals = np.array([45.0, 46.0, 46.0, 312.125, 311.5])
    >>> enc = encode_segments(np.array([0, 0]), ts, vals, np.array([0, 3]))
    >>> [int(c) for c in enc.count], [float(m) for m in enc.max]
    ([3, 2], [46.0, 312.125])
    >>> t, v = decode(enc.blobs[1], 0)
    >>> t.tolist(), v.tolist()
    ([500, 1500], [312.125, 311.5])
    """
    n = len(ts_ms)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.append(starts[1:], n)
    lengths = ends - starts
    seg_of_row = np.repeat(np.arange(len(starts)), lengths)

    # Timestamps: offsets within the chunk, then delta of delta per segment.
    offsets = ts_ms - np.repeat(np.asarray(chunk_start_ms, dtype=np.int64), lengths)
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    delta = np.where(first, offsets, offsets - np.roll(offsets, 1))
    dod = np.where(first, delta, delta - np.roll(delta, 1))
    ts_stream = _zigzag(dod.astype(np.int64))

    # Values: decimal-scaled integer deltas, or XOR of float bits.
    scale = _segment_scales(values, starts)
    row_scale = scale[seg_of_row]
    decimal_rows = row_scale != RAW_FLOAT
    ints = np.zeros(n, dtype=np.int64)
    ints[decimal_rows] = np.rint(values[decimal_rows] * _POW10[row_scale[decimal_rows]]).astype(
        np.int64
    )
    int_delta = np.where(first, ints, ints - np.roll(ints, 1))
    bits = values.view(np.uint64)
    xor = np.where(first, bits, bits ^ np.roll(bits, 1))
    val_stream = np.where(decimal_rows, _zigzag(int_delta), xor)

    blobs = [
        bytes((VERSION, int(scale[i])))
        + zlib.compress(_shuffle(ts_stream[a:b]) + _shuffle(val_stream[a:b]), 1)
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
    ]
    return EncodedSegments(
        blobs=blobs,
        count=lengths,
        min=np.minimum.reduceat(values, starts),
        max=np.maximum.reduceat(values, starts),
        sum=np.add.reduceat(values, starts),
        last=values[ends - 1],
    )


def encode(chunk_start_ms: int, ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    """Encode one segment (sorted by time)."""
    return encode_segments(
        np.array([chunk_start_ms]),
        ts_ms.astype(np.int64),
        values.astype(np.float64),
        np.array([0]),
    ).blobs[0]


def decode(blob: bytes, chunk_start_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (ms, absolute) and values of one chunk."""
    if len(blob) < 3 or blob[0] != VERSION:
        raise CorruptChunk(f"unknown chunk version {blob[:1]!r}")
    mode = blob[1]
    try:
        body = zlib.decompress(blob[2:])
    except zlib.error as exc:
        raise CorruptChunk(f"chunk body does not decompress: {exc}") from None
    if len(body) % 16:
        raise CorruptChunk(f"chunk body of {len(body)} bytes is not whole samples")
    n = len(body) // 16
    dod = _unzigzag(_unshuffle(body[: 8 * n], n))
    ts = np.cumsum(np.cumsum(dod)) + chunk_start_ms
    raw = _unshuffle(body[8 * n :], n)
    if mode == RAW_FLOAT:
        values = np.bitwise_xor.accumulate(raw).view(np.float64)
    elif mode <= MAX_SCALE:
        values = np.cumsum(_unzigzag(raw)).astype(np.float64) / _POW10[mode]
    else:
        raise CorruptChunk(f"unknown value mode {mode}")
    return ts.astype(np.int64), values
