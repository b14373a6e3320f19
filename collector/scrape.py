"""One scrape of one target: its state, the fetch, the page's limits, translation, health.

The engine (collector/engine.py) schedules scrapes; this module fetches each page under
one deadline (``within_deadline``: connect, headers and body together, since httpx's own
timeout is per read and a trickled page never met it), then translates it.  A page at
least ``OFFLOAD_BYTES`` long is translated in a worker thread, so one exploding target
cannot starve the event loop (and with it every other target and the API).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hbmwatch.collector.limits import check_sample_limit, drop_long_labels
from hbmwatch.collector.refresh import SKIPS_UNCHANGED, PageMemory
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.federated import SOURCES, FederatedTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.sources.mapped import MappedTranslator, load_mapping
from hbmwatch.collector.targets import Target
from hbmwatch.collector.translate import Collected
from hbmwatch.metrics import DROP_REASONS
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import CollectorSettings

#: Pages at least this large are parsed in a worker thread.  Measured (2-core host, DCGM
#: pages): a thread hop costs ~150-350 us, parsing a 3 KB page inline 90 us, a 23 KB page
#: 0.7 ms, a 380 KB page 27 ms; so small pages stay on the loop, big ones leave it.
OFFLOAD_BYTES = 64 * 2**10
#: A deadline that fires this late found the loop itself stalled (see ``within_deadline``).
STALL_SECONDS = 0.25


def translator_for(target: Target, settings: CollectorSettings) -> Any:
    labels, cap = target.labels, settings.series_per_target
    window = settings.latency_window_seconds
    if target.kind == "dme":
        return DmeTranslator(labels, series_cap=cap)
    if target.kind == "dcgm":
        return DcgmTranslator(labels, series_cap=cap)
    if target.kind == "prometheus":
        return FederatedTranslator(
            labels,
            sources=target.sources or SOURCES,
            host_label=target.host_label,
            window_seconds=window,
            series_cap=cap,
        )
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
    reason: str = ""  # why the last scrape failed, in a word (a label of the failures counter)
    last_inventory_ms: int = 0
    last_scrape_ms: int | None = None
    client: httpx.AsyncClient | None = None
    #: A page still being parsed in a worker thread after its scrape's deadline passed.
    parsing: asyncio.Future[Collected] | None = None
    capped_at_reset: int = 0  # series dropped by the target's limits at the last cache reset
    skipped_ticks: int = 0
    late_scrapes: int = 0
    behind_mark: tuple[int, int] = (0, 0)  # skipped, late when the last warning counted them
    page: PageMemory = field(default_factory=PageMemory)  # unchanged pages (collector/refresh.py)

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
    reason: str = ""


class PageError(Exception):
    """A scrape that got an answer, but not a page: HTTP status, size limit."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


async def within_deadline(fetching: Awaitable[str], timeout: float) -> str:
    """The page, or ``TimeoutError`` once ``timeout`` seconds have passed in all.

    A deadline that fires more than ``STALL_SECONDS`` late found this process's own loop
    stalled (a GC pass, a busy host): that time was ours, not the target's, so the fetch
    gets one more ``timeout`` before the target counts as down.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(fetching)
    task.add_done_callback(retrieve)
    try:
        deadline = loop.time() + timeout
        for _ in range(2):
            await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
            if task.done():
                return task.result()
            if loop.time() - deadline < STALL_SECONDS:  # woke on time: the target is slow
                break
            deadline = loop.time() + timeout
        raise TimeoutError
    finally:
        task.cancel()  # a no-op when done; else the fetch ends here


async def collect(
    state: TargetState, client: httpx.AsyncClient, settings: CollectorSettings, ts_ms: int
) -> Collected:
    """Fetch one page within the target's deadline, then translate it.

    The deadline covers the target's part (connect, headers, body): translation is this
    process's own cost, bounded by ``sample_limit`` and done off the loop for big pages.
    Counted against the target, it marked healthy 150 KB node pages down whenever a busy
    2-core host parsed them in more than the 0.8 s deadline.
    """
    if state.parsing is not None:  # the last page outlived its scrape: translators are
        await asyncio.wait([state.parsing])  # not thread-safe, so wait for it to finish
        state.parsing = None
    target = state.target
    request = getattr(state.translator, "request", None)  # a prometheus target's /federate
    url, params = request(target.url) if request else (target.url, None)
    text = await within_deadline(
        fetch(client, url, settings.max_page_bytes, params), target.timeout_seconds
    )
    if target.kind in SKIPS_UNCHANGED and state.page.same(text, ts_ms, state.up is True):
        return Collected(devices=state.page.devices)  # not refreshed: nothing new to store
    if len(text) < OFFLOAD_BYTES:
        return translate(state, text, ts_ms, settings)
    task = asyncio.ensure_future(asyncio.to_thread(translate, state, text, ts_ms, settings))
    task.add_done_callback(retrieve)
    state.parsing = task
    collected = await asyncio.shield(task)  # a cancelled scrape leaves the thread to finish
    state.parsing = None
    return collected


def translate(state: TargetState, text: str, ts_ms: int, settings: CollectorSettings) -> Collected:
    """The page's limits, then its translator (on the loop, or in a worker thread)."""
    check_sample_limit(text, settings.sample_limit)
    limit = settings.label_value_length_limit
    text, too_long = drop_long_labels(text, limit)
    collected: Collected = state.translator.translate_text(text, ts_ms)
    state.page.devices = collected.devices  # what an unchanged page shows the inventory
    if too_long:
        collected.drop("label_too_long", too_long, f"label values over {limit} characters")
    return collected


async def fetch(
    client: httpx.AsyncClient, url: str, limit: int, params: list[tuple[str, str]] | None = None
) -> str:
    # No per-read timeout: the scrape's deadline bounds the whole fetch (engine.py).
    async with client.stream("GET", url, params=params, timeout=None) as r:
        if r.status_code != 200:
            raise PageError(f"HTTP {r.status_code}", "http_status")
        chunks, size = [], 0
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise PageError(f"page larger than {limit} bytes", "page_too_large")
            chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("utf-8", errors="replace")


def health(state: TargetState, ts_ms: int, up: bool, duration: float, samples: int) -> list[Sample]:
    """The target's own series: up, duration, samples, refresh, what it dropped or skipped."""
    labels = state.self_labels()
    out = [
        Sample(SeriesKey("hbmwatch_target_up", labels), ts_ms, 1.0 if up else 0.0),
        Sample(SeriesKey("hbmwatch_scrape_duration_seconds", labels), ts_ms, duration),
    ]
    if up:
        out.append(Sample(SeriesKey("hbmwatch_scrape_samples", labels), ts_ms, float(samples)))
        refresh = state.page.refresh_seconds(ts_ms)
        if refresh is not None:  # written once the target served an unchanged page
            key = SeriesKey("hbmwatch_target_refresh_seconds", labels)
            out.append(Sample(key, ts_ms, refresh))
    for name, total in (
        ("hbmwatch_scrape_skipped_ticks_total", state.skipped_ticks),
        ("hbmwatch_scrape_late_total", state.late_scrapes),
    ):
        if total:  # written once the target has fallen behind: no cost before
            out.append(Sample(SeriesKey(name, labels), ts_ms, float(total)))
    for reason, total in state.dropped.items():
        if reason in DROP_REASONS:
            key = SeriesKey("hbmwatch_scrape_dropped_total", {**labels, "reason": reason})
            out.append(Sample(key, ts_ms, float(total)))
    return out


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a worker thread's error seen: its scrape may have given up on it already."""
    if not task.cancelled():
        task.exception()
