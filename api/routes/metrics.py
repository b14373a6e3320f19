"""``/metrics`` in Prometheus' text format, from the app's own registry (never the global)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hbmwatch.api.deps import ScopeRead

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Exposition text."}},
)
def metrics(request: Request, _: ScopeRead) -> Response:
    """Derived signals (thermal margins, scores, p99s, incidents) and hbmwatch's own health."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
