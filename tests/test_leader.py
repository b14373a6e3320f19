"""One alert leader among real ``hbmwatch detect`` processes, elected in PostgreSQL.

Two candidates run the real CLI over one PostgreSQL schema, delivering to a real
Alertmanager whose webhook is a recording sink.  Findings are written straight into the
store, as a detector shard would.  The leader is killed with SIGKILL right after a page,
and the record of that page's delivery is erased as if it died between sending and
recording; the other candidate must lead within 30 s, page a finding raised after the kill,
and the sink must see each page exactly once: the new leader's re-send of the first is the
same alert to Alertmanager, which does not notify it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from hbmwatch.detectors.base import make_finding
from hbmwatch.records import Finding, Severity
from hbmwatch.runtime import leader
from hbmwatch.runtime.leader import AlertLeader, FindingFeed
from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.findings import FindingLog
from hbmwatch.store.leader import AdvisoryLock, OnlyProcess, leader_lock
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store, open_store
from tests.alertmanager import WebhookSink, free_port, running_alertmanager

TAKEOVER_S = 30.0


def _finding(host: str, rack: str) -> Finding:
    now = int(time.time() * 1000)
    return make_finding(
        kind="thermal_excursion", detector="thermal", severity=Severity.CRITICAL,
        entity={"cluster": "c0", "rack": rack, "host": host, "gpu": "0", "sku": "H200"},
        summary=f"HBM at 97 C on {host}", started_ms=now, raised_ms=now, updated_ms=now,
    )  # fmt: skip


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Candidate:
    """``hbmwatch detect --shard i/2`` with its /metrics, for the leader gauge."""

    def __init__(self, config: Path, shard: str, folder: Path) -> None:
        self.port = free_port()
        self.log_path = folder / f"detect-{shard.replace('/', 'of')}.log"
        args = [sys.executable, "-m", "hbmwatch.cli", "detect", "--config", str(config),
                "--shard", shard, "--metrics-port", str(self.port)]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def leads(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"candidate exited {self.process.returncode}:\n{self.log()}")
        try:
            page = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return False
        return "hbmwatch_alert_leader 1.0" in page

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@contextlib.contextmanager
def candidates(config: Path, folder: Path) -> Iterator[list[Candidate]]:
    running = [Candidate(config, f"{i}/2", folder) for i in range(2)]
    try:
        yield running
    finally:
        for c in running:
            c.stop()


def _pages(sink: WebhookSink) -> Counter[str]:
    """Firing notifications per alert (Alertmanager's fingerprint of its labels)."""
    seen: Counter[str] = Counter()
    for body in sink.bodies("/am"):
        for alert in body.get("alerts", []):
            if alert.get("status") == "firing":
                seen[alert["labels"].get("host", "") + "|" + alert["fingerprint"]] += 1
    return seen


def _paged(sink: WebhookSink, host: str) -> int:
    return sum(n for key, n in _pages(sink).items() if key.startswith(host + "|"))


@pytest.mark.postgres
@pytest.mark.slow
def test_leader_dies_and_another_pages_each_alert_once(pg_schema_url: str, tmp_path: Path) -> None:
    engine = create_store_engine(pg_schema_url)
    upgrade(engine)
    findings = FindingLog(engine)
    with (
        WebhookSink() as sink,
        running_alertmanager(
            tmp_path, sink.url + "/am", group_wait="1s", group_interval="1s"
        ) as am,
    ):
        config = tmp_path / "hbmwatch.toml"
        config.write_text(
            f'[store]\nurl = "{pg_schema_url}"\n'
            "[detection]\ninterval_seconds = 1.0\n"
            f'[[alerts.receivers]]\nname = "am"\nkind = "alertmanager"\nurl = "{am.url}"\n'
        )
        with candidates(config, tmp_path) as both:
            leader = _wait("a leader", lambda: next((c for c in both if c.leads()), None))
            assert sum(c.leads() for c in both) == 1, "exactly one leads"

            findings.save([_finding("h1", "r0")])
            _wait("the first page", lambda: _paged(sink, "h1"))

            os.kill(leader.process.pid, signal.SIGKILL)
            leader.process.wait(timeout=60)
            with engine.begin() as conn:  # as if it died between sending and recording
                conn.execute(text("DELETE FROM alert_deliveries"))
            findings.save([_finding("h2", "r1")])
            other = next(c for c in both if c is not leader)
            t0 = time.monotonic()
            _wait("the other candidate to lead", other.leads, timeout=TAKEOVER_S)
            took = time.monotonic() - t0
            _wait("the page raised after the kill", lambda: _paged(sink, "h2"))

            def resent() -> bool:  # the new leader re-sent h1 to Alertmanager: it holds it again
                return any(
                    a["labels"].get("host") == "h1" and a["status"]["state"] == "active"
                    for a in am.alerts()
                ) and _delivered(engine, "h1")

            _wait("the new leader's re-send of the first page", resent)
            observe = time.monotonic() + 3.0  # Alertmanager's group_interval is 1 s
            while time.monotonic() < observe:
                assert _paged(sink, "h1") <= 1, "the first page was sent twice"
                time.sleep(0.2)
            assert "alert leader acquired" in other.log()
    pages = _pages(sink)
    assert sorted(k.split("|")[0] for k in pages) == ["h1", "h2"], pages
    assert set(pages.values()) == {1}, f"each alert paged once: {pages}"
    assert took < TAKEOVER_S
    engine.dispose()


def _delivered(engine: Any, host: str) -> bool:
    """Whether a delivery of the alert on ``host`` is recorded (the new leader's)."""
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM alert_deliveries d JOIN alerts a ON a.id = d.alert_id "
                "WHERE a.labels ->> 'host' = :host AND d.sent_state = 'firing'"
            ),
            {"host": host},
        ).scalar()
    return bool(n)


