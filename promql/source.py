"""Where the engine reads samples: the store, behind a protocol the tests can also fill.

The engine asks for the raw samples of the series some matchers select in a closed range of
milliseconds, and gets them in the order Prometheus' storage returns series (by label set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hbmwatch.matchers import Matcher
from hbmwatch.promql.values import NAME, RawSeries, rows_sorted
from hbmwatch.records import SeriesKey
from hbmwatch.store.store import Store
from hbmwatch.store.tiered import TierSamples

_PERIOD = {"1m": "minute", "1h": "hour"}


class SampleSource(Protocol):
    def select(self, matchers: Sequence[Matcher], lo: int, hi: int) -> list[RawSeries]:
        """Samples in ``[lo, hi]`` ms of every series the matchers select, by label set."""
        ...

    @property
    def warnings(self) -> list[str]:
        """What the answer should say about itself (raw samples past retention, ...)."""
        ...


def labels_of_key(key: SeriesKey) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(((NAME, key.metric), *key.labels)))


class StoreSource:
    """The store's raw tier as a ``SampleSource``."""

    def __init__(self, store: Store, tier: str = "raw") -> None:
        self.store = store
        self.tier = tier
        self.warnings: list[str] = []
        if tier != "raw":
            self.warnings.append(
                f"answered from the {tier} tier: one sample per {_PERIOD[tier]} (its last "
                "value; *_over_time use its count, min, max and sum), see docs/promql.md"
            )

    def select(self, matchers: Sequence[Matcher], lo: int, hi: int) -> list[RawSeries]:
        found, expired = self.store.select_samples(matchers, lo, hi, self.tier)
        if expired and not any("retention" in w for w in self.warnings):
            self.warnings.append(
                "raw samples of part of the range are past raw retention "
                f"({self.store.settings.raw_retention_days} days) and are left out"
            )
        return rows_sorted(
            [RawSeries(labels_of_key(k), t, v, _stats(tier)) for k, t, v, tier in found]
        )


def _stats(tier: TierSamples | None):
    return None if tier is None else (tier.count, tier.min, tier.max, tier.sum)
