"""`/readyz` follows the collector's real scrapes, under `run` and `hbmwatch up` (issue 12.16).

Readiness used to read ``last_round_ms``, which only ``scrape_round`` (tests) kept, and a
15 s start-up grace hid that: ``hbmwatch up`` was ready for 15 s, then 503 for ever.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from hbmwatch.api.main import create_app
from hbmwatch.collector.targets import Target
from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.status import ServiceStatus
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_collector import PageServer, engine_for
from tests.test_service import HBMWATCH, clean_env, free_port

PAGE = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'


def test_run_keeps_last_round_fresh(tmp_path: Path) -> None:
    """``ScrapeEngine.run`` (what ``hbmwatch up`` runs) moves ``last_round_ms`` on."""
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))

    async def run() -> list[int]:
        async with PageServer({"/metrics": lambda: (200, PAGE)}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 0.2, 30)
            engine = engine_for(store, [target], tmp_path, time.time)
            stop = asyncio.Event()
            task = asyncio.create_task(engine.run(stop))
            seen: list[int] = []
            deadline = time.monotonic() + 60
            while len(set(seen) - {0}) < 2 and time.monotonic() < deadline:
                seen.append(engine.last_round_ms)
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(task, 60)
            return seen

    seen = asyncio.run(run())
    store.close()
    rounds = sorted(set(seen) - {0})
    assert len(rounds) >= 2, "last_round_ms never moved under run()"
    assert abs(rounds[-1] / 1000 - time.time()) < 60


def test_not_ready_until_a_scrape_finished(tmp_path: Path) -> None:
    """No start-up grace: a collector that has not finished a scrape is not ready."""
    store: Store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))
    last = {"ms": 0}
    status = ServiceStatus(collector_last_round_ms=lambda: last["ms"])
    settings = Settings(store=StoreSettings(url=store.settings.url))
    with TestClient(create_app(settings, store, status=status)) as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["collector"] == "no scrape finished yet"
        last["ms"] = int(time.time() * 1000)
        assert client.get("/readyz").json()["checks"]["collector"] == "ok"
    store.close()


@pytest.mark.slow
def test_up_becomes_ready_and_stays_ready(tmp_path: Path) -> None:
    """``hbmwatch up`` turns ready, and is still ready after the old 15 s grace lapsed."""
    port = free_port()
    env = clean_env(
        HBMWATCH_API__PORT=str(port),
        HBMWATCH_SIMULATOR__BASE_PORT="0",
        HBMWATCH_STORE__URL=f"sqlite:///{tmp_path / 'hbmwatch.db'}",
    )
    proc = subprocess.Popen([*HBMWATCH, "up"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    started = time.monotonic()
    base = f"http://127.0.0.1:{port}"
    answers: list[tuple[float, int, str]] = []
    try:
        # Ready within 120 s; then keep asking until 20 s after start (past the 15 s grace).
        deadline = started + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"hbmwatch up exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                r = httpx.get(f"{base}/readyz", timeout=5)
                answers.append((time.monotonic() - started, r.status_code, r.text))
            except httpx.HTTPError:
                pass
            ready_at = next((t for t, code, _ in answers if code == 200), None)
            if ready_at is not None and answers[-1][0] > max(20.0, ready_at + 5):
                break
            time.sleep(0.25)
        ready_at = next((t for t, code, _ in answers if code == 200), None)
        assert ready_at is not None, answers[-1:]
        after = [(t, code, text) for t, code, text in answers if t >= ready_at]
        assert after[-1][0] > 20.0
        assert all(code == 200 for _, code, _ in after), [a for a in after if a[1] != 200][:1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
