"""``/metrics`` in Prometheus' text format, from the app's own registry (never the global)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hbmwatch.api import federation
from hbmwatch.api.deps import ScopeRead
from hbmwatch.query import time_budget
from hbmwatch.settings import Settings

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Exposition text."},
        422: {
            "content": {"text/plain": {}},
            "description": "api.expose_canonical_series is on and the store holds more "
            "series than api.federate_max_series.",
        },
    },
)
def metrics(request: Request, _: ScopeRead) -> Response:
    """Derived signals (thermal margins, scores, p99s, incidents) and hbmwatch's own health;
    with ``api.expose_canonical_series``, every stored device series as ``/federate`` has it."""
    body = generate_latest(request.app.state.registry)
    settings: Settings = request.app.state.settings
    if settings.api.expose_canonical_series:
        try:
            with time_budget(settings.api.query_timeout_seconds):
                extra = federation.canonical(
                    request.app.state.store, settings.api.federate_max_series
                )
        except federation.FederationTooLarge as exc:
            return PlainTextResponse(f"{exc}\n", status_code=422)
        body += extra.encode()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
