"""Plain immutable records that every room passes around.

Nothing here has behaviour beyond construction: collectors produce ``Sample``s, the store
keeps them, detectors read them back.  ``SeriesKey`` caches its hash and its canonical text
because the write path looks up one key per sample, a hundred thousand times a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class SeriesKey:
    """A metric name plus its label set, canonically ordered.

    Equal keys have equal ``text`` (the Prometheus series notation), so ``text`` is the
    series' identity in the store's registry.

    >>> k = SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "0"})
    >>> k.text
    'gpu_power_watts{gpu="0",host="n1"}'
    >>> k == SeriesKey("gpu_power_watts", [("gpu", "0"), ("host", "n1")])
    True
    >>> k.label("host")
    'n1'
    """

    __slots__ = ("_hash", "labels", "metric", "text")

    metric: str
    labels: tuple[tuple[str, str], ...]
    text: str

    def __init__(
        self, metric: str, labels: Mapping[str, str] | Iterable[tuple[str, str]] = ()
    ) -> None:
        items = labels.items() if isinstance(labels, Mapping) else labels
        ordered = tuple(sorted((str(k), str(v)) for k, v in items if v != ""))
        object.__setattr__(self, "metric", metric)
        object.__setattr__(self, "labels", ordered)
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in ordered)
        text = f"{metric}{{{body}}}"
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "_hash", hash(text))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("SeriesKey is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeriesKey) and other.text == self.text

    def __repr__(self) -> str:
        return f"SeriesKey({self.text})"

    def __reduce__(self) -> tuple[type[SeriesKey], tuple[str, tuple[tuple[str, str], ...]]]:
        return SeriesKey, (self.metric, self.labels)

    def label(self, name: str, default: str = "") -> str:
        for key, value in self.labels:
            if key == name:
                return value
        return default

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def with_labels(self, **extra: str) -> SeriesKey:
        merged = dict(self.labels)
        merged.update(extra)
        return SeriesKey(self.metric, merged)


class Sample(NamedTuple):
    """One value of one series at one instant (milliseconds since the Unix epoch)."""

    series: SeriesKey
    timestamp_ms: int
    value: float


@dataclass(frozen=True, slots=True)
class Point:
    """A value at a time in seconds, as queries return them."""

    timestamp: float
    value: float


@dataclass(frozen=True, slots=True)
class SeriesPoints:
    """A query's answer for one series."""

    series: SeriesKey
    points: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class Device:
    """Identity of one physical GPU or one of its logical partitions (the inventory)."""

    host: str
    gpu: str
    cluster: str = ""
    rack: str = ""
    partition: str = ""
    uuid: str = ""
    serial: str = ""
    vendor: str = ""
    sku: str = ""
    compute_partition: str = ""
    memory_partition: str = ""
    driver: str = ""

    @property
    def identity(self) -> tuple[str, str, str, str]:
        return (self.cluster, self.host, self.gpu, self.partition)

    def labels(self) -> dict[str, str]:
        """The device labels a canonical device series carries (empty ones left out)."""
        fields = (
            "cluster",
            "rack",
            "host",
            "gpu",
            "uuid",
            "serial",
            "sku",
            "vendor",
            "partition",
            "compute_partition",
            "memory_partition",
        )
        return {f: getattr(self, f) for f in fields if getattr(self, f)}


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Evidence:
    """One piece of a verdict's reasoning: which series, which statistic, against what.

    ``lag_seconds`` and ``strength`` are set where the evidence is a correlation (a candidate
    cause leading a regression); ``window`` is the span the statistic was computed over.
    """

    series: str
    statistic: str
    value: float
    threshold: float | None = None
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    lag_seconds: float | None = None
    strength: float | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class RankedCause:
    """A candidate root cause with the detector's confidence (0..1) and its evidence.

    ``entity`` names where the cause is (a GPU's, a rack's or a cluster's canonical labels),
    which need not be the finding's own entity: a regression's cause is a GPU or a rack.
    """

    cause: str
    confidence: float
    evidence: tuple[Evidence, ...] = ()
    summary: str = ""
    entity: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: The most confidence a cause that no series supports is shown with.
UNEVIDENCED_MAX = 0.3
NO_EVIDENCE = "no evidence series recorded"


def capped_if_unevidenced(cause: RankedCause) -> RankedCause:
    """A cause no series supports is not shown as confident, and says why; the ranker and
    the incident's merged causes both apply this one rule."""
    if cause.evidence or cause.confidence <= UNEVIDENCED_MAX:
        return cause
    summary = f"{cause.summary}; {NO_EVIDENCE}" if cause.summary else NO_EVIDENCE
    return dataclasses.replace(cause, confidence=UNEVIDENCED_MAX, summary=summary)


@dataclass(frozen=True, slots=True)
class Finding:
    """What a detector concluded about one entity: a state that opens, updates and resolves.

    ``id`` is stable across updates (fingerprint plus start), so the alerting layer sees one
    finding change over time rather than a stream of new ones.  ``entity`` names what the
    finding is about with canonical labels (``host``/``gpu``, ``rack``, ``service``/``phase``,
    ``target``).  ``causes`` is ranked, most likely first.
    """

    id: str
    fingerprint: str
    kind: str
    severity: Severity
    detector: str
    entity: Mapping[str, str]
    summary: str
    started_ms: int
    raised_ms: int
    updated_ms: int
    ended_ms: int | None = None
    evidence: tuple[Evidence, ...] = ()
    causes: tuple[RankedCause, ...] = ()

    @property
    def open(self) -> bool:
        return self.ended_ms is None

    @property
    def top_cause(self) -> str | None:
        return self.causes[0].cause if self.causes else None


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    return dataclasses.asdict(finding) | {"severity": finding.severity.value}


