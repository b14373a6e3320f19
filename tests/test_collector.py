"""The scrape engine, spool and targets against real HTTP servers and real stores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from hbmwatch.collector.engine import BatchingSink, ScrapeEngine
from hbmwatch.collector.spool import CorruptBatch, Spool, decode_batch, encode_batch
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.collector.writer import SpoolingWriter
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import CollectorSettings, TargetSettings
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict
from hbmwatch.simulator.server import SimServer
from hbmwatch.store.store import Store, StoreUnavailable, WriteResult
from tests.conftest import Clock, make_store


class PageServer:
    """A real HTTP server on 127.0.0.1 answering each path with a callable's page."""

    def __init__(self, routes: dict[str, Callable[[], tuple[int, bytes] | None]]) -> None:
        self.routes = routes
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> PageServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # a stopped process drops its connections too
            writer.close()
        await self.server.wait_closed()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                answer = self.routes[path]()
                if answer is None:  # hang: the scrape must time out
                    await asyncio.sleep(30)
                    return
                status, body = answer
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
                await writer.drain()
        writer.close()


def engine_for(
    store: Store,
    targets: list[Target],
    tmp_path: Path,
    clock: Callable[[], float],
    **settings: object,
) -> ScrapeEngine:
    cfg = CollectorSettings(**settings)  # type: ignore[arg-type]
    spool = Spool(tmp_path / "spool", cfg.spool_max_bytes)
    sink = BatchingSink(
        SpoolingWriter(store.write, spool, retry_seconds=0.0), cfg.flush_samples, cfg.flush_seconds
    )
    return ScrapeEngine(
        TargetSet(cfg, targets), sink, cfg, clock=clock, inventory=store.upsert_devices
    )


def small_fleet() -> dict:
    return {
        "name": "t",
        "duration": "2h",
        "seed": 2,
        "racks": [
            {"name": "r0", "nodes": 1, "sku": "MI300X"},
            {"name": "r1", "nodes": 1, "sku": "H200", "dcgm_names": "old"},
            {"name": "r2", "nodes": 1, "sku": "H100"},
        ],
        "workload": {"training": [{"name": "job", "racks": ["r2"]}]},
    }


@contextlib.asynccontextmanager
async def simulated(
    start: float, **extra: object
) -> AsyncIterator[tuple[Simulation, list[Target]]]:
    sim = Simulation(scenario_from_dict({**small_fleet(), **extra}), start_unix=start)
    server = SimServer(sim, speed=1.0)
    served = await server.start()
    try:
        yield sim, [Target(t.kind, t.url, t.labels, 1.0, 5.0) for t in served]
    finally:
        await server.close()


def scrape_rounds(
    store: Store,
    tmp_path: Path,
    seconds: int,
    clock: Clock,
    between: Callable[[int], None] | None = None,
    **extra: object,
) -> ScrapeEngine:
    """Step the simulation a second at a time and scrape every target at each step."""

    async def run() -> ScrapeEngine:
        async with simulated(clock.now - seconds - 5, **extra) as (sim, targets):
            engine = engine_for(store, targets, tmp_path, lambda: sim.now_unix)
            async with engine:
                for i in range(seconds):
                    sim.step()
                    clock.now = sim.now_unix + 5
                    if between:
                        between(i)
                    await engine.scrape_round(int(sim.now_unix * 1000))
                    await engine.sink.flush()
            return engine

    return asyncio.run(run())


