"""Inventory: the GPUs and partitions hbmwatch has seen, and how they sit in the fleet."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated

from fastapi import APIRouter, Query

from hbmwatch.api.deps import ScopeRead, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES
from hbmwatch.api.params import Cursor, Limit, page
from hbmwatch.api.schemas import (
    DeviceOut,
    Page,
    Topology,
    TopologyCluster,
    TopologyHost,
    TopologyRack,
    WorkloadOut,
)
from hbmwatch.store.store import Store

router = APIRouter(prefix="/api/v1", tags=["devices"], responses=ERROR_RESPONSES)

Filter = Annotated[str | None, Query(max_length=200)]
#: "Runs now": a workload with a sample this recent.
NOW_WINDOW_MS = 5 * 60_000
MAX_WORKLOADS = 5_000


@router.get("/devices", response_model=Page[DeviceOut])
def list_devices(
    store: StoreDep,
    _: ScopeRead,
    cluster: Filter = None,
    rack: Filter = None,
    host: Filter = None,
    sku: Filter = None,
    partition: Filter = None,
    vendor: Filter = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[DeviceOut]:
    """GPUs and partitions, ordered by cluster, rack, host, GPU; filters match exactly."""
    filters = {
        "cluster": cluster,
        "rack": rack,
        "host": host,
        "sku": sku,
        "partition": partition,
        "vendor": vendor,
    }
    devices = store.devices(**{k: v for k, v in filters.items() if v is not None})
    found = page([DeviceOut.of(d) for d in devices], limit, cursor)
    _attach_workloads(store, found.items)
    return found


def _attach_workloads(store: Store, items: list[DeviceOut]) -> None:
    """What runs on each GPU of the page now: one query for the page's devices."""
    now = store.now_ms()
    places = [{"cluster": d.cluster, "host": d.host, "gpu": d.gpu, "partition": d.partition}
              for d in items]  # fmt: skip
    by_place = defaultdict(list)
    for w in store.workloads(places, now - NOW_WINDOW_MS, now, limit=MAX_WORKLOADS):
        by_place[(w.cluster, w.host, w.gpu, w.partition)].append(WorkloadOut.of(w))
    for d in items:
        d.workloads = by_place.get((d.cluster, d.host, d.gpu, d.partition), [])


@router.get("/topology", response_model=Topology)
def topology(store: StoreDep, _: ScopeRead, cluster: Filter = None) -> Topology:
    """Clusters > racks > hosts > GPUs, for pickers and for knowing what shares a rack."""
    devices = store.devices(**({"cluster": cluster} if cluster is not None else {}))
    tree: dict[str, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(dict))
    for d in devices:
        gpus, skus = tree[d.cluster][d.rack].setdefault(d.host, [[], set()])
        gpus.append(d.gpu if not d.partition else f"{d.gpu}/{d.partition}")
        if d.sku:
            skus.add(d.sku)
    clusters = [
        TopologyCluster(
            cluster=c,
            racks=[
                TopologyRack(
                    rack=r,
                    hosts=[
                        TopologyHost(host=h, gpus=gpus, skus=sorted(skus))
                        for h, (gpus, skus) in sorted(hosts.items())
                    ],
                )
                for r, hosts in sorted(racks.items())
            ],
        )
        for c, racks in sorted(tree.items())
    ]
    return Topology(clusters=clusters, gpus=len(devices))
