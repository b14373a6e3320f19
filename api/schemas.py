"""The API's public shapes, kept apart from the records and the SQL rows they come from.

Times in responses are RFC 3339 (UTC) except query points, which are ``[unix seconds,
value]`` pairs as Prometheus gives them.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hbmwatch.records import (
    Alert,
    Device,
    Evidence,
    Incident,
    RankedCause,
    SeriesKey,
    SeriesPoints,
    Silence,
    Workload,
)

T = TypeVar("T")


def rfc3339(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def finite(value: float | None) -> float | None:
    """JSON has no NaN or Inf: they come back as null."""
    return value if value is not None and math.isfinite(value) else None


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` for the next page; null on the last page."
    )


class WorkloadOut(BaseModel):
    """What ran on a GPU: a pod (namespace, pod, container) and/or a Slurm job."""

    model_config = ConfigDict(from_attributes=True)
    namespace: str
    pod: str
    container: str
    job: str
    cluster: str
    host: str
    gpu: str
    partition: str

    @classmethod
    def of(cls, w: Workload) -> WorkloadOut:
        return cls.model_validate(w)


class DeviceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    cluster: str
    rack: str
    host: str
    gpu: str
    partition: str
    uuid: str
    serial: str
    vendor: str
    sku: str
    compute_partition: str
    memory_partition: str
    driver: str
    workloads: list[WorkloadOut] = Field(
        default=[], description="What runs on it now (gpu_workload_info, last 5 minutes)."
    )

    @classmethod
    def of(cls, d: Device) -> DeviceOut:
        return cls.model_validate(d)


class TopologyHost(BaseModel):
    host: str
    gpus: list[str]
    skus: list[str]


class TopologyRack(BaseModel):
    rack: str
    hosts: list[TopologyHost]


class TopologyCluster(BaseModel):
    cluster: str
    racks: list[TopologyRack]


class Topology(BaseModel):
    clusters: list[TopologyCluster]
    gpus: int


class SeriesOut(BaseModel):
    metric: str
    labels: dict[str, str]

    @classmethod
    def of(cls, key: SeriesKey) -> SeriesOut:
        return cls(metric=key.metric, labels=key.label_dict)


class RangeSeries(SeriesOut):
    points: list[tuple[float, float | None]] = Field(
        description="[unix seconds, value] at each step start; empty steps are left out."
    )

    @classmethod
    def of_points(cls, sp: SeriesPoints) -> RangeSeries:
        return cls(
            metric=sp.series.metric,
            labels=sp.series.label_dict,
            points=[(p.timestamp, finite(p.value)) for p in sp.points],
        )


class RangeResult(BaseModel):
    tier: str = Field(description="Where the answer came from: raw, 1m or 1h rollups.")
    step: float
    warnings: list[str]
    series: list[RangeSeries]


class LatestSeries(SeriesOut):
    timestamp: float
    value: float | None


class LatestResult(BaseModel):
    series: list[LatestSeries]


class EvidenceOut(BaseModel):
    series: str = Field(description="The series text; use it as `query` in /query_range.")
    statistic: str
    value: float | None
    threshold: float | None = None
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    lag_seconds: float | None = None
    strength: float | None = None
    note: str = ""

    @classmethod
    def of(cls, e: Evidence) -> EvidenceOut:
        return cls(
            series=e.series,
            statistic=e.statistic,
            value=finite(e.value),
            threshold=finite(e.threshold),
            window_start=rfc3339(e.window_start_ms),
            window_end=rfc3339(e.window_end_ms),
            lag_seconds=finite(e.lag_seconds),
            strength=finite(e.strength),
            note=e.note,
        )


class CauseOut(BaseModel):
    cause: str
    confidence: float
    summary: str
    evidence: list[EvidenceOut]

    @classmethod
    def of(cls, c: RankedCause) -> CauseOut:
        return cls(
            cause=c.cause,
            confidence=finite(c.confidence) or 0.0,
            summary=c.summary,
            evidence=[EvidenceOut.of(e) for e in c.evidence],
        )


class AlertOut(BaseModel):
    id: str
    fingerprint: str
    state: str
    severity: str
    labels: dict[str, str]
    annotations: dict[str, str]
    started_at: dt.datetime
    updated_at: dt.datetime
    firing_at: dt.datetime | None
    resolved_at: dt.datetime | None
    incident_id: str | None
    finding_id: str
    silenced_by: list[str]
    inhibited_by: list[str]
    flaps: int

    @classmethod
    def of(cls, a: Alert) -> AlertOut:
        return cls(
            id=a.id,
            fingerprint=a.fingerprint,
            state=a.state.value,
            severity=a.severity.value,
            labels=dict(a.labels),
            annotations=dict(a.annotations),
            started_at=rfc3339(a.started_ms),
            updated_at=rfc3339(a.updated_ms),
            firing_at=rfc3339(a.firing_ms),
            resolved_at=rfc3339(a.resolved_ms),
            incident_id=a.incident_id,
            finding_id=a.finding_id,
            silenced_by=list(a.silenced_by),
            inhibited_by=list(a.inhibited_by),
            flaps=a.flaps,
        )


class TimelineEvent(BaseModel):
    at: dt.datetime
    kind: str
    text: str
    alert: str | None = None
    actor: str | None = None


class IncidentOut(BaseModel):
    id: str
    title: str
    state: str
    severity: str
    scope: dict[str, str] = Field(description="Where it is: rack, else host, else service.")
    opened_at: dt.datetime
    updated_at: dt.datetime
    resolved_at: dt.datetime | None
    acknowledged_by: str | None
    acknowledged_at: dt.datetime | None
    alerts: int
    top_cause: str | None
    url: str = Field(description="The incident page.")
    workloads: list[WorkloadOut] = Field(
        default=[], description="What ran on the affected GPUs (pods, Slurm jobs)."
    )

    @classmethod
    def of(cls, i: Incident) -> IncidentOut:
        return cls(
            id=i.id,
            title=i.title,
            state=i.state.value,
            severity=i.severity.value,
            scope=dict(i.scope),
            opened_at=rfc3339(i.opened_ms),
            updated_at=rfc3339(i.updated_ms),
            resolved_at=rfc3339(i.resolved_ms),
            acknowledged_by=i.acknowledged_by,
            acknowledged_at=rfc3339(i.acknowledged_ms),
            alerts=len(i.alerts),
            top_cause=i.causes[0].cause if i.causes else None,
            url=f"/incidents/{i.id}",
            workloads=[WorkloadOut.of(w) for w in i.workloads],
        )


class Entity(BaseModel):
    labels: dict[str, str]
    alerts: int


class SeriesLink(BaseModel):
    series: str
    why: str
    query_range: str = Field(description="A ready /api/v1/query_range URL over the window.")


class IncidentDetail(IncidentOut):
    causes: list[CauseOut]
    evidence: list[EvidenceOut]
    timeline: list[TimelineEvent]
    entities: list[Entity] = Field(description="Affected GPUs, hosts or services.")
    alert_list: list[AlertOut]
    series_to_check: list[SeriesLink]


class IncidentAction(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"by": "alice", "comment": "draining rack r07"}]},
    )
    by: str | None = Field(None, max_length=200, description="Who; defaults to the token's scope.")
    comment: str = Field("", max_length=2000)


class MatcherIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, examples=["rack"])
    value: str = Field(max_length=1000, examples=["r07"])
    op: str = Field("=", pattern="^(=|!=|=~|!~)$")


class SilenceIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "matchers": [{"name": "rack", "value": "r07", "op": "="}],
                    "duration": "2h",
                    "created_by": "alice",
                    "comment": "coolant pump swap, ticket OPS-1234",
                }
            ]
        },
    )
    matchers: list[MatcherIn] = Field(min_length=1, max_length=20)
    starts_at: float | str | None = Field(
        None, description="Unix seconds or RFC 3339; default now."
    )
    ends_at: float | str | None = Field(None, description="Unix seconds or RFC 3339.")
    duration: str | None = Field(
        None, description="Instead of ends_at: 30m, 2h, 48h.", examples=["2h"]
    )
    created_by: str = Field(min_length=1, max_length=200)
    comment: str = Field(min_length=1, max_length=2000)


class SilenceOut(BaseModel):
    id: str
    matchers: list[MatcherIn]
    starts_at: dt.datetime
    ends_at: dt.datetime
    created_by: str
    comment: str
    active: bool

    @classmethod
    def of(cls, s: Silence, now_ms: int) -> SilenceOut:
        return cls(
            id=s.id,
            matchers=[MatcherIn(name=m.name, value=m.value, op=m.op) for m in s.matchers],
            starts_at=rfc3339(s.starts_ms),
            ends_at=rfc3339(s.ends_ms),
            created_by=s.created_by,
            comment=s.comment,
            active=s.starts_ms <= now_ms < s.ends_ms,
        )


class IngestResult(BaseModel):
    received: int
    accepted: int
    duplicates: int
    rejected: dict[str, int] = Field(description="Samples refused, by reason.")
    errors: list[str] = Field(description="The first few reasons, spelled out.")


class CompactionOut(BaseModel):
    minutes: int
    samples: int
    chunks: int
    merged: int
    hours: int = Field(0, description="Series-hours re-packed from minute into hour chunks.")