# -- end to end ----------------------------------------------------------------------------------
def test_sixty_seconds_of_the_simulator_store_every_family(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    engine = scrape_rounds(store, tmp_path, 60, clock)
    families = {key.metric for key in store.series_registry.keys.values()}
    expected = {
        "gpu_hotspot_temperature_celsius",
        "gpu_memory_temperature_celsius",
        "gpu_hbm_stack_temperature_celsius",
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_energy_joules_total",
        "gpu_clock_hertz",
        "gpu_utilization_ratio",
        "gpu_memory_bandwidth_utilization_ratio",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_throttle_seconds_total",
        "gpu_throttle_active",
        "gpu_fabric_bytes_total",
        "gpu_fabric_errors_total",
        "gpu_pcie_replays_total",
        "gpu_pcie_recoveries_total",
        "gpu_pcie_naks_total",
        "gpu_pcie_link_speed_transfers_per_second",
        "gpu_ecc_errors_total",
        "workload_latency_seconds",
        "workload_latency_resolution_seconds",
        "workload_window_requests",
        "workload_requests_total",
        "hbmwatch_target_up",
        "hbmwatch_scrape_duration_seconds",
        "hbmwatch_scrape_samples",
    }
    assert expected <= families, expected - families
    assert engine.sink.totals.rejected == 0
    # every scrape of a GPU series landed: 60 rounds, 60 samples
    selector = parse_selector('gpu_power_watts{host="r1-node0",gpu="3"}')
    count = store.range_query(selector, clock.now - 3600, clock.now + 60, 3600, Aggregation.COUNT)
    assert sum(p.value for p in count.series[0].points) == 60
    p99 = store.latest(parse_selector('workload_latency_seconds{quantile="0.99",phase="e2e"}'))
    assert p99 and all(0.3 < v.value < 60 for v in p99)
    assert len(store.devices()) == 24


def test_store_outage_mid_run_loses_nothing_sqlite(tmp_path: Path, clock: Clock) -> None:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", clock, sqlite_busy_timeout_seconds=0.1)
    lock: list[sqlite3.Connection] = []

    def outage(i: int) -> None:
        if i == 20:  # another process takes the database's write lock for 20 seconds
            conn = sqlite3.connect(db, timeout=1, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            lock.append(conn)
        if i == 40:
            lock.pop().execute("COMMIT")

    engine = scrape_rounds(store, tmp_path, 60, clock, outage)
    assert engine.sink.totals.spooled > 0 and engine.sink.totals.replayed > 0
    assert engine.sink.writer.spool.pending() == 0
    selector = parse_selector('gpu_power_watts{host="r0-node0",gpu="1"}')
    count = store.range_query(selector, clock.now - 3600, clock.now + 60, 3600, Aggregation.COUNT)
    assert sum(p.value for p in count.series[0].points) == 60
    store.close()


@pytest.mark.postgres
def test_postgres_restart_mid_run_loses_nothing(
    private_pg: dict, tmp_path: Path, clock: Clock
) -> None:
    store = make_store(private_pg["url"], clock)

    def restart(i: int) -> None:
        if i == 20:
            private_pg["stop"]()
        if i == 35:
            private_pg["start"]()

    engine = scrape_rounds(store, tmp_path, 60, clock, restart)
    assert engine.sink.totals.spooled > 0 and engine.sink.totals.replayed > 0
    assert engine.sink.writer.spool.pending() == 0
    selector = parse_selector('gpu_power_watts{host="r1-node0",gpu="5"}')
    count = store.range_query(selector, clock.now - 3600, clock.now + 60, 3600, Aggregation.COUNT)
    assert sum(p.value for p in count.series[0].points) == 60
    store.close()


def test_stopped_target_is_down_within_two_intervals(tmp_path: Path) -> None:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))
    store._clock = time.time
    interval = 0.5

    async def run() -> tuple[float, list]:
        page = {"body": b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'}
        async with PageServer({"/metrics": lambda: (200, page["body"])}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, interval, 0.3)
            engine = engine_for(store, [target], tmp_path, time.time, flush_seconds=0.05)
            stop = asyncio.Event()
            task = asyncio.create_task(engine.run(stop))
            await asyncio.sleep(2.2)
            stopped_at = time.time()
        await asyncio.sleep(3 * interval)
        stop.set()
        await task
        return stopped_at, store.latest(parse_selector("hbmwatch_target_up"), 60)

    stopped_at, latest = asyncio.run(run())
    up = store.range_query(
        parse_selector("hbmwatch_target_up"), stopped_at - 10, stopped_at + 10, 0.5, Aggregation.MIN
    )
    points = up.series[0].points
    first_down = next(p.timestamp for p in points if p.value == 0 and p.timestamp >= stopped_at - 1)
    assert first_down - stopped_at <= 2 * interval
    assert latest[0].value == 0.0
    assert store.latest(parse_selector("gpu_hotspot_temperature_celsius"), 0.6) == []  # stale


def test_a_cancelled_collector_ends_and_flushes_what_it_holds(tmp_path: Path) -> None:
    """A signal before the server takes over cancels the run instead of setting ``stop``."""
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))
    store._clock = time.time

    async def run() -> None:
        page = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'
        async with PageServer({"/metrics": lambda: (200, page)}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 0.2, 0.1)
            engine = engine_for(store, [target], tmp_path, time.time, flush_seconds=60)
            task = asyncio.create_task(engine.run(asyncio.Event()))  # stop is never set
            await asyncio.sleep(1.0)
            task.cancel()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)

    asyncio.run(run())
    assert store.latest(parse_selector("gpu_hotspot_temperature_celsius"), 60)  # flushed
    store.close()


