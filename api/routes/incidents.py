"""Incidents: the list, the detail on-call reads during triage, acknowledge and resolve."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Query

from hbmwatch import metrics
from hbmwatch.alerts.engine import IncidentClosed
from hbmwatch.api.deps import AlertingDep, Scope, ScopeRead, ScopeWrite, StoreDep, actor
from hbmwatch.api.errors import ERROR_RESPONSES, ApiError, ErrorResponse, not_found
from hbmwatch.api.incident.view import series_in
from hbmwatch.api.params import Cursor, Limit, TimeParam, page, parse_time
from hbmwatch.api.schemas import (
    AlertOut,
    CauseOut,
    Entity,
    EvidenceOut,
    IncidentAction,
    IncidentDetail,
    IncidentOut,
    Page,
    SeriesLink,
    TimelineEvent,
    rfc3339,
)
from hbmwatch.api.workloads import workload_filter
from hbmwatch.records import Alert, Incident, IncidentState, Severity

router = APIRouter(prefix="/api/v1", tags=["incidents"], responses=ERROR_RESPONSES)

IncidentId = Annotated[str, Path(max_length=100, description="The incident's id.")]
Namespace = Annotated[str | None, Query(description="Incidents whose GPUs ran a pod of "
                                        "this namespace (exact).")]  # fmt: skip
Pod = Annotated[str | None, Query(description="... ran this pod (exact).")]
Container = Annotated[str | None, Query(description="... ran this container (exact).")]
Job = Annotated[str | None, Query(description="... ran this Slurm job (exact).")]
#: The window a "series to check" link covers around the incident.
LINK_PADDING_MS = 15 * 60_000
#: Labels that name an affected entity, most specific first.
ENTITY_LABELS = (
    ("cluster", "host", "gpu", "partition"),
    ("cluster", "rack"),
    ("service", "phase"),
    ("target",),
)


@router.get("/incidents", response_model=Page[IncidentOut])
def list_incidents(
    store: StoreDep,
    _: ScopeRead,
    state: IncidentState | None = None,
    severity: Severity | None = None,
    rack: Annotated[str | None, Query(max_length=200)] = None,
    host: Annotated[str | None, Query(max_length=200)] = None,
    since: TimeParam = None,
    namespace: Namespace = None,
    pod: Pod = None,
    container: Container = None,
    job: Job = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[IncidentOut]:
    """Incidents, newest opened first; since selects those open at or after it;
    namespace, pod, container and job those whose GPUs ran a matching workload (all
    given must hold for one workload)."""
    since_ms = None if since is None else int(parse_time("since", since, 0) * 1000)
    workload = workload_filter(namespace=namespace, pod=pod, container=container, job=job)
    found = store.alerts.incidents(
        state=state.value if state else None, rack=rack, host=host, since_ms=since_ms,
        limit=5000, workload=workload,
    )  # fmt: skip
    if severity is not None:
        found = [i for i in found if i.severity is severity]
    return page([IncidentOut.of(i) for i in found], limit, cursor)


@router.get("/incidents/{incident_id}", response_model=IncidentDetail)
def get_incident(store: StoreDep, _: ScopeRead, incident_id: IncidentId) -> IncidentDetail:
    """Everything about one incident: timeline, entities, ranked causes, series to look at."""
    incident = store.alerts.incident(incident_id)
    if incident is None:
        raise not_found("incident", incident_id)
    alerts = store.alerts.alerts(incident_id=incident_id, limit=5000)
    return detail(incident, alerts, store.now_ms())


CONFLICT = {409: {"model": ErrorResponse, "description": "The incident is resolved."}}


@router.post("/incidents/{incident_id}/acknowledge", response_model=IncidentOut, responses=CONFLICT)
def acknowledge(
    scope: ScopeWrite,
    alerting: AlertingDep,
    incident_id: IncidentId,
    body: IncidentAction | None = None,
) -> IncidentOut:
    """Someone is on it: the incident stays open, and the timeline says who.

    A resolved incident cannot be acknowledged: 409 ``incident_closed``.
    """
    return _act(alerting.acknowledge, incident_id, scope, body)


@router.post("/incidents/{incident_id}/resolve", response_model=IncidentOut)
def resolve(
    scope: ScopeWrite,
    alerting: AlertingDep,
    incident_id: IncidentId,
    body: IncidentAction | None = None,
) -> IncidentOut:
    """Close it by hand; alerts still firing open a new incident.  Resolving a resolved
    incident changes nothing and answers 200 (retries are safe)."""
    return _act(alerting.resolve, incident_id, scope, body)


def _act(
    action: Callable[[str, str, str], Incident],
    incident_id: str,
    scope: Scope | None,
    body: IncidentAction | None,
) -> IncidentOut:
    body = body or IncidentAction()
    try:
        return IncidentOut.of(action(incident_id, body.by or actor(scope), body.comment))
    except KeyError:
        raise not_found("incident", incident_id) from None
    except IncidentClosed as exc:
        raise ApiError(409, "incident_closed", str(exc), **exc.detail) from None


def detail(incident: Incident, alerts: list[Alert], now_ms: int) -> IncidentDetail:
    base = IncidentOut.of(incident)
    return IncidentDetail(
        **base.model_dump(),
        causes=[CauseOut.of(c) for c in incident.causes],
        evidence=[EvidenceOut.of(e) for e in incident.evidence],
        timeline=[
            TimelineEvent(
                at=rfc3339(e.at_ms), kind=e.kind, text=e.text, alert=e.alert, actor=e.actor
            )
            for e in incident.timeline
        ],
        entities=_entities(alerts),
        alert_list=[AlertOut.of(a) for a in alerts],
        series_to_check=_series_links(incident, now_ms),
    )


def _entities(alerts: list[Alert]) -> list[Entity]:
    """Each alert's most specific place (a GPU, else a rack, a service or a target)."""
    seen: Counter[tuple[tuple[str, str], ...]] = Counter()
    for a in alerts:
        for names in ENTITY_LABELS:
            place = tuple((n, a.labels[n]) for n in names if a.labels.get(n))
            if len(place) > 1 or (place and names[0] != "cluster"):
                seen[place] += 1
                break
    return [Entity(labels=dict(k), alerts=n) for k, n in seen.most_common()]


def _series_links(incident: Incident, now_ms: int) -> list[SeriesLink]:
    start = incident.opened_ms - LINK_PADDING_MS
    end = min(now_ms, (incident.resolved_ms or now_ms) + LINK_PADDING_MS)
    step = max(1, (end - start) // 1000 // 300)
    out: dict[str, SeriesLink] = {}
    ranked = [(c.cause, e) for c in incident.causes for e in c.evidence]
    ranked += [("evidence", e) for e in incident.evidence]
    for why, e in ranked:
        series = series_in(e.series)
        if series is None or series in out:
            continue
        params = {"query": series, "start": start / 1000, "end": end / 1000, "step": step}
        definition = metrics.get(series.split("{", 1)[0])
        if definition is not None and definition.is_counter:
            params["fn"] = "rate"
        out[series] = SeriesLink(
            series=series,
            why=f"{why}: {e.statistic}",
            query_range=f"/api/v1/query_range?{urlencode(params)}",
        )
    return list(out.values())[:20]
