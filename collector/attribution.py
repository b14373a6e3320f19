"""What runs on each GPU: ``gpu_workload_info`` from the exporters' pod and job labels.

dcgm-exporter (Kubernetes pod-resources, ``--hpc-job-mapping-dir``) and AMD's Device
Metrics Exporter put the workload using a GPU on every device line.  Device series keep
their identity labels only, so those labels would explode their cardinality; instead each
distinct (device, workload) on a page becomes one info series
``gpu_workload_info{cluster,rack,host,gpu,partition,namespace,pod,container,job} 1``.

The work is done once per line, when a translator first maps it (``Attribution.key_for``,
from ``LineTranslator._miss``); a page then only emits the cached keys of its lines.  Each
workload label has a cap of distinct values per target: past it the workload is not
written and is counted as dropped (``label_cap``), with one warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import repeat

from hbmwatch import log
from hbmwatch.metrics import ATTRIBUTION_LABELS, WORKLOAD_PLACEMENT_LABELS
from hbmwatch.records import Device, Sample, SeriesKey

logger = log.get("hbmwatch.collector.attribution")

METRIC = "gpu_workload_info"
#: The page's spelling -> the canonical label: dcgm-exporter (``pod``, ``namespace``,
#: ``container``; ``hpc_job`` from its job-mapping directory), DME (the same, ``job_id``;
#: upper-case on old builds).  ``pod_uid``, ``job_user`` and ``job_partition`` are dropped.
SPELLINGS: dict[str, str] = {
    "namespace": "namespace",
    "NAMESPACE": "namespace",
    "pod": "pod",
    "POD": "pod",
    "container": "container",
    "CONTAINER": "container",
    "job_id": "job",
    "JOB_ID": "job",
    "hpc_job": "job",
}
DEFAULT_CAP = 10_000
#: Read back from a Prometheus (``kind = "prometheus"``), a series' plain ``namespace``,
#: ``pod`` and ``container`` are the *target's* (Kubernetes service discovery: the
#: exporter's own pod, on every line, GPU busy or not); the exporter's labels of the same
#: names come renamed ``exported_*`` (``honor_labels: false``, the default).
EXPORTED = {
    "exported_namespace": "namespace",
    "exported_pod": "pod",
    "exported_container": "container",
}
TARGET_LABELS = frozenset(EXPORTED.values())


class Attribution:
    """One target's workload keys, and its cap of distinct values per workload label."""

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self._values: dict[str, set[str]] = {name: set() for name in ATTRIBUTION_LABELS}
        self._keys: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], SeriesKey] = {}
        self._warned = False

    def clear(self) -> None:
        """Forget the values seen (the translator's memo was cleared: pods churned away)."""
        for seen in self._values.values():
            seen.clear()
        self._keys.clear()

    def key_for(self, device: Device, labels: Iterable[tuple[str, str]]) -> SeriesKey | None:
        """The info series of the workload a line names on its device; None where it names
        none; a key with no metric name where a label is past its cap (counted, not kept).

        >>> a = Attribution(cap=1)
        >>> d = Device(host="n1", gpu="0")
        >>> a.key_for(d, [("pod", "p1"), ("namespace", "ml"), ("pod_uid", "")]).text
        'gpu_workload_info{gpu="0",host="n1",namespace="ml",pod="p1"}'
        >>> a.key_for(d, [("modelName", "H100")]) is None
        True
        """
        workload = tuple(sorted((SPELLINGS[k], v) for k, v in labels if v and k in SPELLINGS))
        if not workload:
            return None
        placement = tuple(getattr(device, name) for name in WORKLOAD_PLACEMENT_LABELS)
        cached = self._keys.get((placement, workload))
        if cached is not None:
            return cached
        over = [
            (name, value)
            for name, value in workload
            if value not in self._values[name] and len(self._values[name]) >= self.cap
        ]
        if over:
            self._warn(over[0][0])
            return SeriesKey("", workload)
        for name, value in workload:
            self._values[name].add(value)
        place = zip(WORKLOAD_PLACEMENT_LABELS, placement, strict=True)
        key = SeriesKey(METRIC, [*place, *workload])
        self._keys[(placement, workload)] = key
        return key

    def _warn(self, label: str) -> None:
        if not self._warned:
            logger.warning(
                "workload label cap reached; further workloads are counted, not kept",
                label=label,
                cap=self.cap,
            )
        self._warned = True


def federated_labels(labels: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A federated series' labels as its exporter's page showed them: the target's pod
    labels left out, the exporter's (``exported_*``) under their own names.

    >>> federated_labels([("gpu", "0"), ("pod", "dcgm-exporter-x"), ("exported_pod", "p1")])
    [('gpu', '0'), ('pod', 'p1')]
    """
    return [(EXPORTED.get(k, k), v) for k, v in labels if k not in TARGET_LABELS]


def distinct(keys: Iterable[SeriesKey | None]) -> list[SeriesKey]:
    """The workload keys of a page's lines, each once, in first-seen order."""
    return [k for k in dict.fromkeys(keys) if k is not None]


def emit(
    samples: list[Sample], dropped: Mapping[str, int], keys: list[SeriesKey], ts_ms: int
) -> None:
    """Append one sample (value 1) per workload key; count the capped ones."""
    kept = [k for k in keys if k.metric]
    samples.extend(map(Sample, kept, repeat(ts_ms), repeat(1.0)))
    if len(kept) < len(keys):
        dropped["label_cap"] += len(keys) - len(kept)  # type: ignore[index]