@pytest.mark.postgres
def test_one_lock_holder_and_release_on_death(pg_schema_url: str) -> None:
    """The lock is one session's; when that session dies (as with kill -9), another wins."""
    first, second = AdvisoryLock(pg_schema_url), AdvisoryLock(pg_schema_url)
    try:
        assert first.try_acquire() and first.held()
        assert not second.try_acquire()
        engine = create_store_engine(pg_schema_url)
        with engine.begin() as conn:  # the server ends the holder's session
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks "
                    "WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
                    " AND objid = (hashtextextended('hbmwatch alert leader:' "
                    "|| current_schema(), 0) & 4294967295)::oid"
                )
            )
        engine.dispose()
        _wait("the holder to notice", lambda: not first.held())
        assert second.try_acquire() and second.held()
        second.release()
        assert not second.held()
        assert first.try_acquire()
    finally:
        first.close()
        second.close()


def test_feed_hands_each_statement_over_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'feed.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    store = open_store(StoreSettings(url=url))
    try:
        a, b = _finding("h1", "r0"), _finding("h2", "r1")
        store.findings.save([a])
        feed = FindingFeed(store)
        assert [f.id for f in feed.first()] == [a.id]
        feed.taken([a])
        assert feed.next() == []
        later = dataclasses.replace(a, updated_ms=a.updated_ms + 1000, summary="hotter")
        store.findings.save([later, b])
        assert {f.id: f.summary for f in feed.next()} == {a.id: "hotter", b.id: b.summary}
        feed.taken(feed.next())
        assert feed.next() == []
        assert FindingFeed(store).cursor_ms == later.updated_ms  # a new leader resumes there
    finally:
        store.close()


def test_sqlite_process_leads_alone() -> None:
    lock = leader_lock("sqlite:///x.db")
    assert isinstance(lock, OnlyProcess) and lock.try_acquire() and lock.held()


class Election:
    """The advisory lock in memory: whoever tries first while it is free holds it."""

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder
        self.tries: list[str] = []
        self._mutex = threading.Lock()

    def seat(self, name: str) -> Seat:
        return Seat(self, name)

    def try_acquire(self, name: str) -> bool:
        with self._mutex:
            self.tries.append(name)
            if self.holder is None:
                self.holder = name
            return self.holder == name


@dataclasses.dataclass
class Seat:
    """One candidate's ``LeaderLock`` in an ``Election``."""

    election: Election
    name: str

    def try_acquire(self) -> bool:
        return self.election.try_acquire(self.name)

    def held(self) -> bool:
        return self.election.holder == self.name

    def release(self) -> None:
        if self.held():
            self.election.holder = None


def _sqlite_store(tmp_path: Path) -> tuple[Store, Settings]:
    url = f"sqlite:///{tmp_path / 'leader.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    settings = Settings(store=StoreSettings(url=url))
    return open_store(settings.store), settings


async def _until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_restarted_leader_does_not_win_the_lock_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader dies and is started again at once, just after the surviving candidate's
    try: the survivor's next try, one poll later, must win, not the newcomer's first."""
    monkeypatch.setattr(leader, "POLL_SECONDS", 0.2)
    monkeypatch.setattr(leader, "STANDBY_SECONDS", 3.0, raising=False)  # 15 polls of margin
    store, settings = _sqlite_store(tmp_path)
    election = Election(holder="old")

    async def scenario() -> str | None:
        stop = asyncio.Event()
        survivor = AlertLeader(store, settings, lock=election.seat("survivor"))
        tasks = [asyncio.create_task(survivor.run(stop))]
        await _until("the survivor's first try", lambda: "survivor" in election.tries)
        election.holder = None  # kill -9: the old leader's session ends, the lock is free
        restarted = AlertLeader(store, settings, lock=election.seat("restarted"))
        tasks.append(asyncio.create_task(restarted.run(stop)))
        await _until("a new leader", lambda: election.holder is not None)
        new_leader = election.holder
        stop.set()
        await asyncio.gather(*tasks)
        return new_leader

    try:
        assert asyncio.run(scenario()) == "survivor"
        assert "restarted" not in election.tries  # it stood by while the survivor took over
    finally:
        store.close()


def test_a_lone_sqlite_process_leads_without_standing_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite there is no one to yield to: the standby would only delay its pages."""
    monkeypatch.setattr(leader, "STANDBY_SECONDS", 3600.0)
    store, settings = _sqlite_store(tmp_path)

    async def scenario() -> None:
        stop = asyncio.Event()
        alone = AlertLeader(store, settings, lock=leader_lock(settings.store.url))
        task = asyncio.create_task(alone.run(stop))
        await _until("the lone process leading", lambda: alone.alerting is not None)
        stop.set()
        await task

    try:
        asyncio.run(scenario())
    finally:
        store.close()
