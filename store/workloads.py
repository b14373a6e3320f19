"""Which workloads ran on which GPUs between two instants, from ``gpu_workload_info``.

The info series are few (one per pod or job and GPU) and their labels say everything; the
query picks the series of the asked GPUs from the in-memory series registry, then asks
the tiers which of them hold a sample in the window (``series_with_samples``), so it
reads no sample values.  With no attribution stored (the common case) it reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import Engine

from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.records import SeriesKey, Workload
from hbmwatch.store.engine import read_snapshot
from hbmwatch.store.guard import guard
from hbmwatch.store.registry import SeriesRegistry
from hbmwatch.store.tiered import series_with_samples

METRIC = "gpu_workload_info"
#: Where a device is named by these, an info series must agree (empty: any).
PLACE = ("cluster", "host", "gpu", "partition")
_NAME = Matcher("__name__", MatchOp.EQ, METRIC)


def workload_of(key: SeriesKey) -> Workload:
    d = key.label_dict
    return Workload(
        namespace=d.get("namespace", ""), pod=d.get("pod", ""),
        container=d.get("container", ""), job=d.get("job", ""), host=d.get("host", ""),
        gpu=d.get("gpu", ""), partition=d.get("partition", ""), cluster=d.get("cluster", ""),
    )  # fmt: skip


def _wanted(key: SeriesKey, devices: list[Mapping[str, str]] | None) -> bool:
    if devices is None:
        return True
    labels = key.label_dict
    return any(
        all(labels.get(p, "") == d[p] for p in PLACE if d.get(p)) and d.get("host") for d in devices
    )


class WorkloadQueries:
    """The attribution half of ``Store``'s reads (a mixin: ``engine``, ``series_registry``)."""

    engine: Engine
    series_registry: SeriesRegistry
    now_ms: Callable[[], int]

    @guard
    def any_workloads(self) -> bool:
        """Whether any attribution series is stored (one cheap check per alerting cycle)."""
        self.series_registry.refresh()
        return bool(self.series_registry.select_matching([_NAME]))

    @guard
    def workloads(
        self, devices: Iterable[Mapping[str, str]] | None, lo_ms: int, hi_ms: int,
        limit: int = 1000,
    ) -> list[Workload]:  # fmt: skip
        """The workloads on ``devices`` (placement labels: host and gpu, optionally
        partition and cluster; None: every GPU) with a sample in ``[lo_ms, hi_ms]``,
        sorted, at most ``limit``."""
        wanted = None if devices is None else [dict(d) for d in devices]
        if wanted == [] or hi_ms < lo_ms:
            return []
        self.series_registry.refresh()
        found = self.series_registry.select_matching([_NAME])
        found = [(sid, key) for sid, key in found if _wanted(key, wanted)]
        if not found:
            return []
        with read_snapshot(self.engine) as conn:
            live = series_with_samples(conn, [sid for sid, _ in found], lo_ms, hi_ms)
        out = sorted({workload_of(key) for sid, key in found if sid in live})
        return out[:limit]
