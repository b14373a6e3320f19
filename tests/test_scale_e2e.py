"""Past one machine, with real processes (issue 16's first "Must hold").

A simulated fleet (``hbmwatch sim``), two collector shards (``hbmwatch collect --shard i/2``)
remote-writing to a real engine (VictoriaMetrics, then Prometheus with its receiver on),
two detector shards (``hbmwatch detect --shard i/2``) reading their windows back from it,
PostgreSQL for findings, alerts and incidents, and a real Alertmanager whose webhook is a
recording receiver.  Two exporters go down one after the other; after the first page the
alert leader is killed with SIGKILL, and started again as a supervisor would (its racks need
a detector).  What must hold:

* the other detector process takes the lead within 30 s, not the restarted one (a newly
  started candidate stands by before its first try: runtime/leader.py, STANDBY_SECONDS);
* every page reaches the receiver exactly once (one firing notification per fault, none
  lost: the second fault's page comes from the new leader);
* every sample the collectors wrote is in the engine, counted there;
* one ``hbmwatch detect`` process (no shard) over the same samples opens the same incidents.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from hbmwatch.bench.engines import EngineProcess, EngineUnavailable, VictoriaMetrics
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from tests.alertmanager import WebhookSink, running_alertmanager
from tests.conftest import private_schema
from tests.test_service import HBMWATCH, clean_env, free_port

pytestmark = pytest.mark.postgres

SCENARIO = """
name = "scale_e2e"
description = "Two node exporters go down one after the other"
duration = "30m"
seed = 7

[[racks]]
name = "r0"
nodes = 2
sku = "MI300X"

[[racks]]
name = "r6"  # cluster c0: r0 hashes to detector shard 1 of 2, r6 to shard 0
nodes = 2
sku = "H200"

[workload]
requests_per_second = 2.0

[[faults]]
kind = "target_down"
target = { host = "r0-node1" }
onset = "30s"
end = "100s"

[[faults]]
kind = "target_down"
target = { host = "r6-node0" }
onset = "75s"
end = "140s"
"""
DOWN_HOSTS = ("r0-node1", "r6-node0")
TARGET_DOWN = "HbmwatchTargetDown"
START_S = 120.0  # a loaded 2-core machine: generous
PAGE_S = 180.0  # from a fault's onset to its page, with slack for the busy machine
TAKEOVER_S = 30.0  # the bound


class Fleet:
    """The processes of one run; each one's log in the run's folder, stopped by PID."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.folder / f"{name}.log").open("wb")
        proc = subprocess.Popen([*HBMWATCH, *args], stdout=log, stderr=subprocess.STDOUT,
                                env={**self.env, **env}, cwd=self.folder)  # fmt: skip
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines of one process."""
        out = []
        for line in (self.folder / f"{name}.log").read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        return [e for e in self.log(name) if e.get("event") == event]

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and proc.returncode not in (0, -signal.SIGKILL):
                tail = (self.folder / f"{name}.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self, name: str, timeout: float = 60.0) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def wait(what: str, condition: Callable[[], Any], timeout: float, fleet: Fleet) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        fleet.check_alive()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what} (logs in {fleet.folder})")
        time.sleep(0.5)  # polling a condition, with a deadline


def migrated(url: str) -> str:
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


def firing_pages(sink: WebhookSink) -> dict[str, int]:
    """Firing notifications per down host, as the receiver got them."""
    counts: dict[str, int] = {}
    for body in sink.bodies("/am"):
        if not isinstance(body, dict) or body.get("status") != "firing":
            continue
        for alert in body.get("alerts", []):
            if (
                alert.get("status") == "firing"
                and alert["labels"].get("alertname") == "HbmwatchTargetDown"
            ):
                host = alert["labels"].get("host", "")
                counts[host] = counts.get(host, 0) + 1
    return counts


def leaders(fleet: Fleet, names: tuple[str, ...]) -> list[str]:
    """Detector processes that logged taking the lead, in the order they did."""
    taken = [(e["timestamp"], n) for n in names for e in fleet.events(n, "alert leader acquired")]
    return [n for _, n in sorted(taken)]


def engine_samples(engine: EngineProcess) -> float:
    """Every sample the engine holds, counted there metric by metric (``count_over_time``
    drops the name, so one query over every metric would join series of different names)."""
    with httpx.Client(base_url=engine.url, timeout=60) as client:
        names = client.get("/api/v1/label/__name__/values").json()["data"]
        total = 0.0
        for name in names:
            query = f'sum(count_over_time({{__name__="{name}"}}[1d]))'
            result = client.post("/api/v1/query", data={"query": query}).json()["data"]["result"]
            total += float(result[0]["value"][1]) if result else 0.0
        return total


def open_incidents(url: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(title, scope) of every incident in the schema at ``url``."""
    from hbmwatch.settings import load_settings
    from hbmwatch.store.store import open_store

    store = open_store(load_settings(store={"url": url}).store)
    try:
        _, incidents, _ = store.alerts.live(0)
        return {(i.title, tuple(sorted(i.scope.items()))) for i in incidents}
    finally:
        store.close()


def _get(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=10)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


@contextlib.contextmanager
def running(kind: type[EngineProcess], folder: Path) -> Iterator[EngineProcess]:
    """The engine, or a skip (a failure under HBMWATCH_REQUIRE_SERVICES=1) without it."""
    try:
        engine = kind(folder)
    except EngineUnavailable as exc:
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    with engine:
        yield engine


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sharded_fleet_on_victoria_metrics(pg_url: str, tmp_path: Path) -> None:
    with running(VictoriaMetrics, tmp_path / "victoria-metrics") as engine:
        sharded_fleet(engine, pg_url, tmp_path)


