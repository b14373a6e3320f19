"""Tables, as typed SQLAlchemy models; Alembic migrations create the same schema.

Samples live in two places:

* ``samples_head_batch``: the newest minutes, one row per write batch and minute: the
  batch's ``n`` samples of that minute as three raw little-endian arrays (``ts`` uint16 ms
  after ``minute_ms``, ``series_id`` uint32 or int64, ``value`` float64), ``seq`` in write
  order.  One row per batch instead of one per sample makes a write one INSERT of a few
  blobs (store/head.py).
* ``samples_chunk``: one row per series and closed minute, holding the minute's statistics
  (count, min, max, sum, last) -- the 1-minute rollup tier -- and the compressed raw samples
  (``data``, set to NULL when raw retention ends).  On PostgreSQL it is partitioned by day.
* ``samples_hour``: one row per series and closed hour, once compaction has re-packed that
  hour's minute chunks (``store/hours.py``): the minute statistics packed into one blob
  (``minutes``) and the hour's raw samples in one chunk (``data``).  Each series' minute is
  in exactly one of the two tables; readers take both (``store/chunks.py``).

``rollup_1h`` holds the hourly tier.  ``store_state`` keeps watermarks, so a restarted store
carries on where it stopped.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Series(Base):
    __tablename__ = "series"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    metric: Mapped[str] = mapped_column(String(200), index=True)
    key: Mapped[str] = mapped_column(Text, unique=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    created_ms: Mapped[int] = mapped_column(BigInteger)


class HeadBatch(Base):
    """One write batch's samples of one minute; readers dedupe by (series, ts), lowest seq
    first (store/head.py)."""

    __tablename__ = "samples_head_batch"
    __table_args__ = (Index("ix_samples_head_batch_minute", "minute_ms"),)

    seq: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    minute_ms: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)
    ts: Mapped[bytes] = mapped_column(LargeBinary)
    series_id: Mapped[bytes] = mapped_column(LargeBinary)
    value: Mapped[bytes] = mapped_column(LargeBinary)


class Chunk(Base):
    __tablename__ = "samples_chunk"
    __table_args__ = {
        "sqlite_with_rowid": False,
        "postgresql_partition_by": "RANGE (start_ms)",
    }

    series_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    start_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(Integer)
    min: Mapped[float] = mapped_column(Double)
    max: Mapped[float] = mapped_column(Double)
    sum: Mapped[float] = mapped_column(Double)
    last: Mapped[float] = mapped_column(Double)
    data: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    #: the time of the minute's last sample (NULL in chunks older than migration 0004)
    last_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class HourChunk(Base):
    __tablename__ = "samples_hour"
    # A rowid table on SQLite: its leaves take rows of up to a page whole, where a WITHOUT
    # ROWID table spills past ~1 KB into overflow pages (0.86 against 1.11 bytes a sample).
    __table_args__ = {"postgresql_partition_by": "RANGE (start_ms)"}

    series_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    start_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: the hour's minute statistics, packed (``store/chunks.py``); NULL past 1-minute retention
    minutes: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    #: the hour's raw samples, one codec chunk; NULL past raw retention
    data: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class Rollup1h(Base):
    __tablename__ = "rollup_1h"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    start_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(Integer)
    min: Mapped[float] = mapped_column(Double)
    max: Mapped[float] = mapped_column(Double)
    sum: Mapped[float] = mapped_column(Double)
    last: Mapped[float] = mapped_column(Double)
    last_ms: Mapped[int] = mapped_column(BigInteger)


class StoreState(Base):
    __tablename__ = "store_state"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON, nullable=True)


class Device(Base):
    """Inventory: one row per physical GPU or logical partition seen by a collector."""

    __tablename__ = "devices"
    __table_args__ = (
        UniqueConstraint("cluster", "host", "gpu", "partition", name="uq_devices_identity"),
        Index("ix_devices_rack", "cluster", "rack"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(200), default="")
    rack: Mapped[str] = mapped_column(String(200), default="")
    host: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[str] = mapped_column(String(20))
    partition: Mapped[str] = mapped_column(String(20), default="")
    uuid: Mapped[str] = mapped_column(String(200), default="")
    serial: Mapped[str] = mapped_column(String(200), default="")
    vendor: Mapped[str] = mapped_column(String(20), default="")
    sku: Mapped[str] = mapped_column(String(50), default="")
    compute_partition: Mapped[str] = mapped_column(String(20), default="")
    memory_partition: Mapped[str] = mapped_column(String(20), default="")
    driver: Mapped[str] = mapped_column(String(100), default="")
    first_seen_ms: Mapped[int] = mapped_column(BigInteger)
    last_seen_ms: Mapped[int] = mapped_column(BigInteger)


class FindingRow(Base):
    """A detector's finding (``hbmwatch.records.Finding``), updated in place until it ends."""

    __tablename__ = "findings"
    __table_args__ = (
        Index("ix_findings_open", "ended_ms", "kind"),
        Index("ix_findings_host", "host", "started_ms"),
        Index("ix_findings_rack", "rack", "started_ms"),
        Index("ix_findings_updated", "updated_ms"),
    )

    id: Mapped[str] = mapped_column(String(300), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(300), index=True)
    kind: Mapped[str] = mapped_column(String(40))
    severity: Mapped[str] = mapped_column(String(16))
    detector: Mapped[str] = mapped_column(String(40))
    host: Mapped[str] = mapped_column(String(200), default="")
    rack: Mapped[str] = mapped_column(String(200), default="")
    entity: Mapped[dict[str, str]] = mapped_column(JSON)
    summary: Mapped[str] = mapped_column(Text)
    started_ms: Mapped[int] = mapped_column(BigInteger, index=True)
    raised_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    ended_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    evidence: Mapped[list[Any]] = mapped_column(JSON)
    causes: Mapped[list[Any]] = mapped_column(JSON)


