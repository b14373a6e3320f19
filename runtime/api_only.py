"""``hbmwatch serve``: the HTTP API alone, over a store that other processes write.

Past one machine the API is a reader like any other (docs/scale.md): collector shards
write the samples, detector shards the findings, the alert leader the alerts and
incidents; any number of ``serve`` processes answer dashboards, on-call and
``/prometheus`` from PostgreSQL and the engine.  The API runs in its own process, as under
``hbmwatch up``, and is started again if it dies.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from hbmwatch import log
from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.server import ApiServerError
from hbmwatch.runtime.apiprocess import ApiProcess
from hbmwatch.runtime.supervise import exit_deadline, stop_on_signals, supervise
from hbmwatch.settings import Settings
from hbmwatch.status import ServiceStatus
from hbmwatch.store.store import open_store
from hbmwatch.validation import ConfigError

logger = log.get("hbmwatch.runtime.api_only")


async def serve(settings: Settings) -> None:
    registry = CollectorRegistry()
    store = open_store(settings.store, registry=registry)
    status = ServiceStatus(collector_interval_seconds=settings.collector.interval_seconds)
    alerting: Alerting | None = None

    def alerting_for_api() -> Alerting:  # silences, acknowledge, resolve: made at first use
        nonlocal alerting
        if alerting is None:
            alerting = Alerting(store, settings.alerts)
            alerting.start()
        return alerting

    api = ApiProcess(settings, status, registry, alerting_for_api)
    stop = asyncio.Event()
    stop_on_signals(stop)
    try:
        try:
            await api.start()
        except ApiServerError as exc:
            raise ConfigError(str(exc), field="api.port") from None
        logger.info("serving", url=f"http://{settings.api.host}:{settings.api.port}",
                    samples="remote" if settings.store.remote.enabled else "store")  # fmt: skip
        await supervise("api", lambda: api.serve(stop), stop)
    finally:
        stop.set()
        exit_deadline()
        await api.stop()
        store.close()
