"""The detection loop, and ``hbmwatch detect``: detectors over a store other processes write.

``detect`` runs this process' runners (``runtime/roles.py``) every interval, inside ``up``
or alone; ``detect_only`` is the process ``hbmwatch detect`` runs: the loop, and a candidate
for alert leader (``runtime/leader.py``).
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry

from hbmwatch import log
from hbmwatch.alerts.runner import Alerting
from hbmwatch.records import Finding
from hbmwatch.runtime import roles
from hbmwatch.runtime.delivering import deliver
from hbmwatch.runtime.leader import AlertLeader
from hbmwatch.runtime.supervise import exit_deadline, exits_on_fatal, stop_on_signals, supervise
from hbmwatch.settings import DetectionSettings, Settings
from hbmwatch.status import ServiceStatus, snapshot_from_frame
from hbmwatch.store.store import Store, StoreUnavailable, open_store

logger = log.get("hbmwatch.runtime.service")


async def detect(
    store: Store,
    settings: DetectionSettings,
    stop: asyncio.Event,
    alerting: Alerting | None = None,
    status: ServiceStatus | None = None,
    *,
    shared: bool = False,
) -> None:
    """Run this process' detectors (``runtime/roles.py``) every ``interval_seconds`` over the
    samples written since the last; their findings go on to ``alerting`` in the same step,
    when this process alerts inline (else the alert leader reads them from the store)."""
    runners = await asyncio.to_thread(roles.runners, store, settings, shared=shared)
    held: dict[str, Finding] = {}  # findings alerting has not taken yet (an outage)
    try:
        while not stop.is_set():
            try:
                seconds = 0.0
                for runner in runners:
                    report = await asyncio.to_thread(runner.cycle)
                    seconds += report.seconds
                    held.update((f.id, f) for f in report.findings)
                if status is not None:
                    frame = runners[-1].last_frame  # the fleet-wide one where there are two
                    snapshot = snapshot_from_frame(frame) if frame is not None else None
                    status.record_cycle(seconds, snapshot)
                if alerting is not None and held:
                    await asyncio.to_thread(alerting.process, list(held.values()))
                held.clear()
                if seconds > settings.interval_seconds:
                    logger.warning("detection cycle slower than its interval",
                                   seconds=round(seconds, 2))  # fmt: skip
            except StoreUnavailable as exc:
                logger.warning("detection skipped: store unavailable", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.interval_seconds)
    finally:
        with contextlib.suppress(StoreUnavailable):
            for runner in runners:
                await asyncio.to_thread(runner.save_state)


async def detect_only(settings: Settings, metrics_port: int | None = None) -> None:
    """``hbmwatch detect``: this process' detectors over a store others write, and a candidate
    for alert leader (``runtime/leader.py``) when alerting is on; its metrics (the leader
    gauge among them) on ``metrics_port`` when given."""
    registry = CollectorRegistry()
    store = open_store(settings.store, registry=registry)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings.api.host, registry=registry)
    p = roles.plan(settings.detection)
    logger.info("detection starting", shard=str(p.racks) if p.racks else None,
                fleet_wide=p.fleet_wide)  # fmt: skip
    stop = asyncio.Event()
    stop_on_signals(stop)
    delivering = settings.alerts.enabled and bool(settings.alerts.receivers)
    try:
        with exits_on_fatal():
            async with asyncio.TaskGroup() as group:
                if settings.alerts.enabled:
                    leader = AlertLeader(store, settings, registry, deliver if delivering else None)
                    group.create_task(supervise("alert leader", lambda: leader.run(stop), stop))
                looping = lambda: detect(store, settings.detection, stop, shared=True)  # noqa: E731
                group.create_task(supervise("detection", looping, stop))
    finally:
        stop.set()
        exit_deadline()
        store.close()