class AlertRow(Base):
    """An alert (``hbmwatch.records.Alert``), updated in place as its state changes."""

    __tablename__ = "alerts"
    __table_args__ = (
        Index("ix_alerts_state", "state", "updated_ms"),
        Index("ix_alerts_incident", "incident_id"),
        Index("ix_alerts_resolved", "resolved_ms"),
    )

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(40), index=True)
    source: Mapped[str] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    alertname: Mapped[str] = mapped_column(String(100))
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    annotations: Mapped[dict[str, str]] = mapped_column(JSON)
    finding_id: Mapped[str] = mapped_column(String(300))
    incident_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    started_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    firing_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ending_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    resolved_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    silenced_by: Mapped[list[str]] = mapped_column(JSON)
    inhibited_by: Mapped[list[str]] = mapped_column(JSON)
    flaps: Mapped[int] = mapped_column(Integer, default=0)


class IncidentRow(Base):
    """An incident (``hbmwatch.records.Incident``) with its timeline, updated in place."""

    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_state", "state", "updated_ms"),
        Index("ix_incidents_opened", "opened_ms"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    title: Mapped[str] = mapped_column(Text)
    scope: Mapped[dict[str, str]] = mapped_column(JSON)
    rack: Mapped[str] = mapped_column(String(200), default="")
    host: Mapped[str] = mapped_column(String(200), default="")
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    opened_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    resolved_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    acknowledged_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    acknowledged_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    alerts: Mapped[list[str]] = mapped_column(JSON)
    causes: Mapped[list[Any]] = mapped_column(JSON)
    evidence: Mapped[list[Any]] = mapped_column(JSON)
    timeline: Mapped[list[Any]] = mapped_column(JSON)
    #: ``hbmwatch.records.Workload`` as dicts; NULL in rows written before 0008.
    workloads: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class SilenceRow(Base):
    __tablename__ = "silences"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    matchers: Mapped[list[Any]] = mapped_column(JSON)
    starts_ms: Mapped[int] = mapped_column(BigInteger)
    ends_ms: Mapped[int] = mapped_column(BigInteger, index=True)
    created_by: Mapped[str] = mapped_column(String(200))
    comment: Mapped[str] = mapped_column(Text)
    created_ms: Mapped[int] = mapped_column(BigInteger)


class DeliveryRow(Base):
    """Where one alert stands with one receiver (the outbox a restart resumes from)."""

    __tablename__ = "alert_deliveries"

    receiver: Mapped[str] = mapped_column(String(64), primary_key=True)
    alert_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    sent_state: Mapped[str] = mapped_column(String(16), default="")
    sent_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")
