"""What ran on an alert's GPU: the ``workloads`` annotation and an incident's union.

The engine does no I/O: it is handed a lookup (``Lookup``, the runner's query over the
stored ``gpu_workload_info``) and asks it only for device findings (an entity with host
and gpu), at most once per finding every ``REFRESH_MS``, so alerting costs nothing more
where nothing is attributed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hbmwatch.records import Finding, Incident, Workload

#: (the finding's device: host, gpu, partition, cluster; lo_ms, hi_ms) -> its workloads
Lookup = Callable[[Mapping[str, str], int, int], tuple[Workload, ...]]
#: A finding's workloads are asked again this often (pods move; the window grows).
REFRESH_MS = 60_000
#: Workloads running a little before the finding started are named too.
LOOKBACK_MS = 60_000
#: The annotation names at most this many, then "+N more".
SHOWN = 5
#: An incident keeps at most this many workloads.
MAX_PER_INCIDENT = 200
PLACE = ("cluster", "host", "gpu", "partition")


def describe(workloads: Iterable[Workload], shown: int = SHOWN) -> str:
    """``ml/llama-7b-5d9f (vllm), job 4242; +3 more``: each workload once, capped.

    >>> describe([Workload(namespace="ml", pod="a", container="vllm"), Workload(job="42")])
    'ml/a (vllm); job 42'
    >>> describe([Workload(job=str(i)) for i in range(7)], shown=2)
    'job 0; job 1; +5 more'
    """
    texts = list(dict.fromkeys(w.describe() for w in workloads))
    more = f"; +{len(texts) - shown} more" if len(texts) > shown else ""
    return "; ".join(texts[:shown]) + more


@dataclass
class Attributor:
    """The engine's memory of what each finding's GPU ran (by finding fingerprint)."""

    lookup: Lookup | None = None
    found: dict[str, tuple[Workload, ...]] = field(default_factory=dict)
    asked_ms: dict[str, int] = field(default_factory=dict)

    def of(self, f: Finding, now_ms: int) -> tuple[Workload, ...]:
        """The workloads on ``f``'s GPU over its window; () for findings not on one GPU."""
        entity = f.entity
        if self.lookup is None or not (entity.get("host") and entity.get("gpu")):
            return ()
        fp = f.fingerprint
        if now_ms - self.asked_ms.get(fp, -REFRESH_MS) < REFRESH_MS:
            return self.found.get(fp, ())
        place = {k: str(entity[k]) for k in PLACE if entity.get(k)}
        hi = f.ended_ms if f.ended_ms is not None else now_ms
        found = self.lookup(place, f.started_ms - LOOKBACK_MS, hi)
        self.asked_ms[fp] = now_ms
        if found or fp in self.found:
            self.found[fp] = tuple(sorted(set(self.found.get(fp, ())) | set(found)))
        return self.found.get(fp, ())

    def forget(self, fingerprint: str) -> None:
        self.found.pop(fingerprint, None)
        self.asked_ms.pop(fingerprint, None)

    def union(self, inc: Incident, sources: Iterable[str]) -> tuple[Workload, ...]:
        """The incident's workloads: those it named before and those of its alerts."""
        merged = set(inc.workloads)
        for fp in sources:
            merged.update(self.found.get(fp, ()))
        return tuple(sorted(merged)[:MAX_PER_INCIDENT])
