"""What the store hands back: write outcomes, query answers, compaction reports, its metrics.

Kept apart from the SQL so that callers (the collector's writer, the API) can name these
types without reading how they are produced.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge

from hbmwatch.records import SeriesKey, SeriesPoints
from hbmwatch.validation import HbmwatchError


class SchemaOutdated(HbmwatchError):
    """The database has not been migrated to the schema this code needs."""


@dataclass
class WriteResult:
    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    MAX_ERRORS = 10

    def reject(self, reason: str, message: str) -> None:
        self.rejected[reason] += 1
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append(f"{reason}: {message}")

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


@dataclass(frozen=True)
class QueryResult:
    series: list[SeriesPoints]
    tier: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class LatestValue:
    series: SeriesKey
    timestamp: float
    value: float


@dataclass(frozen=True)
class CompactionReport:
    minutes: int = 0
    samples: int = 0
    chunks: int = 0
    #: chunks that took late samples: minute chunks, or the hour chunks their hours became
    merged: int = 0
    #: series' hours re-packed from minute chunks into hour chunks (``store/hours.py``)
    hours: int = 0


class StoreMetrics:
    """The store's own health, registered on an injected prometheus registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = PromCounter(
            "hbmwatch_store_samples_written", "Samples stored.", registry=registry
        )
        self.duplicates = PromCounter(
            "hbmwatch_store_samples_duplicate",
            "Samples ignored as duplicates.",
            registry=registry,
        )
        self.rejected = PromCounter(
            "hbmwatch_store_samples_rejected",
            "Samples rejected, by reason.",
            ["reason"],
            registry=registry,
        )
        self.series = PromGauge("hbmwatch_store_series", "Series registered.", registry=registry)
        self.compacted = PromCounter(
            "hbmwatch_store_samples_compacted", "Samples moved into chunks.", registry=registry
        )
