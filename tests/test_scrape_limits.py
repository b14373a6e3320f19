"""Slow, huge and exploding targets, and a failing inventory (issue 12: 2b, 7, 8).

Every target here is a real HTTP server on 127.0.0.1 and every store a real SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import sqlite3
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry

import hbmwatch.collector.engine as engine_module
from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.limits import (
    LimitExceeded,
    check_sample_limit,
    count_samples,
    drop_long_labels,
)
from hbmwatch.collector.scrape import OFFLOAD_BYTES, TargetState
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.collector.writer import BatchingSink, SpoolingWriter
from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.runtime.service import tune_gc
from hbmwatch.settings import CollectorSettings
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_collector import PageServer

GOOD = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h"} 40\n'


def refreshing(body: Callable[[], str]) -> Callable[[], tuple[int, bytes]]:
    """An exporter that refreshes at every scrape: the same series, a new reading each time
    (an unchanged page is not stored again: collector/refresh.py)."""
    n = itertools.count()
    return lambda: (200, body().replace(" 40\n", f" {40 + next(n) % 2}\n").encode())


def engine(
    store: Store,
    targets: list[Target],
    tmp_path: Path,
    registry: CollectorRegistry | None = None,
    inventory: Callable[[list], object] | None = None,
    **settings: object,
) -> ScrapeEngine:
    cfg = CollectorSettings(**settings)  # type: ignore[arg-type]
    spool = Spool(tmp_path / "spool", cfg.spool_max_bytes)
    writer = SpoolingWriter(store.write, spool, retry_seconds=0.0)
    sink = BatchingSink(writer, cfg.flush_samples, cfg.flush_seconds)
    return ScrapeEngine(
        TargetSet(cfg, targets),
        sink,
        cfg,
        clock=time.time,
        inventory=inventory or store.upsert_devices,
        registry=registry,
    )


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))
    store._clock = time.time
    yield store
    store.close()


class RawServer:
    """A real asyncio server on a free loopback port; subclasses answer in ``_handle``."""

    server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/metrics"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class Trickle(RawServer):
    """A real server that sends its answer a few bytes at a time, for ever.

    Every read gets bytes well inside a per-read timeout, so only a deadline on the
    whole scrape ends it.  ``stage`` picks whether the headers or the body trickle.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            if self.stage == "body":
                # under the page limit (64 MiB): a longer one is refused from the head
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(10_000):
                line = GOOD.encode() if self.stage == "body" else f"X-{i}: y\r\n".encode()
                writer.write(line)
                await writer.drain()
                await asyncio.sleep(0.05)
        writer.close()


# -- 7: a slow target meets one deadline per scrape ---------------------------------------
@pytest.mark.parametrize("stage", ["headers", "body"])
def test_trickled_page_is_down_at_its_deadline(
    stage: str, sqlite_store: Store, tmp_path: Path
) -> None:
    registry = CollectorRegistry()

    async def run() -> tuple[object, float]:
        async with Trickle(stage) as url:
            target = Target("dcgm", url, {"host": "h"}, 1.0, 1.0)
            eng = engine(sqlite_store, [target], tmp_path, registry)
            async with eng:
                started = time.monotonic()
                # bounded here so the old code (a per-read timeout only) fails, not hangs
                report = await asyncio.wait_for(eng.scrape(target, int(time.time() * 1000)), 60)
                took = time.monotonic() - started
            await eng.sink.flush()
            return report, took

    with structlog.testing.capture_logs() as logs:
        report, took = asyncio.run(run())
    assert not report.up  # type: ignore[attr-defined]
    assert report.error == "deadline exceeded after 1 s"  # type: ignore[attr-defined]
    assert took < 30  # the deadline is 1 s; a busy host may add some
    assert (
        registry.get_sample_value(
            "hbmwatch_collector_scrape_failures_total", {"reason": "deadline"}
        )
        == 1
    )
    # a target that never answered is "not yet up" (start-up is quiet), with the same reason
    down = [e for e in logs if e["event"] in ("target down", "target not yet up")]
    assert down and down[0]["reason"] == "deadline"
    (up,) = sqlite_store.latest(parse_selector("hbmwatch_target_up"), 60)
    assert up.value == 0.0


# -- 8: sample limit, label values, memory ------------------------------------------------
def test_page_over_the_sample_limit_is_refused_whole(sqlite_store: Store, tmp_path: Path) -> None:
    page = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",Hostname="h"}} 40\n' for i in range(1000))
    registry = CollectorRegistry()

    async def run() -> object:
        async with PageServer({"/metrics": lambda: (200, page.encode())}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 1.0, 30)
            eng = engine(sqlite_store, [target], tmp_path, registry, sample_limit=100)
            async with eng:
                report = await eng.scrape(target, int(time.time() * 1000))
            await eng.sink.flush()
            return report

    report = asyncio.run(run())
    assert not report.up and report.samples == 0  # type: ignore[attr-defined]
    assert report.error == "sample limit 100 exceeded (1000 samples on the page)"  # type: ignore[attr-defined]
    assert (
        registry.get_sample_value(
            "hbmwatch_collector_scrape_failures_total", {"reason": "sample_limit"}
        )
        == 1
    )
    assert sqlite_store.latest(parse_selector("gpu_hotspot_temperature_celsius"), 60) == []
    assert sqlite_store.devices() == []


