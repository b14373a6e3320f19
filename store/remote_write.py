"""Prometheus remote-write 1.0: samples as a snappy-compressed protobuf ``WriteRequest``.

The messages are the published ``prompb`` ones (remote.proto and types.proto of
prometheus/prometheus), declared here as a descriptor so no generated code is vendored.
A request is built by concatenating encoded ``TimeSeries`` fields, which protobuf defines to
be the same message as building it whole: the labels of a series are encoded once (by the
library) and kept, since a collector sends the same series every scrape; only the samples
are encoded per request.  ``tests/test_remote_write.py`` checks the bytes against the
library's own encoding.

What a receiver's answer means (as Prometheus' own sender reads it):

* 2xx: stored.
* 4xx other than 429: the receiver refuses these samples (out of order, too old, bad
  labels); sending them again would be refused again, so they are counted as rejected and
  never retried.
* 429, 5xx, a refused connection or a timeout: the receiver cannot take them now; the
  caller keeps them (the collector's disk spool) and retries with backoff.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import cramjam
import httpx
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from hbmwatch.records import SeriesKey

CONTENT_HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
#: How much of a receiver's refusal goes into a log line or an error.
MAX_REASON_CHARS = 300


def _declare() -> descriptor_pool.DescriptorPool:
    """``prometheus.WriteRequest``, ``TimeSeries``, ``Label``, ``Sample`` (prompb, v1)."""
    fd = descriptor_pb2.FileDescriptorProto(name="hbmwatch_prompb.proto", package="prometheus")
    f = descriptor_pb2.FieldDescriptorProto
    rep, opt = f.LABEL_REPEATED, f.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            m.field.add(name=fname, number=number, label=label, type=ftype,
                        type_name=type_name or None)  # fmt: skip

    message("Label", ("name", 1, opt, f.TYPE_STRING, ""), ("value", 2, opt, f.TYPE_STRING, ""))
    message("Sample", ("value", 1, opt, f.TYPE_DOUBLE, ""), ("timestamp", 2, opt, f.TYPE_INT64, ""))
    message(
        "TimeSeries",
        ("labels", 1, rep, f.TYPE_MESSAGE, ".prometheus.Label"),
        ("samples", 2, rep, f.TYPE_MESSAGE, ".prometheus.Sample"),
    )
    message("WriteRequest", ("timeseries", 1, rep, f.TYPE_MESSAGE, ".prometheus.TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return pool


_POOL = _declare()
WriteRequest = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("prometheus.WriteRequest")
)
TimeSeries = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("prometheus.TimeSeries"))


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    out = bytearray()
    n &= (1 << 64) - 1  # int64 as protobuf writes it: two's complement, ten bytes if negative
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


#: Encoded labels by series, kept while the process lives (bounded: cleared past this).
_LABELS: dict[SeriesKey, bytes] = {}
MAX_KEPT_LABELS = 2_000_000


def labels_blob(key: SeriesKey) -> bytes:
    """The encoded ``labels`` fields of a series: ``__name__`` and its labels, sorted by
    name as receivers require, encoded by the protobuf library."""
    pairs = sorted([("__name__", key.metric), *key.labels])
    blob = TimeSeries(labels=[{"name": n, "value": v} for n, v in pairs]).SerializeToString()
    if len(_LABELS) >= MAX_KEPT_LABELS:
        _LABELS.clear()
    _LABELS[key] = blob
    return blob


def _samples_blob(timestamps_ms: np.ndarray, values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Every sample as an encoded ``samples`` field (``Sample{value, timestamp}``), in one
    buffer, and the end offset of each: built over whole arrays, since per-sample Python
    was most of a request's cost (8 us a sample)."""
    n = len(timestamps_ms)
    unsigned = timestamps_ms.astype(np.int64).view(np.uint64)
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = ((unsigned[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    significant = (unsigned[:, None] >> shifts) != 0
    lengths = np.maximum(1, 10 - np.argmax(significant[:, ::-1], axis=1))
    lengths[~significant.any(axis=1)] = 1
    width = np.arange(10)
    groups[width[None, :] < (lengths[:, None] - 1)] |= 0x80
    record = np.zeros((n, 22), dtype=np.uint8)
    record[:, 0] = 0x12  # field 2 (samples), length-delimited
    record[:, 1] = 10 + lengths  # 0x09 + 8-byte double + 0x10 + varint
    record[:, 2] = 0x09  # field 1 (value), fixed64
    record[:, 3:11] = values.astype("<f8").view(np.uint8).reshape(n, 8)
    record[:, 11] = 0x10  # field 2 (timestamp), varint
    record[:, 12:22] = groups
    keep = np.ones((n, 22), dtype=bool)
    keep[:, 12:22] = width[None, :] < lengths[:, None]  # the varint's own bytes
    return record[keep].tobytes(), np.cumsum(12 + lengths)


def encode_arrays(
    keys: Sequence[SeriesKey], counts: Sequence[int], timestamps_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """The uncompressed ``WriteRequest``: ``keys[i]`` owns the next ``counts[i]`` samples of
    the arrays, in time order."""
    blob, ends = _samples_blob(timestamps_ms, values)
    bounds = np.r_[0, ends[np.cumsum(counts) - 1]].tolist() if len(keys) else [0]
    parts: list[bytes] = []
    for i, key in enumerate(keys):
        labels = _LABELS.get(key) or labels_blob(key)
        start, end = bounds[i], bounds[i + 1]
        parts += (b"\x0a", _varint(len(labels) + end - start), labels, blob[start:end])
    return b"".join(parts)


def encode(series: Mapping[SeriesKey, Iterable[tuple[int, float]]]) -> bytes:
    """The uncompressed ``WriteRequest`` of these series' ``(timestamp_ms, value)`` samples,
    which must be in time order within each series."""
    keys, counts, stamps, values = [], [], [], []
    for key, samples in series.items():
        pairs = list(samples)
        keys.append(key)
        counts.append(len(pairs))
        stamps += [t for t, _ in pairs]
        values += [v for _, v in pairs]
    return encode_arrays(keys, counts, np.array(stamps, np.int64), np.array(values, np.float64))


def compress(payload: bytes) -> bytes:
    """Snappy's block format (not the framed one), as remote-write 1.0 specifies."""
    return bytes(cramjam.snappy.compress_raw(payload))


@dataclass(frozen=True)
class Outcome:
    """How a receiver answered one request."""

    status: int  # 0: no HTTP answer (refused, timed out)
    reason: str = ""

    @property
    def stored(self) -> bool:
        return 200 <= self.status < 300

    @property
    def retry(self) -> bool:
        """The receiver may take these later: keep them and retry."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class RemoteWriteClient:
    """Sends requests to one remote-write endpoint over a kept-alive connection."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
    ) -> None:
        self.url = url
        sent = {**CONTENT_HEADERS, "User-Agent": "hbmwatch", **(headers or {})}
        if bearer_token:
            sent["Authorization"] = f"Bearer {bearer_token}"
        self._client = httpx.Client(headers=sent, timeout=timeout_seconds)

    def send(self, request: bytes) -> Outcome:
        """Post one uncompressed ``WriteRequest`` (``encode``, ``encode_arrays``)."""
        body = compress(request)
        try:
            response = self._client.post(self.url, content=body)
        except httpx.HTTPError as exc:
            return Outcome(0, f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS])
        reason = "" if response.is_success else _reason(response)
        return Outcome(response.status_code, reason)

    def close(self) -> None:
        self._client.close()


def _reason(response: httpx.Response) -> str:
    text = " ".join(response.text.split())[:MAX_REASON_CHARS]
    return f"HTTP {response.status_code}: {text or response.reason_phrase}"
