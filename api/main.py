"""The HTTP application: gathers the routers; handlers live in ``api/routes``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from hbmwatch.api import errors
from hbmwatch.api.admission import Admission
from hbmwatch.api.exporter import Exporter
from hbmwatch.api.middleware import BodyGuard, RequestMetrics, SecurityHeaders
from hbmwatch.api.routes import (
    admin,
    alerts,
    devices,
    health,
    incidents,
    ingest,
    metrics,
    pages,
    prometheus,
    silences,
)
from hbmwatch.api.routes import series as series_routes
from hbmwatch.settings import Settings
from hbmwatch.status import ServiceStatus
from hbmwatch.store.store import Store

#: Swagger UI and ReDoc files (package data of fastapi-offline), served by hbmwatch itself.
DOCS_STATIC = "/docs/static"

DESCRIPTION = """\
Triage during an incident: the fleet's inventory, its series (range and latest queries),
alerts, incidents with ranked causes and evidence, silences, and push ingest.

Times are accepted as unix seconds or RFC 3339 and returned as RFC 3339 (UTC), except query
points, which are `[unix seconds, value]`. Lists are paged with `limit` and `cursor`
(`next_cursor` of the previous page). Every error has the same body:
`{"error": {"code", "message", "detail"}}`.

Reads need a read token unless `api.open_reads` is on; writes (ingest, silences,
acknowledge, resolve) need a write token; admin calls an admin token. Send
`Authorization: Bearer <token>`.
"""


def create_app(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry | None = None,
    status: ServiceStatus | None = None,
    dispatcher_registered: bool = False,
) -> FastAPI:
    """The app over a store; ``registry`` is shared with the collector and the store so one
    ``/metrics`` serves them all."""
    app = FastAPIOffline(  # /docs and /redoc from package files, not a CDN
        static_url=DOCS_STATIC,
        title="hbmwatch",
        summary="HBM thermal and p99-latency telemetry for GPU fleets",
        description=DESCRIPTION,
        version="0.1.0",
    )
    registry = registry or CollectorRegistry()
    status = status or ServiceStatus()
    app.state.settings = settings
    app.state.store = store
    app.state.status = status
    app.state.registry = registry
    app.state.alerting = None
    registry.register(Exporter(store, status, dispatcher_registered=dispatcher_registered))
    errors.install(app)
    for module in (
        health,
        metrics,
        devices,
        series_routes,
        alerts,
        incidents,
        silences,
        ingest,
        admin,
        prometheus,
        pages,
    ):
        app.include_router(module.router)
    # Outermost last: headers on every answer, every answer counted, the token checked before
    # any body is read, and only then a slot in the admission limit.
    app.add_middleware(Admission, settings=settings.api)
    app.add_middleware(BodyGuard, settings=settings)
    app.add_middleware(RequestMetrics, registry=registry)
    app.add_middleware(SecurityHeaders)
    return app
