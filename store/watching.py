"""The detectors' feed: the newest samples of the watched metrics, from memory or from SQL.

The write path appends what it stored to ``RecentSamples`` while something is watched;
``read_new`` serves a detector's cursor from there, and falls back to the database after a
start or when the cursor has fallen out of memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from hbmwatch.records import SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store.feed import RecentSamples, SampleBlock
from hbmwatch.store.guard import guarded
from hbmwatch.store.registry import SeriesRegistry


@guarded
class Watching:
    """The detectors' feed of ``Store``, a mixin over the attributes ``Store.__init__`` sets.

    Relies on: ``settings``, ``series_registry``, ``feed``, ``now_ms``, the watch itself
    (``_watched_metrics``, ``_wants``; the write path reads the former) and the queries'
    ``_raw_samples`` for the fallback to SQL.
    """

    settings: StoreSettings
    series_registry: SeriesRegistry
    feed: RecentSamples | None  # None: a RemoteStore
    now_ms: Callable[[], int]
    _watched_metrics: frozenset[str]
    _wants: Callable[[SeriesKey], bool] | None
    _watched_cache: tuple[int, object, list[int]] | None
    _raw_samples: Callable[
        [list[int], int, int], tuple[dict[int, tuple[np.ndarray, np.ndarray]], bool]
    ]

    def watch(
        self, metric_names: Iterable[str], wants: Callable[[SeriesKey], bool] | None = None
    ) -> None:
        """Keep the newest samples of these metrics (the series ``wants``) for ``read_new``."""
        self._watched_metrics = frozenset(metric_names)
        self._wants = wants
        self._watched_cache = None
        if self.feed is not None:  # a RemoteStore keeps none: its readers read the engine
            self.feed.reset_watch()

    def _is_watched(self, series_id: int) -> bool:
        key = self.series_registry.keys.get(series_id)
        return (
            key is not None
            and key.metric in self._watched_metrics
            and (self._wants is None or self._wants(key))
        )

    def read_new(self, cursor: int | None, since_ms: int) -> tuple[int, SampleBlock]:
        """Watched samples stored after ``cursor``; from SQL (since ``since_ms``) if it is gone.

        The first call after a start passes ``cursor=None`` and gets the span back from the
        database; later calls are served from memory.  A sample may come back twice around
        that switch; readers drop what is not newer than what they have.
        """
        if cursor is not None:
            block = self.feed.read(cursor)
            if block is not None:
                return self.feed.next_seq, block
        next_cursor = self.feed.next_seq
        self.series_registry.refresh()
        ids = self._watched_ids()
        hi = self.now_ms() + int(self.settings.max_future_skew_seconds * 1000) + 1
        samples, _ = self._raw_samples(ids, since_ms, hi) if ids else ({}, False)
        parts = [
            SampleBlock(np.full(len(t), sid, dtype=np.int64), t, v)
            for sid, (t, v) in samples.items()
        ]
        block = SampleBlock.concat(parts)
        order = np.argsort(block.timestamps_ms, kind="stable")
        return next_cursor, SampleBlock(
            block.series_ids[order], block.timestamps_ms[order], block.values[order]
        )

    def _watched_ids(self) -> list[int]:
        """The watched series ids, kept between calls while no series is added: a reader of
        a store others write calls ``read_new`` every cycle."""
        keys = self.series_registry.keys
        cached = getattr(self, "_watched_cache", None)
        if cached is None or cached[0] != len(keys) or cached[1] is not self._wants:
            ids = [sid for sid in keys if self._is_watched(sid)]
            cached = (len(keys), self._wants, ids)
            self._watched_cache = cached
        return cached[2]

    def key_of(self, series_id: int) -> SeriesKey | None:
        key = self.series_registry.keys.get(series_id)
        if key is None:
            self.series_registry.refresh()
            key = self.series_registry.keys.get(series_id)
        return key
