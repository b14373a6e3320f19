"""Liveness and readiness, for load balancers and for people."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.deps import StoreDep
from store.migrate import current_revision, head_revision

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up and serving."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(store: StoreDep) -> JSONResponse:
    """Ready when the store answers and its schema is at the latest migration."""
    checks: dict[str, str] = {}
    try:
        store.ping()
        checks["store"] = "ok"
        revision, head = current_revision(store.engine), head_revision()
        checks["schema"] = "ok" if revision == head else f"at {revision}, expected {head}"
    except Exception as exc:
        checks["store"] = f"unreachable: {type(exc).__name__}: {exc}"
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(status="ready" if ready else "not ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
