"""The store: the only code that speaks SQL.  Write batches, query ranges, keep tiers.

``Store`` is one object over one engine, put together from a mixin per concern, all over
the attributes its constructor sets:

* ``store/writing.py``: the write path and the bad input policy (what is rejected, why);
* ``store/compaction.py``: closed minutes into chunks and rollups, and retention;
* ``store/hours.py``: closed hours of minute chunks re-packed into hour chunks;
* ``store/chunks.py``: chunks read from both tables, the packed minute statistics;
* ``store/watching.py``: the detectors' feed (``watch``, ``read_new``);
* ``store/queries.py``: series, range and counter queries, latest values;
* ``store/results.py``: what they return, and the store's own metrics;
* ``store/tiers.py``: the layout at rest they share (widths, watermark, id batches).

This module keeps the constructor, the lifecycle, the device inventory and the state rows,
and re-exports the names callers import from here.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select, text
from sqlalchemy.dialects import postgresql, sqlite

from hbmwatch.records import Device, SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store.alerts import AlertBook
from hbmwatch.store.backend import Backend, backend_for
from hbmwatch.store.compaction import Compaction
from hbmwatch.store.engine import create_store_engine as create_store_engine  # re-exported
from hbmwatch.store.feed import RecentSamples
from hbmwatch.store.findings import FindingLog
from hbmwatch.store.guard import StoreUnavailable as StoreUnavailable  # re-exported for callers
from hbmwatch.store.guard import guard, guarded
from hbmwatch.store.head import NewestWritten
from hbmwatch.store.models import Device as DeviceRow
from hbmwatch.store.models import StoreState
from hbmwatch.store.queries import MAX_POINTS_PER_SERIES as MAX_POINTS_PER_SERIES
from hbmwatch.store.queries import Queries
from hbmwatch.store.registry import Caps, SeriesRegistry
from hbmwatch.store.results import CompactionReport as CompactionReport
from hbmwatch.store.results import LatestValue as LatestValue
from hbmwatch.store.results import QueryResult as QueryResult
from hbmwatch.store.results import SchemaOutdated, StoreMetrics
from hbmwatch.store.results import WriteResult as WriteResult
from hbmwatch.store.tiers import HOUR_MS as HOUR_MS
from hbmwatch.store.tiers import MINUTE_MS as MINUTE_MS
from hbmwatch.store.tiers import write_state
from hbmwatch.store.watching import Watching
from hbmwatch.store.workloads import WorkloadQueries
from hbmwatch.store.writing import Writing
from hbmwatch.validation import InvalidQuery


@guarded
class Store(Writing, Compaction, Watching, Queries, WorkloadQueries):
    """Samples, series, rollups and inventory behind one object (see module doc).

    Every public method raises ``StoreUnavailable`` when the database cannot answer."""

    #: Minute and hour tiers that long-range reads may use (``RemoteStore`` has none).
    has_tiers = True

    def __init__(
        self,
        engine: Engine,
        settings: StoreSettings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self._clock = clock
        self.backend: Backend = backend_for(engine.dialect.name)
        self.series_registry = SeriesRegistry(
            engine,
            Caps(
                settings.max_series_total,
                settings.max_series_per_metric,
                settings.max_values_per_workload_label,
            ),
            self.now_ms,
        )
        self.metrics = StoreMetrics(registry or CollectorRegistry())
        self._write_lock = threading.Lock()
        self._partition_days: set[int] = set()
        self._watermark = 0
        self._watermark_read_at = -math.inf
        self._watched_metrics: frozenset[str] = frozenset()
        self._newest_written = NewestWritten()
        self._known_mask = (0, np.zeros(0, dtype=bool))
        self._wants: Callable[[SeriesKey], bool] | None = None
        self.feed = RecentSamples(settings.recent_samples, self._is_watched)
        self.findings = FindingLog(engine)
        self.alerts = AlertBook(engine, self.get_state, self.put_state)

    # -- lifecycle ---------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        """Raise if the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # -- inventory and state -----------------------------------------------------------------
    def upsert_devices(self, devices: Iterable[Device]) -> int:
        """Record devices as seen now; identity is (cluster, host, gpu, partition)."""
        now = self.now_ms()
        rows = [
            {
                **{f: getattr(d, f) for f in Device.__slots__},
                "first_seen_ms": now,
                "last_seen_ms": now,
            }
            for d in {d.identity: d for d in devices}.values()
        ]
        if not rows:
            return 0
        insert = (sqlite.insert if self.backend.name == "sqlite" else postgresql.insert)(DeviceRow)
        updated = {c: getattr(insert.excluded, c) for c in rows[0] if c != "first_seen_ms"}
        stmt = insert.on_conflict_do_update(
            index_elements=["cluster", "host", "gpu", "partition"], set_=updated
        )
        with self.engine.begin() as conn:
            conn.execute(stmt, rows)
        return len(rows)

    def devices(self, **filters: str) -> list[Device]:
        """Devices, optionally filtered by identity fields (cluster, rack, host, sku...)."""
        table = DeviceRow.__table__
        stmt = select(*(table.c[f] for f in Device.__slots__)).order_by(
            table.c.cluster, table.c.rack, table.c.host, table.c.gpu, table.c.partition
        )
        for name, value in filters.items():
            if name not in Device.__slots__:
                raise InvalidQuery(f"devices cannot be filtered by {name!r}", field=name)
            stmt = stmt.where(table.c[name] == value)
        with self.engine.connect() as conn:
            return [Device(**row._mapping) for row in conn.execute(stmt)]

    def get_state(self, name: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(StoreState.value).where(StoreState.name == name)).scalar()

    def put_state(self, name: str, value: Any) -> None:
        with self.engine.begin() as conn:
            write_state(conn, name, value)


@guard
def open_store(
    settings: StoreSettings,
    *,
    clock: Callable[[], float] = time.time,
    registry: CollectorRegistry | None = None,
) -> Store:
    """Connect to the configured database (already migrated) and load the series registry;
    with ``store.remote`` set, a ``RemoteStore`` whose samples live on that engine."""
    from hbmwatch.store.migrate import current_revision, head_revision

    engine = create_store_engine(
        settings.url,
        synchronous=settings.sqlite_synchronous,
        busy_timeout_seconds=settings.sqlite_busy_timeout_seconds,
    )
    revision, head = current_revision(engine), head_revision()
    if revision != head:
        engine.dispose()
        raise SchemaOutdated(
            f"the database schema is at {revision or 'nothing'}, not {head}: run hbmwatch migrate",
            revision=revision,
        )
    if settings.remote.enabled:
        from hbmwatch.store.remote import RemoteStore

        store: Store = RemoteStore(engine, settings, clock=clock, registry=registry)
    else:
        store = Store(engine, settings, clock=clock, registry=registry)
    store.series_registry.refresh()
    if store.backend.name == "postgresql" and store.has_tiers:  # a RemoteStore has no samples
        store.prepare_partitions()
    return store
