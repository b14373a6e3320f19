"""The API in its own process under ``hbmwatch up`` (issue 12.14).

On the service's thread 200 readers left the collector 85% of its scrapes; in a child
process at a lower priority it keeps them all (``scripts/api-load-probe.py --mode up``).
These tests hold what the move must not lose: readiness and ``/metrics`` still report the
service, people's actions still reach the one alerting engine, a dead API process is
replaced while collection goes on, and a dead service leaves no API process behind.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.alerts.engine import IncidentClosed
from hbmwatch.records import IncidentState
from hbmwatch.runtime.apiprocess import _portable
from hbmwatch.runtime.relay import (
    AlertingProxy,
    RelayClient,
    RelayedMetrics,
    RelayServer,
    ServiceBusy,
    ServiceGone,
    StatusMirror,
)
from hbmwatch.settings import load_settings
from hbmwatch.status import FleetSnapshot, LabelledValue, ServiceStatus
from hbmwatch.store.guard import StoreUnavailable
from tests.conftest import Clock, make_store
from tests.test_api import open_incident
from tests.test_service import HBMWATCH, clean_env, free_port


def relayed(
    status: ServiceStatus, registry: CollectorRegistry, alerting: Callable[[], object]
) -> RelayClient:
    service_end, api_end = multiprocessing.Pipe()
    RelayServer(service_end, status, registry, alerting).start()
    return RelayClient(api_end, timeout=60)


def test_status_reaches_the_api_process() -> None:
    snap = FleetSnapshot(5_000, thermal_margin=[LabelledValue({"gpu": "0"}, 12.5)])
    service = ServiceStatus(collector_last_round_ms=lambda: 4_000, detection_interval_seconds=5)
    service.record_cycle(0.3, snap)
    mirror = ServiceStatus()
    client = relayed(service, CollectorRegistry(), object)
    status_mirror = StatusMirror(client, mirror, lambda: None)
    status_mirror.refresh()
    assert mirror.collector_last_round_ms is not None and mirror.collector_last_round_ms() == 4_000
    assert mirror.detection_interval_seconds == 5 and mirror.last_cycle_seconds == 0.3
    assert mirror.snapshot == snap and mirror.started_at == service.started_at
    status_mirror.refresh()  # the same frame: the snapshot is not sent again, and is kept
    assert mirror.snapshot == snap
    newer = FleetSnapshot(10_000, thermal_margin=[LabelledValue({"gpu": "0"}, 3.0)])
    service.record_cycle(0.4, newer)
    status_mirror.refresh()
    assert mirror.snapshot == newer and mirror.last_cycle_seconds == 0.4


def test_metrics_are_the_service_s_and_the_api_s() -> None:
    service_registry, api_registry = CollectorRegistry(), CollectorRegistry()
    Counter("hbmwatch_collector_scrapes", "Scrapes.", registry=service_registry).inc(3)
    Counter("hbmwatch_http_requests", "Requests.", registry=api_registry).inc()
    api_registry.register(RelayedMetrics(relayed(ServiceStatus(), service_registry, object)))
    text = generate_latest(api_registry).decode()
    assert "hbmwatch_collector_scrapes_total 3.0" in text
    assert "hbmwatch_http_requests_total 1.0" in text


def test_actions_run_in_the_service_s_engine(tmp_path: Path) -> None:
    """An acknowledgement made through the API process lands in the engine that saves
    incidents; a second engine's would be overwritten at the service's next save."""
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock())
    alerting, incident_id = open_incident(store, Clock())
    proxy = AlertingProxy(relayed(ServiceStatus(), CollectorRegistry(), lambda: alerting), store)
    acked = proxy.acknowledge(incident_id, "alice", "looking")
    assert acked.state is IncidentState.ACKNOWLEDGED
    assert alerting.engine.incidents[incident_id].state is IncidentState.ACKNOWLEDGED
    with pytest.raises(KeyError):
        proxy.acknowledge("no-such-incident", "alice")
    proxy.resolve(incident_id, "alice")
    with pytest.raises(IncidentClosed) as closed:  # the API's 409, with its detail
        proxy.acknowledge(incident_id, "bob")
    assert closed.value.detail == IncidentClosed("x", **closed.value.detail).detail
    with pytest.raises(AttributeError):
        proxy.process  # noqa: B018 - only people's actions cross the pipe
    store.close()


def test_a_silent_or_ended_service_is_a_503_not_a_hang() -> None:
    service_end, api_end = multiprocessing.Pipe()
    client = RelayClient(api_end, timeout=0.2)
    with pytest.raises(ServiceBusy):  # nobody answers: the caller's 503
        client.call("status")
    assert issubclass(ServiceBusy, StoreUnavailable) and issubclass(ServiceGone, StoreUnavailable)
    gone = threading.Event()
    mirror = StatusMirror(client, ServiceStatus(), gone.set, every=0.05)
    mirror.start()
    service_end.close()  # the service's process ended
    assert gone.wait(60), "the API process did not notice its service had gone"


def test_settings_from_a_file_can_cross_to_the_child(tmp_path: Path) -> None:
    config = tmp_path / "hbmwatch.toml"
    config.write_text('[api]\nport = 9999\nwrite_token = "s3cret"\n')
    settings = load_settings(config)
    copy = pickle.loads(pickle.dumps(_portable(settings)))
    assert copy.api.port == 9999 and copy.api.write_token.get_secret_value() == "s3cret"


def _api_pids(log: Path) -> list[int]:
    return [int(p) for p in re.findall(r"api serving in its own process.*?pid=(\d+)",
                                       log.read_text())]  # fmt: skip


def _wait(what: str, condition: Callable[[], bool], seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    pytest.fail(f"timed out after {seconds:g} s waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _scrapes(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a metric family appears twice in /metrics"
    assert "hbmwatch_http_requests" in names  # the API process's own
    return sum(s.value for f in families for s in f.samples
               if s.name == "hbmwatch_collector_scrapes_total")  # fmt: skip


@pytest.mark.slow
def test_up_replaces_a_dead_api_process_and_leaves_none_behind(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "up.log"
    env = clean_env(
        HBMWATCH_API__PORT=str(port),
        HBMWATCH_SIMULATOR__BASE_PORT="0",
        HBMWATCH_STORE__URL=f"sqlite:///{tmp_path / 'hbmwatch.db'}",
    )
    with log.open("w") as out:
        proc = subprocess.Popen([*HBMWATCH, "up"], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait("ready", lambda: httpx.get(f"{base}/readyz", timeout=10).status_code == 200)
        _wait("a scrape counted in /metrics", lambda: _scrapes(base) > 0)
        (first,) = _api_pids(log)
        assert first != proc.pid
        os.kill(first, signal.SIGKILL)
        _wait("a new API process", lambda: len(_api_pids(log)) == 2)
        assert proc.poll() is None, "the service ended with its API process"
        before = _scrapes(base)
        _wait("collection going on", lambda: _scrapes(base) > before)
        _wait("ready again", lambda: httpx.get(f"{base}/readyz", timeout=10).status_code == 200)
        second = _api_pids(log)[-1]
        proc.kill()  # no stop, no cleanup: the API process must notice alone
        proc.wait(60)
        _wait("the orphaned API process to end", lambda: not _alive(second), 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
