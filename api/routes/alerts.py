"""Alerts: hbmwatch's own, with their state, labels, silences and inhibitions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from hbmwatch.alerts.matchers import matches_all, parse_matcher
from hbmwatch.api.deps import ScopeRead, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES
from hbmwatch.api.params import Cursor, Limit, TimeParam, page, parse_time
from hbmwatch.api.schemas import AlertOut, Page
from hbmwatch.records import AlertState, Severity
from hbmwatch.validation import InvalidQuery

router = APIRouter(prefix="/api/v1", tags=["alerts"], responses=ERROR_RESPONSES)


@router.get("/alerts", response_model=Page[AlertOut])
def list_alerts(
    store: StoreDep,
    _: ScopeRead,
    state: AlertState | None = None,
    severity: Severity | None = None,
    match: Annotated[
        list[str],
        Query(
            max_length=20,
            description="Label matchers such as rack=r07 or alertname=~GPU.*; all must hold.",
        ),
    ] = [],  # noqa: B006
    since: TimeParam = None,
    until: TimeParam = None,
    incident: Annotated[str | None, Query(max_length=100)] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[AlertOut]:
    """Alerts, newest update first; since/until select those active in that span."""
    try:
        matchers = [parse_matcher(m) for m in match]
    except ValueError as exc:
        raise InvalidQuery(f"match: {exc}", parameter="match") from None
    since_ms = None if since is None else int(parse_time("since", since, 0) * 1000)
    until_ms = None if until is None else int(parse_time("until", until, 0) * 1000)
    alerts = store.alerts.alerts(
        state=state.value if state else None,
        severity=severity.value if severity else None,
        incident_id=incident,
        since_ms=since_ms,
        limit=5000,
    )
    chosen = [
        a
        for a in alerts
        if matches_all(matchers, a.labels) and (until_ms is None or a.started_ms <= until_ms)
    ]
    return page([AlertOut.of(a) for a in chosen], limit, cursor)
