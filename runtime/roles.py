"""Which detectors a detection process runs, over which series: its racks and the fleet's.

Detector shards split the fleet by the hash of each series' ``cluster/rack``
(``hbmwatch.sharding``).  The per-rack detectors (link errors, data quality) judge each GPU
or target on its own series, so a shard over its racks says what one process over the
fleet says.  The fleet-wide ones need every rack at once: thermal names a heat rise
``cooling`` or ``ambient`` by how many racks of the cluster rise with it, outliers compare
a GPU with every peer of its SKU, latency finds a workload's peers on other racks, root
cause ranks a regression against the thermal findings and GPU context of the whole fleet,
and throttling pages at once when a regression latency found is open on its GPU.  They run
in one runner over every series (``fleet_wide``: beside shard 0's racks by default), so N
shards give the single process' answer (docs/scale-detection.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.signals import WATCHED_METRICS
from hbmwatch.records import SeriesKey
from hbmwatch.runtime.detection import WHOLE, DetectionRunner
from hbmwatch.settings import DetectionSettings
from hbmwatch.sharding import Shard
from hbmwatch.store.store import Store

#: The detectors that read more than one rack (by ``Detector.name``).
FLEET_WIDE: frozenset[str] = frozenset({"thermal", "throttle", "latency", "outliers", "rootcause"})
FLEET_SUFFIX = "@fleet"


@dataclass(frozen=True)
class Plan:
    """What one process runs: its shard's racks (None: no racks), the fleet-wide part."""

    racks: Shard | None
    fleet_wide: bool

    @property
    def single(self) -> bool:
        """One runner over everything, as ``hbmwatch up`` has always run (state unsuffixed)."""
        return self.fleet_wide and self.racks is not None and self.racks.whole


def plan(settings: DetectionSettings) -> Plan:
    """The plan the settings ask for (``detection.shard``, ``detection.fleet_wide``)."""
    shard = Shard.parse(settings.shard)
    mode = settings.fleet_wide
    if mode == "only":
        return Plan(None, True)
    fleet = mode == "also" or (mode == "auto" and shard.index == 0)
    return Plan(shard, fleet)


def runners(
    store: Store, settings: DetectionSettings, *, shared: bool = False
) -> list[DetectionRunner]:
    """This process' runners, started, with the store watching what all of them read.

    ``shared``: the samples are written by other processes (always so for a shard).
    """
    p = plan(settings)
    options = dict(
        step_seconds=settings.step_seconds,
        settle_seconds=settings.settle_seconds,
        backfill_seconds=settings.backfill_seconds,
    )
    detectors = default_detectors(settings)
    out: list[DetectionRunner] = []
    if p.single:
        out.append(DetectionRunner(store, detectors, context=Context(), shared=shared, **options))
    else:
        if p.racks is not None:
            per_rack = [d for d in detectors if d.name not in FLEET_WIDE]
            out.append(DetectionRunner(store, per_rack, shard=p.racks, shared=True,
                                       state_suffix=f"@{p.racks}", **options))  # fmt: skip
        if p.fleet_wide:
            fleet = [d for d in detectors if d.name in FLEET_WIDE]
            out.append(DetectionRunner(store, fleet, context=Context(), shared=True,
                                       state_suffix=FLEET_SUFFIX, **options))  # fmt: skip
    store.watch(WATCHED_METRICS, wants=lambda key: any(r.routed(key) for r in out))
    for r in out:
        r.start(watch=False)
    return out


def owns(p: Plan, key: SeriesKey) -> bool:
    """Whether a process with this plan reads the series (for tests and docs)."""
    return p.fleet_wide or (p.racks or WHOLE).owns(f"{key.label('cluster')}/{key.label('rack')}")
