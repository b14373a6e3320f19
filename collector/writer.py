"""Writes collected samples to the store in batches; spools them while the store is down."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from collector.spool import Spool
from hbmwatch import log
from hbmwatch.records import Sample
from store.store import StoreUnavailable, WriteResult

logger = log.get("hbmwatch.collector")


@dataclass
class Flushed:
    samples: int = 0
    accepted: int = 0
    rejected: int = 0
    spooled: int = 0
    replayed: int = 0


class SpoolingWriter:
    """Order is kept: while anything waits in the spool, new batches queue behind it."""

    def __init__(
        self, write: Callable[[list[Sample]], WriteResult], spool: Spool, retry_seconds: float = 2.0
    ) -> None:
        self._write = write
        self.spool = spool
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._last_attempt = 0.0
        self.last_result: WriteResult | None = None

    def write(self, samples: list[Sample]) -> Flushed:
        with self._lock:
            done = Flushed(samples=len(samples))
            if self.spool.pending():
                if time.monotonic() - self._last_attempt < self.retry_seconds:
                    self.spool.append(samples)
                    done.spooled = len(samples)
                    return done
                self._last_attempt = time.monotonic()
                try:
                    done.replayed = self.spool.replay(self._write)
                    logger.info("store is back; spool replayed", samples=done.replayed)
                except StoreUnavailable:
                    self.spool.append(samples)
                    done.spooled = len(samples)
                    return done
            try:
                result = self._write(samples)
            except StoreUnavailable as exc:
                if not self.spool.pending():
                    logger.warning("store unavailable; spooling", error=str(exc))
                self._last_attempt = time.monotonic()
                self.spool.append(samples)
                done.spooled = len(samples)
                return done
            self.last_result = result
            done.accepted, done.rejected = result.accepted, result.rejected_total
            return done
