"""One scrape of one target: its state, the fetch, the page's limits, translation, health.

The engine (collector/engine.py) schedules scrapes; this module fetches each page under
one deadline (``Deadline``: connect, headers and body together, since a per-read timeout
never ends a trickled page), then translates it.  A page at least ``OFFLOAD_BYTES`` long
is translated in a worker thread, so one exploding target cannot starve the event loop
(and with it every other target and the API), unless the target's last page was about as
long and took under ``INLINE_SECONDS``: a known page costs less than the thread hop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hbmwatch.collector.http import Client
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
#: A big page about as long as the target's last one (within ``INLINE_SHARE``) whose
#: translation took less than this is translated on the loop.  Measured (2-core host,
#: 256-GPU fleet): a 120-140 KB exporter page of a known shape takes 1.3-2 ms, and its hop
#: to a thread and back two more wake-ups of the loop and a GIL hand-over each way.
INLINE_SECONDS = 0.005
INLINE_SHARE = 0.25
#: A deadline that fires this late found the loop itself stalled (see ``Deadline``).
STALL_SECONDS = 0.25


def translator_for(target: Target, settings: CollectorSettings) -> Any:
    labels, cap = target.labels, settings.series_per_target
    window = settings.latency_window_seconds
    if target.kind in ("dme", "dcgm"):
        kind = DmeTranslator if target.kind == "dme" else DcgmTranslator
        translator = kind(labels, series_cap=cap)
        translator.attribution.cap = settings.workload_label_cap
        return translator
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
    client: Client | None = None
    #: A page still being parsed in a worker thread after its scrape's deadline passed.
    parsing: asyncio.Future[Collected] | None = None
    capped_at_reset: int = 0  # series dropped by the target's limits at the last cache reset
    skipped_ticks: int = 0
    late_scrapes: int = 0
    behind_mark: tuple[int, int] = (0, 0)  # skipped, late when the last warning counted them
    page: PageMemory = field(default_factory=PageMemory)  # unchanged pages (collector/refresh.py)
    #: The last translated page's length and seconds (inf: none yet, or the memo was reset).
    translated: tuple[int, float] = (0, math.inf)

    #: The health series' keys, by name (and drop reason): built once, not every scrape.
    keys: dict[str, SeriesKey] = field(default_factory=dict)

    def self_labels(self) -> dict[str, str]:
        base = {k: v for k, v in self.target.labels.items() if k in ("cluster", "rack", "host")}
        return {**base, "target": self.target.url, "source": self.target.kind}

    def inline(self, size: int) -> bool:
        """Whether a page of ``size`` characters is cheap enough for the loop."""
        last, seconds = self.translated
        return size < OFFLOAD_BYTES or (
            seconds < INLINE_SECONDS and abs(size - last) <= last * INLINE_SHARE
        )

    def key(self, name: str, reason: str = "") -> SeriesKey:
        """The target's own series ``name`` (``reason``: of the dropped-samples counter)."""
        key = self.keys.get(name + reason)
        if key is None:
            labels = self.self_labels()
            key = SeriesKey(name, {**labels, "reason": reason} if reason else labels)
            self.keys[name + reason] = key
        return key


@dataclass
class ScrapeReport:
    target: str
    up: bool
    samples: int
    dropped: dict[str, int]
    duration_s: float
    error: str = ""
    reason: str = ""