def test_count_samples_and_long_labels() -> None:
    page = '# HELP x y\n# TYPE x gauge\nx 1\n\nx{a="b"} 2\ny 3'
    assert count_samples(page) == 3
    assert count_samples("") == 0
    check_sample_limit("# HELP\n" * 500 + "x 1\n" * 100, 100)  # comments are not samples
    with pytest.raises(LimitExceeded, match="sample limit 100 exceeded"):
        check_sample_limit("x 1\n" * 101, 100)
    long_page = GOOD + f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",Hostname="{"h" * 2000}"}} 1\n'
    kept, dropped = drop_long_labels(long_page, 1024)
    assert (kept, dropped) == (GOOD, 1)
    assert drop_long_labels(GOOD * 100, 1024) == (GOOD * 100, 0)
    assert drop_long_labels("m" * 2000 + " 1\n", 1024)[1] == 1  # the name is a label too


def test_ever_new_huge_label_values_do_not_grow_memory(sqlite_store: Store, tmp_path: Path) -> None:
    """New 100 KB label values every scrape (the issue's explosion): memory stays flat."""
    scrapes = {"n": 0}

    def page() -> tuple[int, bytes]:
        scrapes["n"] += 1
        n = scrapes["n"]
        lines = [
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",Hostname="{n}-{i}-{"x" * 100_000}"}} 40\n'
            for i in range(20)
        ]
        return 200, (GOOD + "".join(lines)).encode()

    async def run() -> tuple[list[int], list]:
        async with PageServer({"/metrics": page}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 1.0, 60)
            eng = engine(sqlite_store, [target], tmp_path)
            sizes, reports = [], []
            async with eng:
                for i in range(15):
                    if i == 5:
                        tracemalloc.start()
                    reports.append(await eng.scrape(target, int(time.time() * 1000) + i))
                    await eng.sink.flush()
                    if i >= 5:
                        gc.collect()
                        sizes.append(tracemalloc.get_traced_memory()[0])
            tracemalloc.stop()
            return sizes, reports

    sizes, reports = asyncio.run(run())
    growth_mb = (sizes[-1] - sizes[0]) / 2**20
    assert growth_mb < 5, f"retained memory grew {growth_mb:.0f} MB over 10 scrapes"
    assert all(r.up and r.samples == 1 for r in reports)  # the good series is kept
    assert all(r.dropped == {"label_too_long": 20} for r in reports)
    dropped = sqlite_store.latest(
        parse_selector('hbmwatch_scrape_dropped_total{reason="label_too_long"}'), 60
    )
    assert dropped[0].value == 15 * 20


def test_series_churn_past_the_cap_keeps_devices_bounded(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New hosts every scrape: the cap bounds the memo, and a cache reset drops the devices
    the explosion invented (the memo's cap never bounded those)."""
    monkeypatch.setattr(engine_module, "CACHE_RESET_SCRAPES", 5)
    scrapes = {"n": 0}
    handed: list[int] = []

    def page() -> tuple[int, bytes]:
        scrapes["n"] += 1
        n = scrapes["n"]
        body = "".join(
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="h{n}-{i}"}} 40\n' for i in range(20)
        )
        return 200, body.encode()

    def inventory(devices: list) -> None:
        handed.append(len(devices))
        sqlite_store.upsert_devices(devices)

    async def run() -> None:
        async with PageServer({"/metrics": page}) as server:
            target = Target("dcgm", server.url("/metrics"), {}, 1.0, 30)
            eng = engine(sqlite_store, [target], tmp_path, inventory=inventory,
                         series_per_target=50, inventory_seconds=0.001)  # fmt: skip
            async with eng:
                for i in range(40):
                    await eng.scrape(target, int(time.time() * 1000) + i)

    asyncio.run(run())
    assert len(handed) == 40
    assert max(handed) <= 50, handed


