"""`hbmwatch up` and `hbmwatch collect` as people run them, while the store goes away (issue 12).

Real processes, a real PostgreSQL that the test stops and starts (``private_pg``), a real
SQLite file another connection locks.  "Nothing lost" is checked by counting: every scrape
writes one ``hbmwatch_target_up`` sample, so the store must hold at least as many as the
collector's own scrape counter said before the stop.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.settings import StoreSettings
from hbmwatch.store.store import open_store
from tests.test_service import HBMWATCH, clean_env, free_port

DEADLINE = 120.0


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert proc.poll() is None, f"exited while waiting for {what}: {output(proc)}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE:.0f} s"
        time.sleep(0.2)


#: Each process's log file: a pipe nobody reads would fill and stop the process.
LOGS: dict[int, Path] = {}


def output(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    return LOGS[proc.pid].read_text()[-4000:]


def metric(base: str, name: str, **labels: str) -> float:
    """The sum of one family's samples on /metrics (matching ``labels``)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def stored_scrapes(url: str) -> float:
    """``hbmwatch_target_up`` samples in the store: one per scrape."""
    store = open_store(StoreSettings(url=url))
    try:
        now = time.time()
        q = store.range_query(parse_selector("hbmwatch_target_up"), now - 7200, now + 600,
                              3600, Aggregation.COUNT)  # fmt: skip
        return sum(p.value for s in q.series for p in s.points)
    finally:
        store.close()


def start(tmp_path: Path, url: str, *args: str, **env: str) -> subprocess.Popen[str]:
    migrate = subprocess.run([*HBMWATCH, "migrate"], cwd=tmp_path, env=clean_env(
        HBMWATCH_STORE__URL=url), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr
    log = tmp_path / f"{args[0]}-{len(LOGS)}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*HBMWATCH, *args],
            cwd=tmp_path,
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(HBMWATCH_STORE__URL=url, HBMWATCH_SIMULATOR__BASE_PORT="0", **env),
        )
    LOGS[proc.pid] = log
    return proc


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Callable[..., tuple[str, subprocess.Popen[str]]]]:
    procs: list[subprocess.Popen[str]] = []

    def run(url: str, **env: str) -> tuple[str, subprocess.Popen[str]]:
        # A free port can be taken by another process (the other test worker's) before
        # ``up`` binds it: then it exits saying so, and gets another.
        for _ in range(3):
            port = free_port()
            proc = start(tmp_path, url, "up", HBMWATCH_API__PORT=str(port), **env)
            procs.append(proc)
            base = f"http://127.0.0.1:{port}"

            def scraping(base: str = base) -> bool:
                try:
                    return metric(base, "hbmwatch_collector_scrapes_total") > 0
                except httpx.HTTPError:
                    return False

            try:
                wait_for("scrapes", scraping, proc)
            except AssertionError:
                if "address already in use" in output(proc):
                    continue
                raise
            return base, proc
        raise AssertionError("no free port for the API in three tries")

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def stop_and_check(proc: subprocess.Popen[str], url: str, scrapes: float) -> None:
    """SIGTERM: a prompt exit 0, and every scrape counted before it is in the store."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 60 s of SIGTERM: {output(proc)}")
    assert code == 0, output(proc)
    assert scrapes > 0
    assert stored_scrapes(url) >= scrapes, output(proc)


@pytest.mark.slow
@pytest.mark.postgres
def test_up_survives_a_postgres_outage_and_loses_no_scrape(up: Callable, private_pg: dict) -> None:
    base, proc = up(private_pg["url"])
    private_pg["stop"]()
    try:
        wait_for("spooled batches", lambda: metric(base, "hbmwatch_spool_batches") >= 3, proc)
        during = metric(base, "hbmwatch_collector_scrapes_total")
        started = time.monotonic()
        # Prompt even on a busy machine; before, it waited on the store (60 s on a lock).
        assert httpx.get(f"{base}/healthz", timeout=15).json() == {"status": "ok"}
        assert time.monotonic() - started < 15
        r = httpx.get(f"{base}/api/v1/query", params={"query": "hbmwatch_target_up"}, timeout=30)
        assert r.status_code == 503 and r.headers["Retry-After"], r.text
        wait_for(  # scraping goes on: at least two more rounds of every target
            "scrapes during the outage",
            lambda: metric(base, "hbmwatch_collector_scrapes_total") >= during * 1.5,
            proc,
        )
    finally:
        private_pg["start"]()
    wait_for("the spool to drain", lambda: metric(base, "hbmwatch_spool_batches") == 0, proc)
    assert metric(base, "hbmwatch_spool_dropped_samples_total") == 0
    stop_and_check(proc, private_pg["url"], metric(base, "hbmwatch_collector_scrapes_total"))


@pytest.mark.slow
def test_up_spools_while_another_process_holds_the_sqlite_lock(
    up: Callable, tmp_path: Path
) -> None:
    db = tmp_path / "hbmwatch.db"
    url = f"sqlite:///{db}"
    base, proc = up(url, HBMWATCH_DETECTION__ENABLED="false")
    other = sqlite3.connect(db, timeout=60, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        wait_for("spooled batches", lambda: metric(base, "hbmwatch_spool_batches") >= 3, proc)
        started = time.monotonic()
        # Prompt even on a busy machine; before, it waited on the store (60 s on a lock).
        assert httpx.get(f"{base}/healthz", timeout=15).json() == {"status": "ok"}
        assert time.monotonic() - started < 15
    finally:
        other.execute("COMMIT")
        other.close()
    wait_for("the spool to drain", lambda: metric(base, "hbmwatch_spool_batches") == 0, proc)
    stop_and_check(proc, url, metric(base, "hbmwatch_collector_scrapes_total"))


@pytest.mark.slow
def test_sigterm_flushes_the_batch_up_holds_in_memory(up: Callable, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    # Samples wait a minute before they are written: all of them are in memory at the stop.
    base, proc = up(url, HBMWATCH_COLLECTOR__FLUSH_SECONDS="60",
                    HBMWATCH_DETECTION__ENABLED="false")  # fmt: skip
    stop_and_check(proc, url, metric(base, "hbmwatch_collector_scrapes_total"))


@pytest.mark.slow
def test_sigterm_flushes_the_batch_collect_holds_in_memory(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    sim = subprocess.Popen(
        [*HBMWATCH, "sim", "healthy", "--port", "0", "--targets", str(targets),
         "--truth", str(tmp_path / "truth.json")],
        cwd=tmp_path, env=clean_env(), text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    try:
        wait_for("the simulator's targets", lambda: targets.exists() and bool(
            targets.read_text().strip()), sim)  # fmt: skip
        listed = json.loads(targets.read_text())
        proc = start(tmp_path, url, "collect", "--targets", str(targets),
                     HBMWATCH_COLLECTOR__FLUSH_SECONDS="60")  # fmt: skip
        log = LOGS[proc.pid]
        # `collect` serves no /metrics; its log says when each target answered a first scrape.
        wait_for("a scrape of every target",
                 lambda: log.read_text().count("target up") >= len(listed), proc)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
        assert stored_scrapes(url) >= len(listed), log.read_text()[-4000:]
    finally:
        sim.kill()
        sim.wait(30)
