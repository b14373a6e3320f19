"""Alerts, incidents, silences and the delivery outbox as rows.

Everything is written in place by id as it changes, so a restart resumes from the rows:
the open alerts and incidents, the silences, and what each receiver still owes
(``alert_deliveries``).  This is also the ``DeliveryBook`` the dispatcher reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, and_, delete, or_, select

from hbmwatch.records import (
    Alert,
    AlertState,
    Delivery,
    Incident,
    IncidentEvent,
    IncidentState,
    Matcher,
    Severity,
    Silence,
    cause_from_dict,
    workload_from_dict,
)
from hbmwatch.records import Evidence as EvidenceRecord
from hbmwatch.store.guard import guarded
from hbmwatch.store.models import AlertRow, DeliveryRow, IncidentRow, SilenceRow

MAX_ROWS_PER_QUERY = 5_000


@guarded  # every method raises StoreUnavailable when the database cannot answer
class AlertBook:
    def __init__(
        self,
        engine: Engine,
        get_state: Callable[[str], Any],
        put_state: Callable[[str, Any], None],
    ) -> None:
        self.engine = engine
        self.get_state = get_state
        self.put_state = put_state

    # -- writes -------------------------------------------------------------------------
    def save(
        self, alerts: Iterable[Alert] = (), incidents: Iterable[Incident] = (),
        silences: Iterable[Silence] = (),
    ) -> None:  # fmt: skip
        """Insert or replace by id, in one transaction."""
        batches = [
            (AlertRow, [_alert_row(a) for a in alerts]),
            (IncidentRow, [_incident_row(i) for i in incidents]),
            (SilenceRow, [_silence_row(s) for s in silences]),
        ]
        with self.engine.begin() as conn:
            for model, rows in batches:
                if rows:
                    conn.execute(delete(model).where(model.id.in_([r["id"] for r in rows])))
                    conn.execute(model.__table__.insert(), rows)

    def save_deliveries(self, rows: Iterable[Delivery]) -> None:
        items = [dataclasses.asdict(d) for d in rows]
        if not items:
            return
        keys = [and_(DeliveryRow.receiver == d["receiver"], DeliveryRow.alert_id == d["alert_id"])
                for d in items]  # fmt: skip
        with self.engine.begin() as conn:
            for i in range(0, len(keys), 500):
                conn.execute(delete(DeliveryRow).where(or_(*keys[i : i + 500])))
            conn.execute(DeliveryRow.__table__.insert(), items)

    # -- reads --------------------------------------------------------------------------
    def live(self, since_ms: int) -> tuple[list[Alert], list[Incident], list[Silence]]:
        """What the engine resumes from: unresolved or recently resolved state."""
        a, i, s = AlertRow, IncidentRow, SilenceRow
        with self.engine.connect() as conn:
            alerts = conn.execute(select(a.__table__).where(
                or_(a.state != AlertState.RESOLVED.value, a.resolved_ms >= since_ms)
            ))  # fmt: skip
            alert_list = [_alert(r._mapping) for r in alerts]
            incidents = conn.execute(select(i.__table__).where(
                or_(i.state != IncidentState.RESOLVED.value, i.resolved_ms >= since_ms)
            ))  # fmt: skip
            incident_list = [_incident(r._mapping) for r in incidents]
            silences = conn.execute(select(s.__table__).where(s.ends_ms >= since_ms))
            return alert_list, incident_list, [_silence(r._mapping) for r in silences]

    def deliverable(self, since_ms: int) -> list[Alert]:
        """Firing alerts, and alerts resolved at or after ``since_ms``."""
        a = AlertRow
        q = select(a.__table__).where(
            or_(a.state == AlertState.FIRING.value,
                and_(a.state == AlertState.RESOLVED.value, a.resolved_ms >= since_ms,
                     a.firing_ms.is_not(None)))
        ).order_by(a.updated_ms)  # fmt: skip
        with self.engine.connect() as conn:
            return [_alert(r._mapping) for r in conn.execute(q)]

    def deliveries(self, receiver: str) -> dict[str, Delivery]:
        q = select(DeliveryRow.__table__).where(DeliveryRow.receiver == receiver)
        with self.engine.connect() as conn:
            return {r.alert_id: Delivery(**r._mapping) for r in conn.execute(q)}

    def silences(
        self, *, active_at_ms: int | None = None, ends_after_ms: int | None = None
    ) -> list[Silence]:
        q = select(SilenceRow.__table__).order_by(SilenceRow.created_ms)
        if ends_after_ms is not None:
            q = q.where(SilenceRow.ends_ms >= ends_after_ms)
        if active_at_ms is not None:
            q = q.where(SilenceRow.starts_ms <= active_at_ms, SilenceRow.ends_ms > active_at_ms)
        with self.engine.connect() as conn:
            return [_silence(r._mapping) for r in conn.execute(q)]

    def alerts(
        self, *, state: str | None = None, severity: str | None = None,
        incident_id: str | None = None, since_ms: int | None = None,
        labels: Mapping[str, str] | None = None, limit: int = 1000,
    ) -> list[Alert]:  # fmt: skip
        """Alerts, newest first; ``since`` selects those active at or after it."""
        a = AlertRow
        q = select(a.__table__).order_by(a.updated_ms.desc(), a.id)
        if state is not None:
            q = q.where(a.state == state)
        if severity is not None:
            q = q.where(a.severity == severity)
        if incident_id is not None:
            q = q.where(a.incident_id == incident_id)
        if since_ms is not None:
            q = q.where(or_(a.resolved_ms.is_(None), a.resolved_ms >= since_ms))
        with self.engine.connect() as conn:
            rows = [_alert(r._mapping) for r in conn.execute(q)]
        if labels:  # JSON columns differ across dialects: filter the (bounded) rows here
            rows = [x for x in rows if all(x.labels.get(k) == v for k, v in labels.items())]
        return rows[: min(limit, MAX_ROWS_PER_QUERY)]

    def incidents(
        self, *, state: str | None = None, rack: str | None = None, host: str | None = None,
        since_ms: int | None = None, limit: int = 1000,
        workload: Mapping[str, str] | None = None,
    ) -> list[Incident]:  # fmt: skip
        """Incidents, newest first; ``workload`` (namespace, pod, container, job: exact
        values) keeps those naming a matching workload on their GPUs."""
        i = IncidentRow
        q = select(i.__table__).order_by(i.opened_ms.desc(), i.id)
        if state is not None:
            q = q.where(i.state == state)
        if rack is not None:
            q = q.where(i.rack == rack)
        if host is not None:
            q = q.where(i.host == host)
        if since_ms is not None:
            q = q.where(or_(i.resolved_ms.is_(None), i.resolved_ms >= since_ms))
        if workload:  # a JSON list: filtered here, over the (bounded) candidate rows
            q = q.where(i.workloads.is_not(None))
        q = q.limit(MAX_ROWS_PER_QUERY if workload else min(limit, MAX_ROWS_PER_QUERY))
        with self.engine.connect() as conn:
            rows = [_incident(r._mapping) for r in conn.execute(q)]
        if workload:
            rows = [x for x in rows if any(
                all(getattr(w, k) == v for k, v in workload.items()) for w in x.workloads
            )]  # fmt: skip
        return rows[: min(limit, MAX_ROWS_PER_QUERY)]

    def incident(self, incident_id: str) -> Incident | None:
        q = select(IncidentRow.__table__).where(IncidentRow.id == incident_id)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return None if row is None else _incident(row._mapping)


def _alert_row(a: Alert) -> dict[str, Any]:
    d = dataclasses.asdict(a)
    d.update(state=a.state.value, severity=a.severity.value, labels=dict(a.labels),
             annotations=dict(a.annotations), alertname=a.labels.get("alertname", ""),
             silenced_by=list(a.silenced_by), inhibited_by=list(a.inhibited_by))  # fmt: skip
    return d


def _alert(row: Mapping[str, Any]) -> Alert:
    d = dict(row)
    d.pop("alertname", None)
    d.update(
        state=AlertState(d["state"]),
        severity=Severity(d["severity"]),
        silenced_by=tuple(d["silenced_by"]),
        inhibited_by=tuple(d["inhibited_by"]),
    )
    return Alert(**d)


def _incident_row(i: Incident) -> dict[str, Any]:
    d = dataclasses.asdict(i)
    d.update(
        state=i.state.value,
        severity=i.severity.value,
        scope=dict(i.scope),
        rack=i.scope.get("rack", ""),
        host=i.scope.get("host", ""),
        alerts=list(i.alerts),
    )
    return d


def _incident(row: Mapping[str, Any]) -> Incident:
    d = dict(row)
    d.pop("rack", None)
    d.pop("host", None)
    d.update(
        state=IncidentState(d["state"]), severity=Severity(d["severity"]),
        alerts=tuple(d["alerts"]), causes=tuple(cause_from_dict(c) for c in d["causes"]),
        evidence=tuple(EvidenceRecord(**e) for e in d["evidence"]),
        timeline=tuple(IncidentEvent(**e) for e in d["timeline"]),
        workloads=tuple(workload_from_dict(w) for w in d.get("workloads") or ()),
    )  # fmt: skip
    return Incident(**d)


def _silence_row(s: Silence) -> dict[str, Any]:
    return dataclasses.asdict(s)


def _silence(row: Mapping[str, Any]) -> Silence:
    d = dict(row)
    d["matchers"] = tuple(Matcher(**m) for m in d["matchers"])
    return Silence(**d)