# -- 8: heavy parsing leaves the event loop -----------------------------------------------
@contextlib.contextmanager
def service_gc() -> Iterator[None]:
    """The collector's GC settings under ``hbmwatch up`` (``tune_gc``), restored after.

    Without them a full collection over pytest's own objects stalls every thread for
    ~0.4 s, whichever thread triggers it (measured on the 2-core test host).
    """
    threshold = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def test_a_huge_page_does_not_stall_the_event_loop(sqlite_store: Store, tmp_path: Path) -> None:
    page = "".join(
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",Hostname="h",UUID="GPU-{i:032d}"}} 40\n'
        for i in range(20_000)
    ).encode()

    async def run() -> tuple[float, float, object]:
        async with PageServer({"/metrics": lambda: (200, page)}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 1.0, 120)
            eng = engine(sqlite_store, [target], tmp_path, series_per_target=50_000)
            worst = 0.0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal worst
                last = time.perf_counter()
                while not done.is_set():
                    await asyncio.sleep(0.005)
                    now = time.perf_counter()
                    worst, last = max(worst, now - last), now

            async with eng:
                await eng.scrape(target, 0)  # warm: the connection, the thread pool
                tick = asyncio.create_task(ticker())
                started = time.perf_counter()
                eng.state(target).translator.clear()  # every series new: the full parse
                eng.state(target).page.digest = None  # the same page, but not skipped as unchanged
                report = await eng.scrape(target, 1000)
                took = time.perf_counter() - started
                done.set()
                await tick
            return worst, took, report

    with service_gc():
        worst, took, report = asyncio.run(run())
    assert report.up and report.samples == 20_000  # type: ignore[attr-defined]
    # inline, the loop would stall for the whole parse; in a thread it keeps its turns
    assert worst < took / 4, f"loop stalled {worst * 1000:.0f} ms of a {took * 1000:.0f} ms scrape"


def test_a_big_page_goes_to_a_thread_unless_the_last_one_was_as_long_and_cheap() -> None:
    state = TargetState(Target("dcgm", "http://h:9400/metrics"), None)
    big = OFFLOAD_BYTES * 2
    assert state.inline(100) and not state.inline(big)  # never translated: a thread
    state.translated = (big, 0.001)  # a known page, translated in 1 ms
    assert state.inline(big) and state.inline(int(big * 1.2))
    assert not state.inline(big * 2)  # twice as long: a thread again
    state.translated = (big, 0.5)
    assert not state.inline(big)  # slow last time: a thread


# -- 2b: an inventory that fails costs no samples -----------------------------------------
async def drain_spool(eng: ScrapeEngine) -> None:
    """Flush until the spool is empty (the store is back), with a generous deadline."""
    deadline = time.monotonic() + 60
    while eng.sink.writer.spool.pending() and time.monotonic() < deadline:
        await eng.sink.flush()
        await asyncio.sleep(0.05)


def hotspot_counts(store: Store) -> dict[str, float]:
    """Hotspot samples stored in the last ten minutes, by GPU."""
    now = time.time()
    counts = store.range_query(
        parse_selector("gpu_hotspot_temperature_celsius"), now - 600, now + 600, 1200,
        Aggregation.COUNT,
    )  # fmt: skip
    return {s.series.label("gpu"): sum(p.value for p in s.points) for s in counts.series}


