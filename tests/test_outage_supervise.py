"""Loops that outlive their errors, and findings that outlive an outage (issue 12, point 1)."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hbmwatch.records import Finding, Severity
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.runtime.supervise import FatalError, exits_on_fatal, supervise
from hbmwatch.store.store import SchemaOutdated, StoreUnavailable
from tests.conftest import NOW, REPO, Clock, make_store


def test_a_failing_loop_is_restarted_with_growing_pauses() -> None:
    starts: list[float] = []

    async def flaky() -> None:
        starts.append(time.monotonic())
        if len(starts) <= 3:
            raise (StoreUnavailable if len(starts) % 2 else RuntimeError)("boom")

    async def main() -> None:
        await asyncio.wait_for(
            supervise("flaky", flaky, asyncio.Event(), first_backoff=0.05), timeout=60
        )

    asyncio.run(main())
    assert len(starts) == 4  # three failures, then a run that ended by itself
    pauses = [b - a for a, b in itertools.pairwise(starts)]
    assert pauses[0] >= 0.05 and pauses[1] >= 0.1 and pauses[2] >= 0.2


def test_a_stop_ends_the_pause_at_once() -> None:
    async def broken() -> None:
        raise RuntimeError("always")

    async def main() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(supervise("broken", broken, stop, first_backoff=3600))
        await asyncio.sleep(0)
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, timeout=60)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5


def test_a_fatal_error_ends_the_service_with_status_1() -> None:
    async def outdated() -> None:
        raise SchemaOutdated("the database schema is at nothing: run hbmwatch migrate")

    async def main() -> None:
        stop = asyncio.Event()
        with exits_on_fatal():
            async with asyncio.TaskGroup() as group:
                group.create_task(supervise("maintenance", outdated, stop))
                group.create_task(stop.wait())  # a loop that would run forever

    with pytest.raises(SystemExit) as exited:
        asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert exited.value.code == 1
    assert isinstance(FatalError("x"), Exception)


def finding(i: int) -> Finding:
    return Finding(
        id=f"f{i}", fingerprint=f"fp{i}", kind="thermal", severity=Severity.WARNING,
        detector="thermal", entity={"host": "h", "gpu": str(i)}, summary="hot",
        started_ms=int(NOW * 1000), raised_ms=int(NOW * 1000), updated_ms=int(NOW * 1000),
    )  # fmt: skip


def test_findings_an_outage_refused_are_written_with_the_next_cycle(
    tmp_path: Path, clock: Clock
) -> None:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", clock, sqlite_busy_timeout_seconds=0.1)
    runner = DetectionRunner(store, [])
    other = sqlite3.connect(db, timeout=1, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        runner._save_findings({"f1": finding(1)})  # the cycle goes on; nothing raised
        assert set(runner.unsaved) == {"f1"}
        other.execute("COMMIT")
        runner._save_findings({"f2": finding(2)})
        assert runner.unsaved == {}
        assert {f.id for f in store.findings.query(open_only=True)} == {"f1", "f2"}
    finally:
        other.close()
        store.close()


def test_a_thread_stuck_at_exit_cannot_hang_the_process() -> None:
    """The hang of issue 12: interpreter shutdown waiting forever on a stuck worker thread."""
    code = (
        "import threading, sys\n"
        "from hbmwatch.runtime.supervise import exit_deadline\n"
        "threading.Thread(target=threading.Event().wait).start()  # stuck, not a daemon\n"
        "exit_deadline(1.0)\n"
        "sys.exit(0)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "shutdown did not finish in time" in done.stdout + done.stderr
    assert time.monotonic() - started < 60
