"""Start-up is quiet: exporters that answer late are "not yet up", not a target-down page.

The real path, on a stepped clock: real HTTP exporters (one whose port is closed until it
starts 40 s in, one answering 503 while it loads, one up from the start that later dies),
the real scrape engine writing ``hbmwatch_target_up`` to a real store, and the detection
runner reading it back.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from hbmwatch.collector.targets import Target
from hbmwatch.detectors.quality import DataQuality
from hbmwatch.records import Finding
from hbmwatch.runtime.detection import DetectionRunner
from tests.conftest import Clock, make_store
from tests.test_collector import PageServer, engine_for

PAGE = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start_late(port: int) -> asyncio.Server:
    """An exporter process that finally listens on ``port``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n"
            writer.write(head.encode() + PAGE)
            await writer.drain()

    return await asyncio.start_server(answer, "127.0.0.1", port)


def _target_downs(tmp_path: Path, *, seconds: int, dies_at: int) -> tuple[int, list[Finding]]:
    """Scrape three exporters once a (simulated) second, detect every 5 s: the run's start
    (ms) and its target-down findings."""
    clock = Clock()
    t0 = clock.now
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", clock)
    runner = DetectionRunner(store, [DataQuality()], settle_seconds=0, clock=clock)
    runner.start()
    port = _free_port()
    loading = {"until": t0 + 30}
    state = {"alive": True}

    async def run() -> list[Finding]:
        late: asyncio.Server | None = None
        routes = {
            "/loading": lambda: (503, b"loading") if clock.now < loading["until"] else (200, PAGE),
            "/dies": lambda: (200, PAGE) if state["alive"] else (503, b"gone"),
        }
        async with PageServer(routes) as server:
            targets = [
                Target("dcgm", f"http://127.0.0.1:{port}/metrics", {"host": "late"}, 1.0, 2.0),
                Target("dcgm", server.url("/loading"), {"host": "loading"}, 1.0, 2.0),
                Target("dcgm", server.url("/dies"), {"host": "dies"}, 1.0, 2.0),
            ]
            engine = engine_for(store, targets, tmp_path, clock)
            found: list[Finding] = []
            async with engine:
                for i in range(seconds):
                    if i == 40:
                        late = await _start_late(port)
                    state["alive"] = i < dies_at
                    await engine.scrape_round(int(clock.now * 1000))
                    await engine.sink.flush()
                    clock.advance(1)
                    if i % 5 == 4:
                        found += runner.cycle().findings
            if late is not None:
                late.close()
                await late.wait_closed()
            return found

    try:
        found = asyncio.run(run())
    finally:
        store.close()
    return int(t0 * 1000), [f for f in found if f.entity.get("check") == "target_down"]


@pytest.mark.slow
def test_late_exporters_at_start_raise_no_target_down_and_a_dead_one_still_does(
    tmp_path: Path,
) -> None:
    t0, found = _target_downs(tmp_path, seconds=100, dies_at=80)
    assert {f.entity["host"] for f in found} == {"dies"}, [f.summary for f in found]
    first = min(found, key=lambda f: f.raised_ms)
    # As before the grace: down since its first failed scrape, raised on its second.
    assert (first.started_ms - t0, first.raised_ms - t0) == (80_000, 81_000)


def test_a_target_that_never_answered_is_not_yet_up_not_down(tmp_path: Path) -> None:
    """The collector's own state: None (not yet up) until a first answer, False only after."""
    clock = Clock()
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", clock)
    state = {"alive": False}

    async def run() -> list[bool | None]:
        routes = {"/m": lambda: (200, PAGE) if state["alive"] else (503, b"loading")}
        async with PageServer(routes) as server:
            target = Target("dcgm", server.url("/m"), {"host": "h"}, 1.0, 2.0)
            engine = engine_for(store, [target], tmp_path, clock)
            seen = []
            async with engine:
                for alive in (False, False, True, False):
                    state["alive"] = alive
                    await engine.scrape_round(int(clock.now * 1000))
                    seen.append(engine.state(target).up)
                    clock.advance(1)
            return seen

    try:
        assert asyncio.run(run()) == [None, None, True, False]
    finally:
        store.close()