class Deadline:
    """``asyncio.timeout`` over a scrape's fetch, forgiving one stall of our own loop.

    The fetch (connect, headers, body) is cancelled ``timeout`` seconds after entry, and
    leaves with ``TimeoutError``.  A deadline that fires more than ``STALL_SECONDS`` late
    found this process's own loop stalled (a GC pass, a busy host): that time was ours, not
    the target's, so the fetch gets one more ``timeout`` before the target counts as down.
    No task is made: the fetch runs in the scrape's own.
    """

    __slots__ = ("_cancelling", "_expired", "_extended", "_handle", "_loop", "_task", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    async def __aenter__(self) -> Deadline:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cancelling = task, task.cancelling()
        self._expired = self._extended = False
        self._arm()
        return self

    def _arm(self) -> None:
        at = self._loop.time() + self.timeout
        self._handle = self._loop.call_at(at, self._fire, at)

    def _fire(self, at: float) -> None:
        if self._loop.time() - at >= STALL_SECONDS and not self._extended:
            self._extended = True  # woke late: the loop stalled, not the target
            self._arm()
            return
        self._expired = True
        self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        self._handle.cancel()
        expired = self._expired and self._task.uncancel() <= self._cancelling  # ours, not a stop
        if expired and kind is asyncio.CancelledError:
            raise TimeoutError from exc  # type: ignore[misc]


async def collect(
    state: TargetState, client: Client, settings: CollectorSettings, ts_ms: int
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
    async with Deadline(target.timeout_seconds):
        body = await client.get(url, settings.max_page_bytes, params)
    text = decode(body)
    skips = settings.skip_unchanged_pages and target.kind in SKIPS_UNCHANGED
    if skips and state.page.same(text, ts_ms, state.up is True):
        return Collected(devices=state.page.devices)  # not refreshed: nothing new to store
    if state.inline(len(text)):
        return translate(state, text, ts_ms, settings)
    task = asyncio.ensure_future(asyncio.to_thread(translate, state, text, ts_ms, settings))
    task.add_done_callback(retrieve)
    state.parsing = task
    collected = await asyncio.shield(task)  # a cancelled scrape leaves the thread to finish
    state.parsing = None
    return collected


def translate(state: TargetState, text: str, ts_ms: int, settings: CollectorSettings) -> Collected:
    """The page's limits, then its translator (on the loop, or in a worker thread)."""
    started, size = time.perf_counter(), len(text)
    check_sample_limit(text, settings.sample_limit)
    limit = settings.label_value_length_limit
    text, too_long = drop_long_labels(text, limit)
    collected: Collected = state.translator.translate_text(text, ts_ms)
    state.translated = (size, time.perf_counter() - started)
    state.page.devices = collected.devices  # what an unchanged page shows the inventory
    if too_long:
        collected.drop("label_too_long", too_long, f"label values over {limit} characters")
    return collected


def decode(body: bytes) -> str:
    """The page's text; bytes that are not UTF-8 become U+FFFD (the parser drops them)."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("utf-8", errors="replace")


def health(state: TargetState, ts_ms: int, up: bool, duration: float, samples: int) -> list[Sample]:
    """The target's own series: up, duration, samples, refresh, what it dropped or skipped."""
    key = state.key
    out = [
        Sample(key("hbmwatch_target_up"), ts_ms, 1.0 if up else 0.0),
        Sample(key("hbmwatch_scrape_duration_seconds"), ts_ms, duration),
    ]
    if up:
        out.append(Sample(key("hbmwatch_scrape_samples"), ts_ms, float(samples)))
        refresh = state.page.refresh_seconds(ts_ms)
        if refresh is not None:  # written once the target served an unchanged page
            out.append(Sample(key("hbmwatch_target_refresh_seconds"), ts_ms, refresh))
    if state.skipped_ticks:  # written once the target has fallen behind: no cost before
        skipped = float(state.skipped_ticks)
        out.append(Sample(key("hbmwatch_scrape_skipped_ticks_total"), ts_ms, skipped))
    if state.late_scrapes:
        out.append(Sample(key("hbmwatch_scrape_late_total"), ts_ms, float(state.late_scrapes)))
    for reason, total in state.dropped.items():
        if reason in DROP_REASONS:
            out.append(Sample(key("hbmwatch_scrape_dropped_total", reason), ts_ms, float(total)))
    return out


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a worker thread's error seen: its scrape may have given up on it already."""
    if not task.cancelled():
        task.exception()
