"""The eval's pager: alerting and delivery as ``hbmwatch up`` runs them, on the simulated clock.

``hbmwatch eval`` scores what on-call would have been sent, not only what the detectors
found.  Each detection cycle's findings go to the real ``Alerting`` over the run's store
(alert lifecycle, inhibition, grouping into incidents), then one pass of the real delivery
``Dispatcher`` sends what is due to a webhook receiver, a small Starlette app served by
uvicorn on 127.0.0.1 in the run's own event loop, which records every Alertmanager-format
notification with the simulated time it arrived.  Both are driven on the simulated clock, so
a run gives the same pages every time.  ``hbmwatch.evaluation.incident_scoring`` scores the record.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hbmwatch.alerts.delivery import Dispatcher
from hbmwatch.alerts.runner import Alerting
from hbmwatch.records import Alert, Incident
from hbmwatch.runtime.detection import CycleReport
from hbmwatch.settings import AlertSettings, ReceiverSettings
from hbmwatch.store.store import Store

RECEIVER = "eval-pager"
READY_SECONDS = 30.0


@dataclass(frozen=True)
class Notification:
    """One webhook request as the receiver got it: when (simulated ms) and its alerts."""

    at_ms: int
    group_key: str
    alerts: tuple[dict[str, Any], ...]  # Alertmanager webhook entries (status, labels, ...)


@dataclass
class PagerRecord:
    """What a run's alerting and delivery did: every alert and incident version, every
    notification.  ``incidents`` keeps each incident's versions as ``(ms, incident)``."""

    alerts: dict[str, Alert] = field(default_factory=dict)
    incidents: dict[str, list[tuple[int, Incident]]] = field(default_factory=dict)
    notifications: list[Notification] = field(default_factory=list)


class WebhookReceiver:
    """Records Alertmanager webhook payloads over real HTTP, in the caller's event loop."""

    def __init__(self, clock: Callable[[], float], record: list[Notification]) -> None:
        self._clock = clock
        self._record = record
        app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._sock = socket.socket()
        self._task: asyncio.Task[None] | None = None

    async def _hook(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            alerts = tuple(body["alerts"])
            key = str(body.get("groupKey", ""))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "not an Alertmanager webhook payload"}, 400)
        self._record.append(Notification(int(self._clock() * 1000), key, alerts))
        return JSONResponse({"status": "ok"})

    async def start(self) -> str:
        """Serve on a free port; return the webhook URL once it accepts requests."""
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_SECONDS
        while not self._server.started:
            if self._task.done() or loop.time() > deadline:
                await self.close()
                raise RuntimeError("the eval's webhook receiver did not start")
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{port}/hook"

    async def close(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._sock.close()


class Pager:
    """Alerting plus one delivery pass per detection cycle, recording what changed."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.record = PagerRecord()
        self._store = store
        self._clock = clock
        self._receiver = WebhookReceiver(clock, self.record.notifications)
        self._alerting: Alerting | None = None
        self._dispatcher: Dispatcher | None = None

    async def start(self) -> None:
        url = await self._receiver.start()
        settings = AlertSettings(receivers=[ReceiverSettings(name=RECEIVER, kind="webhook",
                                                             url=url)])  # fmt: skip
        self._alerting = Alerting(self._store, settings)
        self._alerting.start()
        self._dispatcher = Dispatcher(self._store.alerts, settings, clock=self._clock)

    async def on_cycle(self, store: Store, report: CycleReport) -> None:
        """What ``hbmwatch up`` does after each cycle: alerting, then (its 1 s loop) delivery."""
        assert self._alerting is not None and self._dispatcher is not None
        now_ms = int(self._clock() * 1000)
        changes = self._alerting.process(report.findings, now_ms)
        engine = self._alerting.engine
        for alert_id in changes.alerts:
            if alert_id in engine.alerts:
                self.record.alerts[alert_id] = engine.alerts[alert_id]
        for inc_id in changes.incidents:
            if inc_id in engine.incidents:
                versions = self.record.incidents.setdefault(inc_id, [])
                versions.append((now_ms, engine.incidents[inc_id]))
        await self._dispatcher.tick()

    async def close(self) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.aclose()
        await self._receiver.close()
