"""What every source adapter shares: the result type, identity labels, per-line caching.

An adapter turns one scrape (or one read of a library or command) into canonical samples,
counts what it had to drop and why, and reports the devices it saw for the inventory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hbmwatch.collector.exposition import (
    MalformedLine,
    SeriesRef,
    parse_series,
    parse_value,
    split_line,
)
from hbmwatch.metrics import SCOPE_LABELS, Scope
from hbmwatch.records import Device, Sample, SeriesKey
from hbmwatch.skus import lookup

#: Compute-partition modes -> logical devices per physical GPU.
PARTITIONS = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4, "cpx": 8}
DEVICE_LABELS = frozenset(SCOPE_LABELS[Scope.DEVICE])


@dataclass
class Collected:
    """One collection's canonical samples, what was dropped (by reason), devices seen."""

    samples: list[Sample] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    devices: dict[tuple[str, str, str, str], Device] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def drop(self, reason: str, n: int = 1, why: str | None = None) -> None:
        self.dropped[reason] += n
        if why and len(self.errors) < 5:
            self.errors.append(why)

    def add(self, key: SeriesKey, ts_ms: int, value: float) -> None:
        if math.isfinite(value):
            self.samples.append(Sample(key, ts_ms, value))
        else:
            self.dropped["non_finite"] += 1


class PageTranslator(Protocol):
    """Turns one scrape of a target into canonical samples (keeps per-target state)."""

    def translate_text(self, text: str, ts_ms: int) -> Collected: ...


@dataclass(frozen=True, slots=True)
class Mapped:
    """What one series on a page becomes: a canonical series and a factor, or a drop reason.

    ``special`` marks values that need more than a factor (AMD violation ticks, a
    percentage read as an active flag, a bitmask to decode).
    """

    key: SeriesKey | None
    scale: float = 1.0
    drop: str | None = None
    special: str | None = None
    priority: int = 0
    device: tuple[str, str, str, str] | None = None


def device_for(
    static: Mapping[str, str],
    *,
    host: str,
    gpu: str,
    vendor: str,
    model: str = "",
    partition: str = "",
    uuid: str = "",
    serial: str = "",
    compute_partition: str = "",
    memory_partition: str = "",
    driver: str = "",
) -> Device:
    """A device identity: target labels (cluster, rack, host) win over the page's."""
    sku = lookup(model) if model else None
    return Device(
        host=static.get("host") or host,
        gpu=gpu,
        cluster=static.get("cluster", ""),
        rack=static.get("rack", ""),
        partition=partition,
        uuid=uuid,
        serial=serial,
        vendor=vendor,
        sku=sku.name if sku else model,
        compute_partition=compute_partition,
        memory_partition=memory_partition,
        driver=driver,
    )


class TickPeriod:
    """Seconds per tick of an accumulator whose tick is not documented (AMD's violation
    counters), measured against the wall clock and snapped to a power of ten so the
    converted counter never jitters; 1 ms until measured."""

    DEFAULT = 1e-3
    MIN_SPAN_MS = 5_000

    def __init__(self) -> None:
        self._first: dict[object, tuple[int, float]] = {}
        self._period: dict[object, float] = {}

    def observe(self, device: object, ts_ms: int, ticks: float) -> float:
        """The device's period; a non-finite counter reading (``+Inf``) measures nothing."""
        if device in self._period:
            return self._period[device]
        if not math.isfinite(ticks):
            return self.DEFAULT
        first = self._first.setdefault(device, (ts_ms, ticks))
        span_ms, moved = ts_ms - first[0], ticks - first[1]
        if span_ms >= self.MIN_SPAN_MS and math.isfinite(moved) and moved > 0:
            exponent = round(math.log10(span_ms / 1000) - math.log10(moved))
            if -300 <= exponent <= 300:  # past that, 10.0 ** exponent overflows
                period = self._period[device] = 10.0**exponent
                return period
        return self.DEFAULT


