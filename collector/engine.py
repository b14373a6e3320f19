"""The scrape engine: every target on its own interval, many at once, asyncio and httpx.

Each target gets a loop: wait for its next tick (spread over the interval by a fixed
per-target offset, so a thousand targets do not fire together), fetch with a timeout,
parse, translate into canonical samples, and hand them to a batching sink that writes to
the store from a thread (spooling while the store is down).  Alongside its samples every
scrape writes the target's own health: ``hbmwatch_target_up``, the scrape's duration, its
sample count and what it dropped by reason.  A target that stops answering gets ``up 0``
and nothing else: its series go stale, they are never flat-lined.

Samples are stamped with the scheduled tick when the scrape starts within 50 ms of it
(Prometheus' timestamp tolerance), which makes time series regular and compress well.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from collector.sources.dcgm import DcgmTranslator
from collector.sources.dme import DmeTranslator
from collector.sources.inference import InferenceTranslator
from collector.sources.mapped import MappedTranslator, load_mapping
from collector.targets import Target, TargetSet
from collector.translate import Collected
from collector.writer import Flushed, SpoolingWriter
from hbmwatch import log
from hbmwatch.metrics import DROP_REASONS
from hbmwatch.records import Device, Sample, SeriesKey
from hbmwatch.settings import CollectorSettings

logger = log.get("hbmwatch.collector")
TIMESTAMP_TOLERANCE_MS = 50
CACHE_RESET_SCRAPES = 3600


def translator_for(target: Target, settings: CollectorSettings) -> Any:
    labels, cap = target.labels, settings.series_per_target
    window = settings.latency_window_seconds
    if target.kind == "dme":
        return DmeTranslator(labels, series_cap=cap)
    if target.kind == "dcgm":
        return DcgmTranslator(labels, series_cap=cap)
    if target.kind == "mapped":
        assert target.mapping is not None
        mapping = load_mapping(Path(target.mapping))
        return MappedTranslator(mapping, labels, window_seconds=window, series_cap=cap)
    return InferenceTranslator(labels, window_seconds=window, series_cap=cap)


@dataclass
class TargetState:
    target: Target
    translator: Any
    dropped: Counter[str] = field(default_factory=Counter)
    scrapes: int = 0
    up: bool | None = None
    last_error: str = ""
    last_inventory_ms: int = 0
    last_scrape_ms: int | None = None
    client: httpx.AsyncClient | None = None

    def self_labels(self) -> dict[str, str]:
        base = {k: v for k, v in self.target.labels.items() if k in ("cluster", "rack", "host")}
        return {**base, "target": self.target.url, "source": self.target.kind}


@dataclass
class ScrapeReport:
    target: str
    up: bool
    samples: int
    dropped: dict[str, int]
    duration_s: float
    error: str = ""


class BatchingSink:
    """Collects samples from many scrapes and writes them in batches."""

    def __init__(self, writer: SpoolingWriter, flush_samples: int, flush_seconds: float) -> None:
        self.writer = writer
        self.flush_samples = flush_samples
        self.flush_seconds = flush_seconds
        self._pending: list[Sample] = []
        self._oldest = 0.0
        self._lock = asyncio.Lock()
        self.totals = Flushed()

    def add(self, samples: list[Sample]) -> None:
        if samples and not self._pending:
            self._oldest = time.monotonic()
        self._pending.extend(samples)

    def due(self) -> bool:
        return bool(self._pending) and (
            len(self._pending) >= self.flush_samples
            or time.monotonic() - self._oldest >= self.flush_seconds
        )

    async def flush(self) -> Flushed:
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return Flushed()
            # On the loop's own thread: a writer thread releases the GIL for every row it
            # steps, and a busy loop thread then starves it (measured: 20-40% slower).
            done = self.writer.write(batch)
            t = self.totals
            t.samples += done.samples
            t.accepted += done.accepted
            t.rejected += done.rejected
            t.spooled += done.spooled
            t.replayed += done.replayed
            return done


class ScrapeEngine:
    def __init__(
        self,
        targets: TargetSet,
        sink: BatchingSink,
        settings: CollectorSettings,
        *,
        clock: Callable[[], float] = time.time,
        inventory: Callable[[list[Device]], object] | None = None,
        local_sources: Iterable[Any] = (),
        registry: CollectorRegistry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.targets = targets
        self.sink = sink
        self.settings = settings
        self.clock = clock
        self.inventory = inventory
        self.local_sources = list(local_sources)
        self._transport = transport
        self._states: dict[str, TargetState] = {}
        registry = registry or CollectorRegistry()
        self.scrapes = PromCounter(
            "hbmwatch_collector_scrapes", "Scrapes by result.", ["result"], registry=registry
        )
        self.samples = PromCounter(
            "hbmwatch_collector_samples", "Canonical samples collected.", registry=registry
        )
        self.last_round_ms = 0

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def __aenter__(self) -> ScrapeEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every target's connection."""
        for state in self._states.values():
            if state.client is not None:
                await state.client.aclose()
                state.client = None

    def _client(self, state: TargetState) -> httpx.AsyncClient:
        # One small client per target: a shared pool scans all its connections on every
        # event, which at a thousand targets costs more than the parsing does.
        if state.client is None:
            state.client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
                transport=self._transport,
                headers={"Accept": "text/plain;version=0.0.4"},
            )
        return state.client

    def state(self, target: Target) -> TargetState:
        state = self._states.get(target.id)
        if state is None:
            state = TargetState(target, translator_for(target, self.settings))
            self._states[target.id] = state
        return state

    @property
    def states(self) -> list[TargetState]:
        return list(self._states.values())

    # -- one scrape -------------------------------------------------------------------------
    async def scrape(self, target: Target, ts_ms: int) -> ScrapeReport:
        state = self.state(target)
        client = self._client(state)
        started = time.perf_counter()
        collected: Collected | None = None
        error = ""
        try:
            text = await self._fetch(client, target)
            collected = state.translator.translate_text(text, ts_ms)
        except (httpx.HTTPError, PageError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        duration = time.perf_counter() - started
        state.scrapes += 1
        if state.scrapes % CACHE_RESET_SCRAPES == 0:
            state.translator.clear()  # series that churned away release their cap slots
        up = collected is not None
        if up != state.up:
            if up:
                logger.info("target up", target=target.url, kind=target.kind)
            else:
                logger.warning("target down", target=target.url, error=error)
        state.up, state.last_error = up, error
        samples = collected.samples if collected else []
        if collected:
            state.dropped.update(collected.dropped)
            if (
                collected.devices
                and self.inventory is not None
                and (ts_ms - state.last_inventory_ms >= self.settings.inventory_seconds * 1000)
            ):
                state.last_inventory_ms = ts_ms
                await asyncio.to_thread(self.inventory, list(collected.devices.values()))
        health = self._health(state, ts_ms, up, duration, len(samples))
        self.sink.add(samples + health)
        self.samples.inc(len(samples))
        self.scrapes.labels("up" if up else "down").inc()
        return ScrapeReport(
            target.url,
            up,
            len(samples),
            dict(collected.dropped) if collected else {},
            duration,
            error,
        )

    async def _fetch(self, client: httpx.AsyncClient, target: Target) -> str:
        limit = self.settings.max_page_bytes
        async with client.stream("GET", target.url, timeout=target.timeout_seconds) as r:
            if r.status_code != 200:
                raise PageError(f"HTTP {r.status_code}")
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise PageError(f"page larger than {limit} bytes")
                chunks.append(chunk)
        body = b"".join(chunks)
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body.decode("utf-8", errors="replace")

    def _health(
        self, state: TargetState, ts_ms: int, up: bool, duration: float, samples: int
    ) -> list[Sample]:
        labels = state.self_labels()
        out = [
            Sample(SeriesKey("hbmwatch_target_up", labels), ts_ms, 1.0 if up else 0.0),
            Sample(SeriesKey("hbmwatch_scrape_duration_seconds", labels), ts_ms, duration),
        ]
        if up:
            out.append(Sample(SeriesKey("hbmwatch_scrape_samples", labels), ts_ms, float(samples)))
        for reason, total in state.dropped.items():
            if reason in DROP_REASONS:
                out.append(
                    Sample(
                        SeriesKey("hbmwatch_scrape_dropped_total", {**labels, "reason": reason}),
                        ts_ms,
                        float(total),
                    )
                )
        return out

    # -- rounds and loops -------------------------------------------------------------------
    async def scrape_round(
        self, ts_ms: int | None = None, *, due_only: bool = False
    ) -> list[ScrapeReport]:
        """Scrape every current target once at one timestamp (tests and evaluation).

        ``due_only`` skips targets whose own interval has not passed since their last
        scrape, so a stepped clock honours per-target intervals as ``run`` does.
        """
        ts = self.now_ms() if ts_ms is None else ts_ms
        targets = self.targets.current()
        if due_only:
            targets = [t for t in targets if self._due(t, ts)]
        for t in targets:
            self.state(t).last_scrape_ms = ts
        reports = list(await asyncio.gather(*(self.scrape(t, ts) for t in targets)))
        self._collect_local(ts)
        self.last_round_ms = ts
        return reports

    def _due(self, target: Target, ts_ms: int) -> bool:
        last = self.state(target).last_scrape_ms
        return last is None or ts_ms - last >= target.interval_seconds * 1000 - 1

    def _collect_local(self, ts_ms: int) -> None:
        for source in self.local_sources:
            try:
                collected = source.collect(ts_ms)
            except Exception as exc:
                logger.warning("local source failed", source=source.kind, error=str(exc))
                continue
            self.sink.add(collected.samples)

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every target on its interval until ``stop``; reload targets as they change."""
        tasks: dict[str, asyncio.Task[None]] = {}
        async with self:
            flusher = asyncio.create_task(self._flush_loop(stop))
            local = asyncio.create_task(self._local_loop(stop))
            try:
                while not stop.is_set():
                    current = {t.id: t for t in self.targets.current()}
                    for target_id in set(tasks) - set(current):
                        tasks.pop(target_id).cancel()
                    for target_id, target in current.items():
                        if target_id not in tasks:
                            tasks[target_id] = asyncio.create_task(self._target_loop(target, stop))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 5.0)
            finally:
                for task in tasks.values():
                    task.cancel()
                if not stop.is_set():  # cancelled: the loops would wait for a stop never set
                    flusher.cancel()
                    local.cancel()
                await asyncio.gather(*tasks.values(), return_exceptions=True)
                await asyncio.gather(flusher, local, return_exceptions=True)
                await self.sink.flush()

    async def _target_loop(self, target: Target, stop: asyncio.Event) -> None:
        interval_ms = int(target.interval_seconds * 1000)
        offset = zlib.crc32(hashlib.sha1(target.id.encode()).digest()) % max(interval_ms, 1)
        now = self.now_ms()
        tick = now - (now - offset) % interval_ms + interval_ms
        while not stop.is_set():
            await _sleep_until(self.clock, tick, stop)
            if stop.is_set():
                return
            now = self.now_ms()
            ts = tick if abs(now - tick) <= TIMESTAMP_TOLERANCE_MS else now
            try:
                await self.scrape(target, ts)
            except Exception:
                logger.exception("scrape failed unexpectedly", target=target.url)
            tick += interval_ms
            if tick < self.now_ms():  # fell behind (slow target or busy host): skip ahead
                now = self.now_ms()
                tick = now - (now - offset) % interval_ms + interval_ms

    async def _flush_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.sink.due():
                try:
                    await self.sink.flush()
                except Exception:
                    logger.exception("writing samples failed")
            await asyncio.sleep(min(0.05, self.settings.flush_seconds / 4))

    async def _local_loop(self, stop: asyncio.Event) -> None:
        if not self.local_sources:
            return
        interval = self.settings.interval_seconds
        while not stop.is_set():
            await asyncio.to_thread(self._collect_local, self.now_ms())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


class PageError(Exception):
    """A scrape that got an answer, but not a page: HTTP status, size limit."""


async def _sleep_until(clock: Callable[[], float], tick_ms: int, stop: asyncio.Event) -> None:
    wait = tick_ms / 1000 - clock()
    if wait > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
