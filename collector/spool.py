"""A bounded on-disk queue of sample batches for when the store cannot take them.

Batches are appended as numbered files (fsynced), replayed oldest first once the store
answers again, and deleted only after the store acknowledged them, so nothing is lost across
an outage or a collector restart.  Past ``max_bytes`` the oldest batches are dropped, and
counted, rather than filling the disk.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from hbmwatch import log
from hbmwatch.collector.exposition import MalformedLine, parse_series
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.guard import StoreUnavailable

logger = log.get("hbmwatch.collector")


def encode_batch(samples: list[Sample]) -> bytes:
    keys: dict[str, int] = {}
    rows = []
    for s in samples:
        index = keys.setdefault(s.series.text, len(keys))
        rows.append((index, s.timestamp_ms, s.value))
    return gzip.compress(json.dumps({"keys": list(keys), "rows": rows}).encode(), 1)


class CorruptBatch(ValueError):
    """A spool file this code did not write, or a damaged one."""


@functools.lru_cache(maxsize=262_144)
def _series_key(text: str) -> SeriesKey:
    """The same series come back batch after batch: parse each text once (replaying a
    spool after an outage was bound by this parse, slower than the scrapes it caught up)."""
    ref = parse_series(text)
    return SeriesKey(ref.name, ref.labels)


def decode_batch(blob: bytes) -> list[Sample]:
    try:
        data = json.loads(gzip.decompress(blob))
        keys = [_series_key(text) for text in data["keys"]]
        return [Sample(keys[i], int(ts), float(v)) for i, ts, v in data["rows"]]
    except (
        OSError,
        EOFError,
        zlib.error,
        ValueError,
        KeyError,
        TypeError,
        IndexError,
        MalformedLine,
    ) as exc:
        raise CorruptBatch(f"not a spool batch: {type(exc).__name__}: {exc}") from None


class Spool:
    def __init__(
        self, directory: Path, max_bytes: int, registry: CollectorRegistry | None = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        registry = registry or CollectorRegistry()
        self._bytes_gauge = Gauge(
            "hbmwatch_spool_bytes", "Bytes waiting in the spool.", registry=registry
        )
        self._batches_gauge = Gauge(
            "hbmwatch_spool_batches", "Batches waiting in the spool.", registry=registry
        )
        self.dropped = Counter(
            "hbmwatch_spool_dropped_samples",
            "Samples dropped because the spool was full.",
            registry=registry,
        )
        self.spooled = Counter(
            "hbmwatch_spool_spooled_samples", "Samples written to the spool.", registry=registry
        )
        self.replayed = Counter(
            "hbmwatch_spool_replayed_samples",
            "Samples replayed from the spool into the store.",
            registry=registry,
        )
        files = self._files()
        self._next = int(files[-1].stem) + 1 if files else 0
        # The loop thread spools when the writer thread is stuck; both share the numbering.
        self._lock = threading.RLock()
        self._refresh()

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("*.batch"), key=lambda p: int(p.stem))

    def _refresh(self) -> None:
        files = self._files()
        self._bytes_gauge.set(sum(p.stat().st_size for p in files))
        self._batches_gauge.set(len(files))

    @property
    def size_bytes(self) -> int:
        return int(self._bytes_gauge._value.get())

    def pending(self) -> int:
        return len(self._files())

    def reserve(self) -> int:
        """The next batch number: a batch spooled later under it still replays in its place."""
        with self._lock:
            self._next += 1
            return self._next - 1

    def append(self, samples: list[Sample], seq: int | None = None) -> None:
        """Write ``samples`` as batch ``seq`` (default: the next number), fsynced."""
        if not samples:
            return
        blob = encode_batch(samples)
        with self._lock:
            number = self.reserve() if seq is None else seq
            path = self.directory / f"{number:012d}.batch"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self.spooled.inc(len(samples))
            self._enforce_bound()
            self._refresh()

    def _enforce_bound(self) -> None:
        files = self._files()
        total = sum(p.stat().st_size for p in files)
        while total > self.max_bytes and len(files) > 1:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            try:
                lost = len(decode_batch(oldest.read_bytes()))
            except (OSError, CorruptBatch):
                lost = 0
            oldest.unlink()
            self.dropped.inc(lost)

    def replay(self, write: Callable[[list[Sample]], object], before: int | None = None) -> int:
        """Write spooled batches oldest first (only those numbered below ``before``); stop at
        the first the store cannot take (StoreUnavailable), leaving that one and the rest for
        next time; one that fails otherwise is set aside (``.failed``) so it blocks nothing.
        Returns samples replayed.  The store is written without the lock held, so the loop
        thread can spool meanwhile."""
        replayed = 0
        for path in self._files():
            if before is not None and int(path.stem) >= before:
                break
            try:
                samples = decode_batch(path.read_bytes())
            except FileNotFoundError:
                continue  # dropped by the size bound meanwhile (and counted there)
            except (OSError, CorruptBatch) as exc:
                logger.error("unreadable spool batch set aside", path=str(path), error=str(exc))
                with self._lock, contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".corrupt"))  # kept for a person to look at
                continue
            try:
                write(samples)
            except StoreUnavailable:
                raise
            except Exception as exc:  # not an outage: this batch alone fails, set it aside
                logger.error("spool batch the store refuses set aside", path=str(path),
                             error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                with self._lock, contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".failed"))  # kept for a person to look at
                continue
            with self._lock:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self._refresh()
            replayed += len(samples)
            self.replayed.inc(len(samples))
        return replayed