def sharded_fleet(engine: EngineProcess, pg_url: str, tmp_path: Path) -> None:
    """The run the module doc describes, against ``engine`` (tests/test_scale_e2e_prometheus.py
    runs it with Prometheus as the receiver, on another worker)."""
    scenario = tmp_path / "scale_e2e.toml"
    scenario.write_text(SCENARIO)
    with ExitStack() as stack, WebhookSink() as sink:
        am = stack.enter_context(running_alertmanager(tmp_path, sink.url + "/am",
                                                      group_by=("alertname", "host")))  # fmt: skip
        url = migrated(stack.enter_context(private_schema(pg_url)))
        # The single detector's schema, made before the processes start: on the way out they
        # stop first, then the schemas are dropped (not under a running process).
        single_url = migrated(stack.enter_context(private_schema(pg_url)))
        receivers = json.dumps([{"name": "am", "kind": "alertmanager", "url": am.url}])
        env = clean_env(
            HBMWATCH_STORE__URL=url,
            HBMWATCH_STORE__REMOTE__WRITE_URL=engine.url + "/api/v1/write",
            HBMWATCH_STORE__REMOTE__QUERY_URL=engine.url,
            HBMWATCH_DETECTION__SETTLE_SECONDS="4",
            # Collectors that start late on a loaded machine may first scrape the first
            # exporter already down (onset 30 s): it must page within the fault all the same.
            HBMWATCH_DETECTION__TARGET_FIRST_UP_GRACE_SECONDS="10",
            HBMWATCH_ALERTS__RECEIVERS=receivers,
            HBMWATCH_LOG_FORMAT="json",
        )
        fleet = Fleet(tmp_path, env)
        stack.callback(fleet.stop_all)
        targets = tmp_path / "targets.json"
        fleet.start("sim", "sim", str(scenario), "--port", "0", "--targets", str(targets),
                    "--truth", str(tmp_path / "truth.json"))  # fmt: skip
        wait("the simulated fleet serving", targets.exists, START_S, fleet)
        for i in range(2):
            fleet.start(f"collect-{i}", "collect", "--targets", str(targets), "--shard", f"{i}/2",
                        HBMWATCH_COLLECTOR__SPOOL_DIR=str(tmp_path / f"spool-{i}"))  # fmt: skip
        detectors = ["detect-0", "detect-1"]
        for i, name in enumerate(detectors):
            fleet.start(name, "detect", "--shard", f"{i}/2")
        first = wait("a leader", lambda: leaders(fleet, tuple(detectors)), START_S, fleet)[0]

        # The first fault pages; then the leader dies without a word, and is started again.
        wait("the first page", lambda: firing_pages(sink).get(DOWN_HOSTS[0]), PAGE_S + 40, fleet)
        fleet.procs[first].kill()
        fleet.procs[first].wait(30)
        killed_at = time.monotonic()
        shard = first.removeprefix("detect-")
        detectors.append(f"detect-{shard}-again")
        fleet.start(detectors[-1], "detect", "--shard", f"{shard}/2")
        other = next(n for n in detectors[:2] if n != first)
        wait("the other detector taking the lead",
             lambda: other in leaders(fleet, tuple(detectors)), TAKEOVER_S + 5, fleet)  # fmt: skip
        assert time.monotonic() - killed_at <= TAKEOVER_S
        assert leaders(fleet, tuple(detectors)) == [first, other]  # the restarted one stood by

        # The second fault pages from the new leader, once; the first is not paged again.
        wait("the second page", lambda: firing_pages(sink).get(DOWN_HOSTS[1]), PAGE_S + 110, fleet)
        assert firing_pages(sink) == {DOWN_HOSTS[0]: 1, DOWN_HOSTS[1]: 1}

        # Every sample the collectors wrote is in the engine.
        for i in range(2):
            fleet.stop(f"collect-{i}")
        totals = [fleet.events(f"collect-{i}", "collector stopped")[-1] for i in range(2)]
        # Written at once, or spooled and replayed (the first batches wait while the series
        # registry fills): each sample offered to the engine once.
        offered = sum(t["written"] + t["replayed"] for t in totals)
        assert offered > 0 and all(t["rejected"] == 0 for t in totals), totals

        def counted() -> bool:
            stored = engine_samples(engine)
            assert stored <= offered, f"the engine holds {stored} samples, {offered} offered"
            return stored == offered

        wait("every sample offered counted in the engine", counted, 60, fleet)
        sharded = open_incidents(url)
        assert {dict(scope).get("host") for _, scope in sharded} >= set(DOWN_HOSTS), sharded

        # An API process of its own answers from PostgreSQL and the engine.
        port = free_port()
        fleet.start("serve", "serve", "--port", str(port))
        api = f"http://127.0.0.1:{port}"
        wait("the API serving", lambda: _get(api + "/healthz") is not None, START_S, fleet)
        items = _get(api + "/api/v1/incidents")["items"]
        assert {i["title"] for i in items} == {title for title, _ in sharded}
        answer = _get(api + "/prometheus/api/v1/query?query=count(gpu_power_watts)")
        truth = json.loads((tmp_path / "truth.json").read_text())
        assert answer["data"]["result"][0]["value"][1] == str(truth["gpus"])
        fleet.stop("serve")
        for name in detectors[1:]:
            fleet.stop(name)

        # One detector process over the same samples opens the same incidents.
        alone = {"HBMWATCH_STORE__URL": single_url, "HBMWATCH_ALERTS__RECEIVERS": "[]",
                 "HBMWATCH_DETECTION__BACKFILL_SECONDS": "900"}  # fmt: skip
        fleet.start("detect-single", "detect", **alone)
        wait("the single process's incidents", lambda: open_incidents(single_url) == sharded,
             120, fleet)  # fmt: skip
