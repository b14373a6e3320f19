"""The HTTP application: gathers the routers; handlers live in ``api/routes``."""

from __future__ import annotations

from fastapi import FastAPI

from api.routes import health
from hbmwatch.settings import Settings
from store.store import Store


def create_app(settings: Settings, store: Store) -> FastAPI:
    app = FastAPI(
        title="hbmwatch",
        summary="HBM thermal and p99-latency telemetry for GPU fleets",
        version="0.1.0",
    )
    app.state.settings = settings
    app.state.store = store
    app.include_router(health.router)
    return app
