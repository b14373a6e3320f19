"""Compressed per-series chunks: how one minute of one series is kept at rest.

Compaction writes version 2; ``decode`` reads both.  Layout of a version 1 blob::

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

Version 2 (``docs/store.md``)::

    byte 0   version (2)
    byte 1   value mode, as in version 1
    byte 2   flags: 1 = regular timestamps, 2 = values in pcodec
    then     timestamps: varints (n, first offset, step) when regular,
             else varints (n, length) + pcodec(int64 offsets)
    rest     values: pcodec(decimal-scaled int64, or float64 when raw), or version 1's
             zlib(shuffle(value stream)), whichever is smaller (pcodec only tried past 32 bytes)

The collector stamps samples with the scheduled tick, so timestamps are nearly always
regular and cost 3-6 bytes; pcodec (https://github.com/pcodec/pcodec) finds each
series' own delta order and bit widths, which zlib over shuffled bytes does not, but its
header costs about 25 bytes, so short flat chunks keep zlib.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pcodec import ChunkConfig
from pcodec.standalone import simple_compress, simple_decompress

VERSION = 1
VERSION_PCO = 2
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
    chunk_start_ms: np.ndarray,
    ts_ms: np.ndarray,
    values: np.ndarray,
    starts: np.ndarray,
    version: int = VERSION_PCO,
) -> EncodedSegments:
    """Encode segments ``[starts[i], starts[i+1])`` of samples sorted by time within each.

    ``chunk_start_ms`` holds each segment's chunk start; timestamps must not precede it.
    ``version`` 1 is kept for reading old data in tests and the codec benchmark.

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

    bounds = enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
    if version == VERSION:
        blobs = [
            bytes((VERSION, int(scale[i])))
            + zlib.compress(_shuffle(ts_stream[a:b]) + _shuffle(val_stream[a:b]), 1)
            for i, (a, b) in bounds
        ]
    else:
        exact = np.where(decimal_rows, ints.view(np.uint64), values.view(np.uint64))
        blobs = _blobs_v2(offsets, delta, dod, starts, scale, val_stream, exact)
    return EncodedSegments(
        blobs=blobs,
        count=lengths,
        min=np.minimum.reduceat(values, starts),
        max=np.maximum.reduceat(values, starts),
        sum=np.add.reduceat(values, starts),
        last=values[ends - 1],
    )


def encode(
    chunk_start_ms: int, ts_ms: np.ndarray, values: np.ndarray, version: int = VERSION_PCO
) -> bytes:
    """Encode one segment (sorted by time)."""
    return encode_segments(
        np.array([chunk_start_ms]),
        ts_ms.astype(np.int64),
        values.astype(np.float64),
        np.array([0]),
        version,
    ).blobs[0]


