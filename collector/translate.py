"""What every source adapter shares: the result type, identity labels, per-line caching.

An adapter turns one scrape (or one read of a library or command) into canonical samples,
counts what it had to drop and why, and reports the devices it saw for the inventory.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

from hbmwatch.collector import attribution
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


_HEAD, _TAIL = operator.itemgetter(0), operator.itemgetter(2)
_NEW = tuple.__new__  # a Sample without NamedTuple's Python-level __new__


def _picker(lines: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """What takes the items at ``lines`` out of a sequence, as a tuple, in one C call."""
    if not lines:
        return lambda values: ()
    if len(lines) == 1:
        return lambda values: (values[lines[0]],)
    return operator.itemgetter(*lines)  # type: ignore[return-value]


_NOTHING = _picker([])


@dataclass(slots=True)
class _Shape:
    """What each line of a page of one shape is: a plain series (key and factor), a
    special line for ``_finish``, or a drop; recognised by its lines up to their values."""

    heads: list[str]  # each line of the page up to its last space, comments too
    samples_of: Callable[[Sequence[Any]], tuple[Any, ...]]  # page lines -> sample lines
    plain_of: Callable[[Sequence[Any]], tuple[Any, ...]]  # sample values -> plain ones
    keys: list[SeriesKey]
    factors: list[float]
    special: list[tuple[int, Mapped]]  # (sample line, what it is)
    drops: Counter[str]
    twice: list[str]  # what the loop says of each repeated series ("malformed")
    usable: bool = True  # False: a page of this shape is read line by line every time
    pending: bool = False  # seen once: built if the next page has the same lines
    workloads: list[SeriesKey] = field(default_factory=list)  # gpu_workload_info keys


class LineTranslator:
    """Exporter pages whose lines map one to one onto canonical series (DME, dcgm-exporter).

    The page is read in one pass: each line is split at its last space, and the part
    before it (``name{labels}``) is looked up in a per-target memo of what it maps to, so a
    series' labels are parsed and mapped once, on the first scrape that shows it; later
    scrapes only convert the value.  The memo doubles as the target's series cap.  Lines
    that need more than a factor (``Mapped.special``, or an older alias with a
    ``priority``) are handed to ``_finish`` at the end of the page.

    A page whose lines, up to their values, are those of the page before (the common case)
    skips even the per-line lookups: its ``_Shape``, built from the memo when a second page
    in a row shows the same lines (pages that change every time pay no build), says which
    lines are plain series (converted and turned into samples by C-level maps), special,
    or dropped.  A page with a bad, non-finite or sentinel value
    is read line by line, so what it drops is counted as before.
    """

    #: Values at or above this are checked with ``is_sentinel`` (dcgm-exporter's blanks).
    sentinel_floor = math.inf

    def __init__(self, series_cap: int = 200_000) -> None:
        self.series_cap = series_cap
        self._memo: dict[str, Mapped] = {}
        #: The common case, looked up first: line key -> (canonical series, factor).
        self._plain: dict[str, tuple[SeriesKey, float]] = {}
        self._shape: _Shape | None = None
        self._devices: dict[tuple[str, str, str, str], Device] = {}
        #: What runs on the devices: line key -> its gpu_workload_info key (lines naming one).
        self.attribution = attribution.Attribution()
        self._workloads: dict[str, SeriesKey] = {}

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
        self._shape = None
        self._workloads.clear()
        self.attribution.clear()

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        """A page of the last page's shape goes through its ``_Shape`` (values only); any
        other, or one with a bad, non-finite or sentinel value, line by line."""
        parts = list(map(str.rpartition, text.split("\n"), repeat(" ")))
        heads = list(map(_HEAD, parts))  # each line up to its last space
        shape = self._shape
        if shape is not None and shape.heads == heads:
            if shape.pending:  # the second page of this shape in a row: worth a _Shape
                shape = self._shape = self._shape_of(parts, heads)
            out = self._shaped(shape, parts, ts_ms) if shape.usable else None
            return out if out is not None else self.translate_lines(text, ts_ms)
        out = self.translate_lines(text, ts_ms)
        self._shape = _Shape(heads, _NOTHING, _NOTHING, [], [], [], Counter(), [], False, True)
        return out

    def _shaped(self, shape: _Shape, parts: list[Any], ts_ms: int) -> Collected | None:
        try:
            values = list(map(float, map(_TAIL, shape.samples_of(parts))))
        except ValueError:
            return None
        plain = shape.plain_of(values)
        if plain and not math.isfinite(sum(plain)):
            return None  # a non-finite value: counted line by line
        floor, blank = self.sentinel_floor, self.is_sentinel
        if plain and max(plain) >= floor and any(map(blank, filter(floor.__le__, plain))):
            return None  # a sentinel (dcgm-exporter's blank): counted line by line
        out = Collected()
        scaled = map(operator.mul, plain, shape.factors)
        out.samples = list(map(_NEW, repeat(Sample), zip(shape.keys, repeat(ts_ms), scaled)))
        for why in shape.twice:
            out.drop("malformed", why=why)
        if shape.drops:
            out.dropped.update(shape.drops)
        if shape.workloads:
            attribution.emit(out.samples, out.dropped, shape.workloads, ts_ms)
        if shape.special:
            self._finish(out, [(m, values[i]) for i, m in shape.special], ts_ms)
        return out

    def _shape_of(self, parts: list[Any], heads: list[str]) -> _Shape:
        """The page's shape, from the memo the page just filled; not ``usable`` where a
        line needed more than its series looked up (a timestamp, odd spacing, malformed or
        capped)."""
        lines: list[int] = []
        shape = _Shape(heads, _NOTHING, _NOTHING, [], [], [], Counter(), [])
        unusable = _Shape(heads, _NOTHING, _NOTHING, [], [], [], Counter(), [], False)
        seen: set[str] = set()
        plain_lines: list[int] = []
        workloads = self._workloads
        for i, (head, space, tail) in enumerate(parts):
            line = head + space + tail
            if not line or line[0] == "#":
                continue
            if line[-1] in " \t\r" or line[0] in " \t":
                return unusable
            m = self._memo.get(head)
            if m is None:
                return unusable
            if head in seen:
                shape.twice.append(f"the same series twice on one page: {head[:120]}")
                continue
            seen.add(head)
            if workloads:
                shape.workloads.append(workloads.get(head))  # type: ignore[arg-type]
            n = len(lines)
            lines.append(i)
            if head in self._plain:
                plain_lines.append(n)
                shape.keys.append(m.key)  # type: ignore[arg-type]
                shape.factors.append(m.scale)
            elif m.special or m.priority:
                shape.special.append((n, m))
            elif m.drop != "ignored":
                shape.drops[m.drop or "unmapped"] += 1
        shape.samples_of, shape.plain_of = _picker(lines), _picker(plain_lines)
        shape.workloads = attribution.distinct(shape.workloads)
        return shape

    def translate_lines(self, text: str, ts_ms: int) -> Collected:
        """The page read line by line (every page's first scrape; the reference the
        shaped path is tested against)."""
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
        if self._workloads:  # only targets that name workloads pay this pass
            found = attribution.distinct(map(self._workloads.get, seen))
            attribution.emit(samples, dropped, found, ts_ms)
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
        device = self._devices.get(m.device) if m.device is not None else None
        if device is not None:
            workload = self.attribution.key_for(device, series.labels)
            if workload is not None:
                self._workloads[key] = workload
        return key, value_text, m
