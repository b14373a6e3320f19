"""Liveness and readiness, for load balancers and for people."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from hbmwatch.api.deps import StatusDep, StoreDep
from hbmwatch.status import ServiceStatus
from hbmwatch.store.migrate import current_revision, head_revision

router = APIRouter(tags=["health"])

#: The detectors may trail now by this much before readiness fails.
MAX_DETECTION_LAG_SECONDS = 120.0


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and serving.  On the event loop, not the worker threads, and
    without touching the store: it answers at once even while every worker thread waits
    on a database that is down."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(store: StoreDep, status: StatusDep) -> JSONResponse:
    """Ready when the store answers at the latest schema, the collector scrapes and the
    detectors keep up; a part this process does not run is reported, not failed."""
    checks: dict[str, str] = {}
    try:
        store.ping()
        checks["store"] = "ok"
        revision, head = current_revision(store.engine), head_revision()
        checks["schema"] = "ok" if revision == head else f"at {revision}, expected {head}"
    except Exception as exc:
        checks["store"] = f"unreachable: {type(exc).__name__}: {exc}"
    checks["collector"] = _collector(status)
    checks["detection"] = _detection(status)
    ready = all(v == "ok" or v.startswith("not running") for v in checks.values())
    body = Readiness(status="ready" if ready else "not ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


def _collector(status: ServiceStatus) -> str:
    if status.collector_last_round_ms is None:
        return "not running in this process"
    last_ms = status.collector_last_round_ms()
    allowed = 5 * status.collector_interval_seconds + 10
    if last_ms == 0:  # not ready until a scrape completed: no start-up grace to lapse
        return "no scrape finished yet"
    age = status.clock() - last_ms / 1000
    return "ok" if age <= allowed else f"last scrape round {age:.0f} s ago"


def _detection(status: ServiceStatus) -> str:
    if status.detection_interval_seconds is None:
        return "not running in this process"
    allowed = max(MAX_DETECTION_LAG_SECONDS, 10 * status.detection_interval_seconds)
    lag = status.detection_lag_seconds()
    if lag is None:
        waited = status.clock() - status.started_at
        return "ok" if waited < allowed else f"no detection cycle in {waited:.0f} s"
    return "ok" if lag <= allowed else f"detection {lag:.0f} s behind"