def cause_from_dict(c: Mapping[str, Any]) -> RankedCause:
    evidence = tuple(Evidence(**e) for e in c.get("evidence", ()))
    return RankedCause(
        c["cause"], c["confidence"], evidence, c.get("summary", ""), dict(c.get("entity", {}))
    )


def finding_from_dict(d: dict[str, Any]) -> Finding:
    causes = tuple(cause_from_dict(c) for c in d.get("causes", ()))
    return Finding(
        id=d["id"],
        fingerprint=d["fingerprint"],
        kind=d["kind"],
        severity=Severity(d["severity"]),
        detector=d["detector"],
        entity=dict(d["entity"]),
        summary=d["summary"],
        started_ms=int(d["started_ms"]),
        raised_ms=int(d["raised_ms"]),
        updated_ms=int(d["updated_ms"]),
        ended_ms=None if d.get("ended_ms") is None else int(d["ended_ms"]),
        evidence=tuple(Evidence(**e) for e in d.get("evidence", ())),
        causes=causes,
    )


# -- alerts and incidents -------------------------------------------------------------------


class AlertState(StrEnum):
    PENDING = "pending"  # the finding is open but younger than its kind's hold
    FIRING = "firing"
    RESOLVED = "resolved"


class IncidentState(StrEnum):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Matcher:
    """A label matcher as Alertmanager spells it: ``=``, ``!=``, ``=~`` or ``!~``."""

    name: str
    value: str
    op: str = "="


@dataclass(frozen=True, slots=True)
class Silence:
    """Alerts whose labels match every matcher are not delivered from start to end."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_ms: int
    ends_ms: int
    created_by: str
    comment: str
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class Alert:
    """One alerting condition, from one finding fingerprint; a state, not an event.

    ``fingerprint`` is a hash of the labels it was raised with (``labels`` less the
    ``incident`` label it gains when it joins one), so stable across restarts; ``id`` adds
    the start, so an alert that resolves and comes back later is a new alert with the same
    fingerprint.  ``silenced_by`` (silence ids) and ``inhibited_by`` (alert fingerprints)
    say why it is not delivered.
    """

    id: str
    fingerprint: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    state: AlertState
    severity: Severity
    finding_id: str
    started_ms: int
    updated_ms: int
    firing_ms: int | None = None
    resolved_ms: int | None = None
    incident_id: str | None = None
    silenced_by: tuple[str, ...] = ()
    inhibited_by: tuple[str, ...] = ()
    flaps: int = 0  # times its finding ended and came back while the alert kept firing
    source: str = ""  # the finding fingerprint it follows
    ending_ms: int | None = None  # the finding ended: resolves after the keep-firing hold

    @property
    def muted(self) -> bool:
        return bool(self.silenced_by or self.inhibited_by)


@dataclass(frozen=True, slots=True, order=True)
class Workload:
    """What ran on a GPU (or partition): a pod, a container of it, or a Slurm job.

    Read from ``gpu_workload_info`` (collector/attribution.py); an incident names the
    workloads on its GPUs, so ``?pod=`` finds the pages that hit a team's pod.
    """

    namespace: str = ""
    pod: str = ""
    container: str = ""
    job: str = ""
    host: str = ""
    gpu: str = ""
    partition: str = ""
    cluster: str = ""

    def describe(self) -> str:
        """One workload in words: ``ml/llama-7b-5d9f (vllm)``, ``job 4242``, or both.

        >>> Workload(namespace="ml", pod="llama-7b", container="vllm").describe()
        'ml/llama-7b (vllm)'
        >>> Workload(job="4242").describe()
        'job 4242'
        """
        pod = "/".join(p for p in (self.namespace, self.pod) if p)
        if pod and self.container:
            pod += f" ({self.container})"
        job = f"job {self.job}" if self.job else ""
        return ", ".join(p for p in (pod, job) if p)


def workload_from_dict(d: Mapping[str, Any]) -> Workload:
    names = {f.name for f in dataclasses.fields(Workload)}
    return Workload(**{k: str(v) for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class IncidentEvent:
    """One line of an incident's timeline."""

    at_ms: int
    kind: str  # opened | alert_added | alert_resolved | severity | acknowledged | resolved
    text: str
    alert: str | None = None  # an alert fingerprint
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class Incident:
    """Alerts grouped by place (rack, else host, else service) and time: one page."""

    id: str
    title: str
    scope: Mapping[str, str]
    state: IncidentState
    severity: Severity
    opened_ms: int
    updated_ms: int
    resolved_ms: int | None = None
    acknowledged_by: str | None = None
    acknowledged_ms: int | None = None
    alerts: tuple[str, ...] = ()  # alert ids, in the order they joined
    causes: tuple[RankedCause, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    timeline: tuple[IncidentEvent, ...] = ()
    #: What ran on the incident's GPUs over its alerts' windows (sorted; capped).
    workloads: tuple[Workload, ...] = ()

    @property
    def open(self) -> bool:
        return self.state is not IncidentState.RESOLVED


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where one alert stands with one receiver: what it last accepted, and what is owed."""

    receiver: str
    alert_id: str
    sent_state: str = ""  # "" (never), "firing" or "resolved": what the receiver last took
    sent_ms: int | None = None
    attempts: int = 0  # failed attempts since the last success
    next_attempt_ms: int = 0
    last_error: str = ""