def decode(blob: bytes, chunk_start_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (ms, absolute) and values of one chunk, of either version."""
    if len(blob) >= 4 and blob[0] == VERSION_PCO:
        return _decode_v2(blob, chunk_start_ms)
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
    return ts.astype(np.int64), _stream_values(_unshuffle(body[8 * n :], n), mode)


def _stream_values(raw: np.ndarray, mode: int) -> np.ndarray:
    """Values back from version 1's value stream (integer deltas or XORed bits)."""
    if mode == RAW_FLOAT:
        return np.bitwise_xor.accumulate(raw).view(np.float64)
    if mode <= MAX_SCALE:
        return np.cumsum(_unzigzag(raw)).astype(np.float64) / _POW10[mode]
    raise CorruptChunk(f"unknown value mode {mode}")


# --- version 2 ---------------------------------------------------------------------------

_PCO = ChunkConfig()
_REGULAR, _PCO_VALUES = 1, 2
_PCO_WORTH = 32  # pcodec's header alone takes about 25 bytes: smaller zlib bodies stay


def varints(*numbers: int) -> bytes:
    out = bytearray()
    for n in numbers:
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


def read_varints(blob: bytes, pos: int, count: int) -> tuple[list[int], int]:
    numbers = []
    for _ in range(count):
        n = shift = 0
        while True:
            if pos >= len(blob) or shift > 63:
                raise CorruptChunk("chunk ends inside a length")
            byte = blob[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        numbers.append(n)
    return numbers, pos


def _blobs_v2(
    offsets: np.ndarray,
    delta: np.ndarray,
    dod: np.ndarray,
    starts: np.ndarray,
    scale: np.ndarray,
    stream: np.ndarray,
    exact: np.ndarray,
) -> list[bytes]:
    """Version 2 blobs; which segments have regular timestamps is found for all at once."""
    n = len(offsets)
    ends = np.append(starts[1:], n)
    lengths = ends - starts
    within = np.arange(n) - np.repeat(starts, lengths)
    irregular = np.logical_or.reduceat((within >= 2) & (dod != 0), starts)
    step = np.where(lengths > 1, delta[np.minimum(starts + 1, n - 1)], 0)
    irregular |= (offsets[starts] < 0) | (step < 0)
    rows = zip(
        starts.tolist(), ends.tolist(), irregular.tolist(), offsets[starts].tolist(),
        step.tolist(), scale.tolist(), strict=True,
    )  # fmt: skip
    return [
        _encode_v2(
            None if bad else varints(b - a, first, st), offsets[a:b], k, stream[a:b], exact[a:b]
        )
        for a, b, bad, first, st, k in rows
    ]


def _encode_v2(
    head: bytes | None, offsets: np.ndarray, scale: int, stream: np.ndarray, exact: np.ndarray
) -> bytes:
    """One segment.  ``head`` holds regular timestamps (None: irregular, so pcodec them);
    ``exact`` the scaled integers (or the float bits when raw) as uint64."""
    flags = 0
    if head is None:
        packed = simple_compress(offsets, _PCO)
        head = varints(len(offsets), len(packed)) + packed
    else:
        flags |= _REGULAR
    body = zlib.compress(_shuffle(stream), 1)
    if len(body) > _PCO_WORTH:
        pco = simple_compress(exact.view(np.float64 if scale == RAW_FLOAT else np.int64), _PCO)
        if len(pco) < len(body):
            body, flags = pco, flags | _PCO_VALUES
    return bytes((VERSION_PCO, scale, flags)) + head + body


def _decode_v2(blob: bytes, chunk_start_ms: int) -> tuple[np.ndarray, np.ndarray]:
    mode, flags = blob[1], blob[2]
    if mode > MAX_SCALE and mode != RAW_FLOAT:
        raise CorruptChunk(f"unknown value mode {mode}")
    try:
        if flags & _REGULAR:
            (n, first, step), pos = read_varints(blob, 3, 3)
            ts = first + step * np.arange(n, dtype=np.int64)
        else:
            (n, length), pos = read_varints(blob, 3, 2)
            ts = simple_decompress(blob[pos : pos + length]).astype(np.int64)
            pos += length
        if flags & _PCO_VALUES:
            got = simple_decompress(blob[pos:])
            values = got.astype(np.float64) / _POW10[mode] if mode != RAW_FLOAT else got
        else:
            raw = _unshuffle(zlib.decompress(blob[pos:]), n)
            values = _stream_values(raw, mode)
    except (RuntimeError, ValueError, zlib.error) as exc:
        raise CorruptChunk(f"chunk body does not decode: {exc}") from None
    if len(ts) != n or len(values) != n or values.dtype != np.float64:
        raise CorruptChunk(f"chunk of {n} samples decodes to {len(ts)}/{len(values)}")
    return ts + chunk_start_ms, values


def decode_many(
    blobs: Sequence[bytes], starts: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Timestamps and values of many chunks, concatenated in order, and each one's count
    (the hour pass decodes sixty a series).

    Version 2 chunks with regular timestamps and a zlib value stream (most minutes) are
    decoded together, chunks of one length in one numpy array; the rest one by one.
    """
    slow: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    fast: list[tuple[int, int, int, int]] = []  # index, first, step, scale
    bodies: list[bytes] = []
    counts = np.zeros(len(blobs), dtype=np.int64)
    for i, (blob, start) in enumerate(zip(blobs, starts, strict=True)):
        zlib_regular = len(blob) >= 4 and blob[0] == VERSION_PCO and blob[2] == _REGULAR
        if zlib_regular and blob[1] <= MAX_SCALE:
            (n, first, step), pos = read_varints(blob, 3, 3)
            fast.append((i, first + start, step, blob[1]))
            bodies.append(blob[pos:])
            counts[i] = n
        else:
            slow[i] = decode(blob, start)
            counts[i] = len(slow[i][0])
    offsets = np.r_[0, np.cumsum(counts)]
    ts = np.empty(offsets[-1], dtype=np.int64)
    values = np.empty(offsets[-1], dtype=np.float64)
    for i, (t, v) in slow.items():
        ts[offsets[i] : offsets[i + 1]], values[offsets[i] : offsets[i + 1]] = t, v
    if fast:
        _decode_regular_zlib(fast, bodies, counts, offsets, ts, values)
    return ts, values, counts


def _decode_regular_zlib(
    fast: list[tuple[int, int, int, int]],
    bodies: list[bytes],
    counts: np.ndarray,
    offsets: np.ndarray,
    ts: np.ndarray,
    values: np.ndarray,
) -> None:
    """Fill ``ts`` and ``values`` at ``offsets`` from version 2 chunks' zlib bodies."""
    try:
        raw = [zlib.decompress(b) for b in bodies]
    except zlib.error as exc:
        raise CorruptChunk(f"chunk body does not decompress: {exc}") from None
    index = np.array([f[0] for f in fast], dtype=np.int64)
    n = counts[index]
    if any(len(r) != 8 * k for r, k in zip(raw, n.tolist(), strict=True)):
        raise CorruptChunk("chunk body is not its count of samples")
    first, step, scale = (np.array([f[j] for f in fast], dtype=np.int64) for j in (1, 2, 3))
    for length in np.unique(n).tolist():  # one (chunks, 8, n) array per length: byte planes
        pick = np.flatnonzero(n == length)
        planes = np.frombuffer(b"".join(raw[k] for k in pick.tolist()), dtype=np.uint8)
        stream = planes.reshape(len(pick), 8, length).transpose(0, 2, 1).copy().view(np.uint64)
        ints = np.cumsum(_unzigzag(stream.reshape(len(pick), length)), axis=1)
        where = offsets[index[pick]][:, None] + np.arange(length)
        values[where] = ints.astype(np.float64) / _POW10[scale[pick]][:, None]
        ts[where] = first[pick][:, None] + step[pick][:, None] * np.arange(length)
