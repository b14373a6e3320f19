"""The scrape engine: every target on its own interval, many at once, on one asyncio loop.

Each target gets a loop: wait for its next tick (spread over the interval by a fixed
per-target offset, so a thousand targets do not fire together, on 25 ms slots, so the
targets of a slot wake the loop once), fetch with a timeout
(one kept-alive connection a target, collector/http.py), parse, translate into canonical
samples, and hand them to a batching sink that writes to the store from a thread
(spooling while the store is down).  Alongside its samples every scrape writes the
target's own health: ``hbmwatch_target_up``, the scrape's duration, its sample count and
what it dropped by reason.  A target that stops answering gets ``up 0``
and nothing else: its series go stale, they are never flat-lined.  One that has never
answered is "not yet up" in its state (it still writes ``up 0``: the detectors decide).

Samples are stamped with the scheduled tick when the scrape starts within 50 ms of it
(Prometheus' timestamp tolerance), which makes time series regular and compress well.

A target is untrusted: its whole fetch (connect, headers, body) runs under one deadline,
a page over the sample limit is refused whole, over-long label values are dropped before
they reach the translator's memo (collector/limits.py), and big pages are parsed in a
worker thread (collector/scrape.py) so one exploding target cannot starve the others.
A scrape that starts late, and ticks skipped because the loop fell behind, are counted
and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import ssl
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge

from hbmwatch import log
from hbmwatch.collector.http import Client, FetchError, HttpClient, HttpxClient, PageError
from hbmwatch.collector.limits import LimitExceeded
from hbmwatch.collector.scrape import (  # translator_for, TargetState: importable from here too
    ScrapeReport,
    TargetState,
    collect,
    health,
    translator_for,
)
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.collector.translate import Collected
from hbmwatch.collector.writer import BatchingSink  # lives in writer.py; importable from here too
from hbmwatch.records import Device
from hbmwatch.settings import CollectorSettings

logger = log.get("hbmwatch.collector")
TIMESTAMP_TOLERANCE_MS = 50
CACHE_RESET_SCRAPES = 3600
#: At most one "falling behind" warning (for all targets together) this often.
BEHIND_LOG_SECONDS = 60.0
#: A failed device inventory is retried this much later.
INVENTORY_RETRY_MS = 5_000
#: Ticks fall on slots this long (shorter where the interval holds fewer than
#: ``TICK_SLOTS``): the targets of a
#: slot wake the loop once, not once each.  A wake-up costs the loop ~0.1-0.2 ms of CPU
#: (the timer, epoll), as much as translating a vLLM page.
SLOT_MS = 25
TICK_SLOTS = 40
#: The exposition format a scrape asks for (Prometheus' text format).
ACCEPT = {"Accept": "text/plain;version=0.0.4"}


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
        #: The two children, looked up once (``labels()`` costs more than ``inc()``).
        self._scraped = {True: self.scrapes.labels("up"), False: self.scrapes.labels("down")}
        self.samples = PromCounter(
            "hbmwatch_collector_samples", "Canonical samples collected.", registry=registry
        )
        self.failures = PromCounter(
            "hbmwatch_collector_scrape_failures",
            "Failed scrapes by reason.",
            ["reason"],
            registry=registry,
        )
        self.skipped_ticks = PromCounter(
            "hbmwatch_collector_skipped_ticks",
            "Scheduled scrapes skipped because the target's loop fell behind.",
            registry=registry,
        )
        self.late_scrapes = PromCounter(
            "hbmwatch_collector_late_scrapes",
            f"Scrapes that started more than {TIMESTAMP_TOLERANCE_MS} ms after their tick.",
            registry=registry,
        )
        self.targets_owned = PromGauge(
            "hbmwatch_collector_targets_owned",
            "Targets this collector scrapes: those of its shard (collector.shard).",
            registry=registry,
        )
        self.targets_total = PromGauge(
            "hbmwatch_collector_targets_total",
            "Targets configured, all shards together.",
            registry=registry,
        )
        #: Newest scrape completion (ms): readiness reads it; ``run`` and rounds keep it.
        self.last_round_ms = 0
        self.cache_reset_scrapes = CACHE_RESET_SCRAPES
        self.inventory_failing = False
        self._skipped_total = self._late_total = 0
        self._behind_logged: tuple[float, int, int] = (-BEHIND_LOG_SECONDS, 0, 0)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def __aenter__(self) -> ScrapeEngine:
        await self.targets.start()  # discovered targets (Kubernetes) before the first round
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every target's connection."""
        await self.targets.aclose()
        for state in self._states.values():
            if state.client is not None:
                await state.client.aclose()
                state.client = None

    def _client(self, state: TargetState) -> Client:
        # One connection per target (collector/http.py), or the given httpx transport (the
        # simulator in-process).  They share one TLS context: each of its own loads the CA
        # bundle, 90 ms of CPU a target.
        if state.client is None:
            if self._transport is None:
                state.client = HttpClient(_tls_context(), ACCEPT)
            else:
                state.client = HttpxClient(self._transport, _tls_context(), ACCEPT)
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
        """Fetch and translate under one deadline; up or down, the samples go to the sink."""
        state = self.state(target)
        started = time.perf_counter()
        collected: Collected | None = None
        error = reason = ""
        try:
            collected = await collect(state, self._client(state), self.settings, ts_ms)
        except TimeoutError:
            error, reason = f"deadline exceeded after {target.timeout_seconds:g} s", "deadline"
        except LimitExceeded as exc:
            error, reason = str(exc), "sample_limit"
        except PageError as exc:
            error, reason = str(exc), exc.reason
        except FetchError as exc:
            error, reason = str(exc), "http_error"
        duration = time.perf_counter() - started
        self._record(state, collected, error, reason)
        up = collected is not None
        samples = collected.samples if collected else []
        own = health(state, ts_ms, up, duration, len(samples))
        self.sink.add(samples + own)  # before the inventory, whose failure must not cost them
        self.samples.inc(len(samples))
        self._scraped[up].inc()
        if collected and collected.devices:
            await self._inventory(state, collected, ts_ms)
        dropped = dict(collected.dropped) if collected else {}
        return ScrapeReport(target.url, up, len(samples), dropped, duration, error, reason)

    def _record(
        self, state: TargetState, collected: Collected | None, error: str, reason: str
    ) -> None:
        """Count the scrape; log a target going up or down, or down for a new reason.

        A target that has never answered stays "not yet up" (``up`` None), not down: a fleet
        still starting is no outage, and the detectors give it a grace before paging.
        """
        target, up = state.target, collected is not None
        state.scrapes += 1
        if state.scrapes % self.cache_reset_scrapes == 0:
            self._reset_cache(state)
        new_reason = state.scrapes == 1 or reason != state.reason
        if up and state.up is not True:
            logger.info("target up", target=target.url, kind=target.kind)
        elif not up and state.up is None and new_reason:
            logger.warning("target not yet up", target=target.url, reason=reason, error=error)
        elif not up and state.up is not None and (state.up or new_reason):
            logger.warning("target down", target=target.url, reason=reason, error=error)
        if not up:
            self.failures.labels(reason).inc()
        state.up = True if up else (None if state.up is None else False)
        state.last_error, state.reason = error, reason
        if collected:
            state.dropped.update(collected.dropped)

    def _reset_cache(self, state: TargetState) -> None:
        """Release the cap slots of series that churned away.

        ``clear()`` empties the translator's memo only; a target that hit its series cap
        since the last reset (a label explosion) gets a fresh translator, so the devices
        and histories it invented go too (the memo's cap does not bound those).
        """
        state.translated = (0, math.inf)  # a cleared memo parses the next page in full
        capped = state.dropped["series_cap"] + state.dropped["label_too_long"]
        if capped > state.capped_at_reset or state.parsing is not None:
            state.translator = translator_for(state.target, self.settings)
        else:
            state.translator.clear()
        state.capped_at_reset = capped

    async def _inventory(self, state: TargetState, collected: Collected, ts_ms: int) -> None:
        """Upsert the devices a target shows, every ``inventory_seconds``.

        A failure (the store is down) costs no samples: it is logged once when the
        inventory starts and stops failing, and retried ``INVENTORY_RETRY_MS`` later.
        """
        every_ms = self.settings.inventory_seconds * 1000
        if self.inventory is None or ts_ms - state.last_inventory_ms < every_ms:
            return
        state.last_inventory_ms = ts_ms
        try:
            await asyncio.to_thread(self.inventory, list(collected.devices.values()))
        except Exception as exc:
            state.last_inventory_ms = int(ts_ms - every_ms + min(every_ms, INVENTORY_RETRY_MS))
            if not self.inventory_failing:
                error = f"{type(exc).__name__}: {exc}"
                logger.warning("device inventory not written; retrying", error=error)
            self.inventory_failing = True
            return
        if self.inventory_failing:
            logger.info("device inventory written again", target=state.target.url)
        self.inventory_failing = False

    # -- rounds and loops -------------------------------------------------------------------
    async def scrape_round(
        self, ts_ms: int | None = None, *, due_only: bool = False
    ) -> list[ScrapeReport]:
        """Scrape every current target once at one timestamp (tests and evaluation).

        ``due_only`` skips targets whose own interval has not passed since their last
        scrape, so a stepped clock honours per-target intervals as ``run`` does.
        """
        ts = self.now_ms() if ts_ms is None else ts_ms
        targets = self.current_targets()
        if due_only:
            targets = [t for t in targets if self._due(t, ts)]
        for t in targets:
            self.state(t).last_scrape_ms = ts
        reports = list(await asyncio.gather(*(self.scrape(t, ts) for t in targets)))
        self._collect_local(ts)
        self.last_round_ms = ts
        return reports

    def current_targets(self) -> list[Target]:
        """This shard's targets now; the gauges follow them."""
        targets = self.targets.current()
        self.targets_owned.set(len(targets))
        self.targets_total.set(self.targets.total)
        return targets

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
        if self.local_sources:
            self.last_round_ms = max(self.last_round_ms, self.now_ms())

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every target on its interval until ``stop``; reload targets as they change."""
        tasks: dict[str, asyncio.Task[None]] = {}
        async with self:
            flusher = asyncio.create_task(self._flush_loop(stop))
            local = asyncio.create_task(self._local_loop(stop))
            watch = asyncio.create_task(self.targets.watch(stop))
            try:
                while not stop.is_set():
                    current = {t.id: t for t in self.current_targets()}
                    for target_id in set(tasks) - set(current):
                        tasks.pop(target_id).cancel()
                    for target_id, target in current.items():
                        if target_id not in tasks:
                            tasks[target_id] = asyncio.create_task(self._target_loop(target, stop))
                    if not current and not self.local_sources:  # nothing to scrape: idle, alive
                        self.last_round_ms = self.now_ms()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 5.0)
            finally:
                for task in tasks.values():
                    task.cancel()
                if not stop.is_set():  # cancelled: the loops would wait for a stop never set
                    flusher.cancel()
                    local.cancel()
                watch.cancel()
                await asyncio.gather(*tasks.values(), return_exceptions=True)
                await asyncio.gather(flusher, local, watch, return_exceptions=True)
                await self.sink.flush()

    async def _target_loop(self, target: Target, stop: asyncio.Event) -> None:
        interval_ms = int(target.interval_seconds * 1000)
        offset = tick_offset(target.id, interval_ms)
        now = self.now_ms()
        tick = now - (now - offset) % interval_ms + interval_ms
        state = self.state(target)
        while not stop.is_set():
            wait = tick / 1000 - self.clock()
            if wait > 0:  # a plain sleep: ``run`` cancels this task at a stop
                await asyncio.sleep(wait)
            if stop.is_set():
                return
            now = self.now_ms()
            ts = tick if abs(now - tick) <= TIMESTAMP_TOLERANCE_MS else now
            if now - tick > TIMESTAMP_TOLERANCE_MS:  # a busy loop woke this target late
                state.late_scrapes += 1
                self._late_total += 1
                self.late_scrapes.inc()
            try:
                await self.scrape(target, ts)
            except Exception:
                logger.exception("scrape failed unexpectedly", target=target.url)
            self.last_round_ms = max(self.last_round_ms, self.now_ms())
            tick += interval_ms
            now = self.now_ms()
            if tick < now:  # fell behind (slow target or busy host): skip ahead, and count
                next_tick = now - (now - offset) % interval_ms + interval_ms
                skipped = (next_tick - tick) // interval_ms
                state.skipped_ticks += skipped
                self._skipped_total += skipped
                self.skipped_ticks.inc(skipped)
                tick = next_tick
            self._log_behind()

    def _log_behind(self) -> None:
        """At most one "falling behind" warning a minute for the whole fleet.

        A busy host makes every target late at once: one line per target (a thousand at
        fleet scale) would flood the log, so the line sums what changed since the last
        one and names the worst target; per-target counts are in the health series.
        """
        at, skipped, late = self._behind_logged
        now_skipped, now_late = self._skipped_total, self._late_total
        if (now_skipped, now_late) == (skipped, late) or time.monotonic() - at < BEHIND_LOG_SECONDS:
            return
        behind = [
            (s.skipped_ticks - s.behind_mark[0], s.late_scrapes - s.behind_mark[1], s)
            for s in self._states.values()
            if (s.skipped_ticks, s.late_scrapes) != s.behind_mark
        ]
        worst = max(behind, key=lambda row: row[:2])[2]
        logger.warning(
            "collector falling behind",
            targets=len(behind),
            skipped_ticks=now_skipped - skipped,
            late_scrapes=now_late - late,
            worst_target=worst.target.url,
            worst_interval_seconds=worst.target.interval_seconds,
        )
        for _, _, state in behind:
            state.behind_mark = (state.skipped_ticks, state.late_scrapes)
        self._behind_logged = (time.monotonic(), now_skipped, now_late)

    async def _flush_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.sink.due():
                try:
                    self.sink.hand_off()  # the writer thread writes; the loop never waits
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


def tick_offset(target_id: str, interval_ms: int) -> int:
    """The target's fixed place in its interval (ms): a hash of its id, spreading targets
    over the interval, at the start of its slot (``SLOT_MS``)."""
    offset = zlib.crc32(hashlib.sha1(target_id.encode()).digest()) % max(interval_ms, 1)
    slot = max(1, min(SLOT_MS, interval_ms // TICK_SLOTS))
    return offset - offset % slot


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The one TLS context (httpx's defaults: certifi's CAs) every target's client uses."""
    return httpx.create_ssl_context()