def add_fallbacks(out: Collected, fallback: list[tuple[Mapped, float]], ts_ms: int) -> None:
    """Older aliases (``Mapped.priority`` > 0) only where the current family was absent."""
    if not fallback:
        return
    metrics = {m.key.metric for m, _ in fallback if m.key is not None}
    seen = {s.series for s in out.samples if s.series.metric in metrics}
    for m, value in sorted(fallback, key=lambda pair: pair[0].priority):
        if m.key not in seen:
            seen.add(m.key)  # type: ignore[arg-type]
            out.add(m.key, ts_ms, value * m.scale)  # type: ignore[arg-type]


class LineTranslator:
    """Exporter pages whose lines map one to one onto canonical series (DME, dcgm-exporter).

    The page is read in one pass: each line is split at its last space, and the part
    before it (``name{labels}``) is looked up in a per-target memo of what it maps to, so a
    series' labels are parsed and mapped once, on the first scrape that shows it; later
    scrapes only convert the value.  The memo doubles as the target's series cap.  Lines
    that need more than a factor (``Mapped.special``, or an older alias with a
    ``priority``) are handed to ``_finish`` at the end of the page.
    """

    #: Values at or above this are checked with ``is_sentinel`` (dcgm-exporter's blanks).
    sentinel_floor = math.inf

    def __init__(self, series_cap: int = 200_000) -> None:
        self.series_cap = series_cap
        self._memo: dict[str, Mapped] = {}
        #: The common case, looked up first: line key -> (canonical series, factor).
        self._plain: dict[str, tuple[SeriesKey, float]] = {}

    @staticmethod
    def is_sentinel(value: float) -> bool:
        return False

    def _map(self, series: SeriesRef) -> Mapped:
        raise NotImplementedError

    def _finish(self, out: Collected, special: list[tuple[Mapped, float]], ts_ms: int) -> None:
        """Handle the special lines of one page (ticks, flags, bitmasks, aliases)."""

    def clear(self) -> None:
        self._memo.clear()
        self._plain.clear()

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        out = Collected()
        samples, dropped, plain = out.samples, out.dropped, self._plain
        special: list[tuple[Mapped, float]] = []
        seen: set[str] = set()
        new = tuple.__new__  # a Sample without NamedTuple's Python-level __new__
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            if line[-1] in " \t\r":
                line = line.strip()
                if not line or line[0] == "#":
                    continue
            key, _, value_text = line.rpartition(" ")
            hit = plain.get(key)
            m = None
            if hit is None:
                m = self._memo.get(key)
                if m is None:
                    found = self._miss(line, out)
                    if found is None:
                        continue
                    key, value_text, m = found
                    hit = plain.get(key)
            if key in seen:
                out.drop("malformed", why=f"the same series twice on one page: {key[:120]}")
                continue
            seen.add(key)
            try:
                value = float(value_text)
            except ValueError:
                try:
                    value = parse_value(value_text)
                except ValueError:
                    out.drop("malformed", why=f"bad value: {line[:120]}")
                    continue
            if hit is not None:
                if value - value != 0:
                    dropped["non_finite"] += 1
                elif value >= self.sentinel_floor and self.is_sentinel(value):
                    dropped["sentinel"] += 1
                else:
                    samples.append(new(Sample, (hit[0], ts_ms, value * hit[1])))
            elif m is not None and (m.special or m.priority):
                special.append((m, value))
            elif m is not None and m.drop != "ignored":
                dropped[m.drop or "unmapped"] += 1
        if special:
            self._finish(out, special, ts_ms)
        return out

    def _miss(self, line: str, out: Collected) -> tuple[str, str, Mapped] | None:
        """A line whose series this target has not mapped yet: parse it in full."""
        try:
            key, value_text, _timestamp = split_line(line)
        except MalformedLine as exc:
            out.drop("malformed", why=f"{exc}: {line[:120]}")
            return None
        m = self._memo.get(key)
        if m is not None:
            return key, value_text, m
        if len(self._memo) >= self.series_cap:
            out.drop("series_cap", why=f"series cap of {self.series_cap} reached")
            return None
        try:
            series = parse_series(key)
        except MalformedLine as exc:
            out.drop("malformed", why=f"{exc}: {line[:120]}")
            return None
        m = self._memo[key] = self._map(series)
        if m.key is not None and not m.special and not m.priority:
            self._plain[key] = (m.key, m.scale)
        return key, value_text, m