def test_failing_inventory_keeps_the_samples(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    store = make_store(f"sqlite:///{db}", Clock(time.time()), sqlite_busy_timeout_seconds=0.1)
    store._clock = time.time

    async def run() -> list:
        async with PageServer({"/metrics": refreshing(lambda: GOOD)}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 1.0, 30)
            eng = engine(store, [target], tmp_path, inventory_seconds=0.001)
            reports = []
            lock = sqlite3.connect(db, timeout=1, isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
            t0 = int(time.time() * 1000)
            async with eng:
                for i in range(3):
                    reports.append(await eng.scrape(target, t0 + i * 1000))
                await eng.sink.flush()
                lock.execute("COMMIT")
                lock.close()
                reports.append(await eng.scrape(target, t0 + 10_000))  # past the retry delay
                await eng.sink.flush()
                await drain_spool(eng)
            return reports

    with structlog.testing.capture_logs() as logs:
        reports = asyncio.run(run())
    assert all(r.up for r in reports)
    events = [e["event"] for e in logs if "inventory" in e["event"]]
    assert events == ["device inventory not written; retrying", "device inventory written again"]
    assert sum(hotspot_counts(store).values()) == 4  # every scrape's sample landed
    assert [d.host for d in store.devices()] == ["h"]
    store.close()


# -- 9: missed and late rounds are counted, exposed and logged ----------------------------
class SlowPage(RawServer):
    """A real server that answers after ``delay`` seconds: a target slower than its interval."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(self.delay)
                body = GOOD.encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        writer.close()


def test_skipped_and_late_ticks_are_counted_and_logged(sqlite_store: Store, tmp_path: Path) -> None:
    registry = CollectorRegistry()

    async def run() -> ScrapeEngine:
        async with (
            SlowPage(0.3) as slow_url,
            PageServer({"/metrics": lambda: (200, GOOD.encode())}) as server,
        ):
            slow = Target("dcgm", slow_url, {"host": "slow"}, 0.1, 30)
            fast = Target("dcgm", server.url("/metrics"), {"host": "fast"}, 0.1, 30)
            eng = engine(sqlite_store, [slow, fast], tmp_path, registry, flush_seconds=0.05)
            stop = asyncio.Event()
            task = asyncio.create_task(eng.run(stop))

            async def busy_host() -> None:  # the loop blocked now and then: ticks wake late
                while not stop.is_set():
                    time.sleep(0.15)
                    await asyncio.sleep(0.1)

            hog = asyncio.create_task(busy_host())
            deadline = time.monotonic() + 60
            counted_at: int | None = None  # the slow target's scrapes when its skips counted
            while time.monotonic() < deadline:
                states = {s.target.labels["host"]: s for s in eng.states}
                if (
                    len(states) == 2
                    and states["slow"].skipped_ticks >= 5
                    and all(s.late_scrapes >= 2 for s in states.values())
                ):
                    counted_at = states["slow"].scrapes if counted_at is None else counted_at
                    if states["slow"].scrapes > counted_at:  # a scrape since wrote its health
                        break
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(asyncio.gather(task, hog), 60)
            return eng

    with structlog.testing.capture_logs() as logs:
        eng = asyncio.run(run())
    states = {s.target.labels["host"]: s for s in eng.states}
    assert states["slow"].skipped_ticks >= 5
    assert all(s.late_scrapes >= 2 for s in states.values())
    skipped = sum(s.skipped_ticks for s in eng.states)
    late = sum(s.late_scrapes for s in eng.states)
    assert registry.get_sample_value("hbmwatch_collector_skipped_ticks_total") == skipped
    assert registry.get_sample_value("hbmwatch_collector_late_scrapes_total") == late
    (behind,) = [e for e in logs if e["event"] == "collector falling behind"]  # one a minute
    # The line sums what changed since the last one: on a loaded machine the first late
    # wake-up may come before the first skipped tick, and the next line is a minute away.
    assert behind["skipped_ticks"] + behind["late_scrapes"] > 0
    assert behind["worst_target"].endswith("/metrics")
    stored = sqlite_store.latest(parse_selector('hbmwatch_scrape_skipped_ticks_total{host="slow"}'))
    assert stored and stored[0].value > 0


@pytest.mark.postgres
def test_postgres_down_inventory_fails_samples_spool_and_land(
    private_pg: dict, tmp_path: Path
) -> None:
    """The issue's case on a real PostgreSQL: the server stops, scrapes go on (a new GPU
    appears meanwhile); when it is back every sample lands and the new GPU is inventoried."""
    store = make_store(private_pg["url"], Clock(time.time()))
    store._clock = time.time
    page = {"body": GOOD}

    async def run() -> list:
        async with PageServer({"/metrics": refreshing(lambda: page["body"])}) as server:
            target = Target("dcgm", server.url("/metrics"), {"host": "h"}, 1.0, 30)
            eng = engine(store, [target], tmp_path, inventory_seconds=0.001)
            t0 = int(time.time() * 1000) - 60_000
            reports = []
            async with eng:
                reports.append(await eng.scrape(target, t0))
                await eng.sink.flush()
                private_pg["stop"]()
                page["body"] = GOOD + GOOD.replace('gpu="0"', 'gpu="1"')
                for i in range(1, 4):
                    reports.append(await eng.scrape(target, t0 + i * 10_000))
                    await eng.sink.flush()
                assert eng.sink.writer.spool.pending()
                private_pg["start"]()
                reports.append(await eng.scrape(target, t0 + 40_000))
                await drain_spool(eng)
            return reports

    with structlog.testing.capture_logs() as logs:
        reports = asyncio.run(run())
    assert all(r.up for r in reports)
    events = [e["event"] for e in logs if "inventory" in e["event"]]
    assert events == ["device inventory not written; retrying", "device inventory written again"]
    assert hotspot_counts(store) == {"0": 5, "1": 4}  # every scrape, the outage's included
    assert sorted(d.gpu for d in store.devices()) == ["0", "1"]
    store.close()


def test_a_stall_of_our_own_loop_is_not_the_targets_fault(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """A deadline that fires late because this process's loop was blocked (a GC pass, a
    busy host) gives the scrape one more timeout: the target answered in time."""

    async def run() -> object:
        async with SlowPage(0.3) as url:
            target = Target("dcgm", url, {"host": "h"}, 1.0, 1.0)
            eng = engine(sqlite_store, [target], tmp_path)
            async with eng:

                async def stall() -> None:
                    await asyncio.sleep(0.05)
                    time.sleep(2.0)  # the loop blocked past the scrape's 1 s deadline

                blocker = asyncio.create_task(stall())
                report = await eng.scrape(target, int(time.time() * 1000))
                await blocker
            return report

    report = asyncio.run(run())
    assert report.up, report.error  # type: ignore[attr-defined]