# -- bad pages -------------------------------------------------------------------------------------
def test_malformed_huge_slow_and_exploding_pages(tmp_path: Path, clock: Clock) -> None:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", clock)
    good = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'
    pages: dict[str, Callable[[], tuple[int, bytes] | None]] = {
        "/bad": lambda: (200, (good + "garbage line {\n" + good.replace("40", "41")).encode()),
        "/huge": lambda: (200, b"#" * (3 * 2**20)),
        "/slow": lambda: None,
        "/500": lambda: (500, b"oops"),
        "/explode": lambda: (
            200,
            "".join(
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",Hostname="h"}} 40\n' for i in range(30)
            ).encode(),
        ),
    }

    async def run() -> dict:
        async with PageServer(pages) as server:
            # a deadline covers the whole scrape: only the hanging page gets a short one, so
            # a busy host cannot push the others past theirs
            targets = [
                Target("dcgm", server.url(p), {"host": f"h{p}"}, 1.0, 0.5 if p == "/slow" else 30)
                for p in pages
            ]
            engine = engine_for(
                store,
                targets,
                tmp_path,
                lambda: clock.now,
                max_page_bytes=2**20,
                series_per_target=10,
            )
            async with engine:
                reports = await engine.scrape_round(int(clock.now * 1000))
            await engine.sink.flush()
            return {r.target.rsplit("/", 1)[1]: r for r in reports}

    reports = asyncio.run(run())
    assert reports["bad"].up and reports["bad"].dropped == {"malformed": 2}
    assert reports["bad"].samples == 1  # the line repeating a series is refused too
    assert not reports["huge"].up and "larger than" in reports["huge"].error
    assert not reports["slow"].up and reports["slow"].error == "deadline exceeded after 0.5 s"
    assert not reports["500"].up and "HTTP 500" in reports["500"].error
    assert reports["explode"].up and reports["explode"].dropped == {"series_cap": 20}
    down = {
        v.series.label("target").rsplit("/", 1)[1]: v.value
        for v in store.latest(parse_selector("hbmwatch_target_up"), 60)
    }
    assert down == {"bad": 1.0, "huge": 0.0, "slow": 0.0, "500": 0.0, "explode": 1.0}
    capped = store.latest(parse_selector('hbmwatch_scrape_dropped_total{reason="series_cap"}'), 60)
    assert capped[0].value == 20


# -- spool -----------------------------------------------------------------------------------------
def _samples(n: int, start: int = 0) -> list[Sample]:
    key = SeriesKey("gpu_power_watts", {"host": "h", "gpu": "0"})
    return [Sample(key, 1_000_000 + i, float(i)) for i in range(start, start + n)]


def test_spool_round_trip_order_and_bound(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_bytes=10**9)
    spool.append(_samples(3))
    spool.append(_samples(2, 3))
    seen: list[list[Sample]] = []
    assert spool.replay(seen.append) == 5
    assert [s.value for batch in seen for s in batch] == [0, 1, 2, 3, 4]
    assert spool.pending() == 0
    small = Spool(tmp_path / "small", max_bytes=300)
    for i in range(20):
        small.append(_samples(20, i * 20))
    assert small.size_bytes <= 600 and small.dropped._value.get() > 0


def test_spool_survives_a_restart_and_a_refusing_store(tmp_path: Path) -> None:
    Spool(tmp_path / "s", 10**9).append(_samples(4))
    reopened = Spool(tmp_path / "s", 10**9)
    assert reopened.pending() == 1

    def refuse(_: list[Sample]) -> None:
        raise StoreUnavailable("down")

    with pytest.raises(StoreUnavailable):
        reopened.replay(refuse)
    assert reopened.pending() == 1  # kept for next time
    (tmp_path / "s" / "999999999999.batch").write_bytes(b"not a batch")
    got: list[Sample] = []
    assert reopened.replay(got.extend) == 4
    assert list((tmp_path / "s").glob("*.corrupt"))


def test_writer_queues_behind_the_spool_to_keep_order(tmp_path: Path) -> None:
    written: list[float] = []
    state = {"up": False}

    def write(samples: list[Sample]) -> WriteResult:
        if not state["up"]:
            raise StoreUnavailable("down")
        written.extend(s.value for s in samples)
        return WriteResult(received=len(samples), accepted=len(samples))

    writer = SpoolingWriter(write, Spool(tmp_path / "s", 10**9), retry_seconds=0.0)
    assert writer.write(_samples(2)).spooled == 2
    state["up"] = True
    done = writer.write(_samples(2, 2))
    assert done.replayed == 2 and done.accepted == 2
    assert written == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "blob", [b"", b"\x1f\x8b junk", encode_batch(_samples(1))[:-3]], ids=["empty", "junk", "cut"]
)
def test_spool_rejects_damaged_batches(blob: bytes) -> None:
    with pytest.raises(CorruptBatch):
        decode_batch(blob)


# -- targets ---------------------------------------------------------------------------------------
def test_target_file_reload_and_bad_file_keeps_last(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text(
        json.dumps([{"kind": "dme", "url": "http://127.0.0.1:1/metrics", "labels": {"rack": "r1"}}])
    )
    targets = TargetSet(
        CollectorSettings(
            target_file=str(path), targets=[TargetSettings(kind="vllm", url="http://x/metrics")]
        )
    )
    assert {t.kind for t in targets.current()} == {"dme", "vllm"}
    time.sleep(0.01)
    path.write_text(
        json.dumps(
            [
                {"kind": "dcgm", "url": "http://127.0.0.1:2/metrics"},
                {"kind": "dme", "url": "http://127.0.0.1:1/metrics"},
            ]
        )
    )
    assert {t.kind for t in targets.current()} == {"dme", "dcgm", "vllm"}
    path.write_text('[{"kind": "nvidia", "url": "x"}]')
    assert len(targets.current()) == 3
    assert "targets[0].kind" in (targets.last_error or "")
    toml = tmp_path / "targets.toml"
    toml.write_text(
        '[[targets]]\nkind = "vllm"\nurl = "http://h:8000/metrics"\n'
        'labels = { service = "chat", host = "h", gpu = "1" }\n'
    )
    assert TargetSet(CollectorSettings(target_file=str(toml))).current()[0].labels["gpu"] == "1"
