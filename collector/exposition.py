"""A Prometheus text-format parser that pays for each series once, not on every scrape.

A target serves the same series scrape after scrape; only the values change.  So the part
of a line before its value (``name{labels}``) is parsed once and remembered in a
``SeriesCache`` owned by the target; later scrapes split off the value and look the rest up.
prometheus_client's parser re-parses every label on every scrape; ``hbmwatch bench collect``
measures both on the same pages, and tests check that the two agree (fixtures, fuzzing).

A bad line is counted and skipped; it never costs the rest of the page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


class MalformedLine(ValueError):
    """A line that is not in the text format; carries the line."""


@dataclass(frozen=True, slots=True)
class SeriesRef:
    """A parsed series: metric name and labels, as they appear on the page."""

    name: str
    labels: tuple[tuple[str, str], ...]

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(slots=True)
class ParsedSample:
    key: str  # the line up to its value: what adapters cache their mapping under
    series: SeriesRef
    value: float
    timestamp_ms: int | None


@dataclass
class ParsedPage:
    samples: list[ParsedSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    malformed: int = 0
    series_capped: int = 0
    first_errors: list[str] = field(default_factory=list)

    def error(self, line: str, why: str) -> None:
        self.malformed += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(f"{why}: {line[:200]!r}")


def parse_value(text: str) -> float:
    """A sample value: a float, ``+Inf``, ``-Inf`` or ``NaN`` (Go's spellings too).

    >>> parse_value("2.776148269e+09"), parse_value("+Inf"), math.isnan(parse_value("NaN"))
    (2776148269.0, inf, True)
    """
    try:
        return float(text)
    except ValueError:
        lowered = text.lower()
        if lowered in ("+inf", "inf"):
            return math.inf
        if lowered == "-inf":
            return -math.inf
        if lowered == "nan":
            return math.nan
        raise


def parse_series(text: str) -> SeriesRef:
    """Parse ``name{a="1",b="x\\"y"}`` (labels optional, trailing comma allowed).

    >>> parse_series('gpu_clock{clock_type="system",gpu_id="0"}').labels
    (('clock_type', 'system'), ('gpu_id', '0'))
    """
    match = _NAME.match(text)
    if not match:
        raise MalformedLine("no metric name")
    name = match.group()
    pos = match.end()
    n = len(text)
    while pos < n and text[pos] in " \t":
        pos += 1
    if pos == n:
        return SeriesRef(name, ())
    if text[pos] != "{":
        raise MalformedLine("expected '{' or the end after the metric name")
    labels: list[tuple[str, str]] = []
    pos += 1
    while True:
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] == "}":
            pos += 1
            break
        m = _LABEL_NAME.match(text, pos)
        if not m:
            raise MalformedLine("bad label name")
        label = m.group()
        pos = m.end()
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos + 1 >= n or text[pos] != "=":
            raise MalformedLine(f"expected '=' after label {label}")
        pos += 1
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos >= n or text[pos] != '"':
            raise MalformedLine(f"label {label} has no quoted value")
        pos += 1
        chars: list[str] = []
        while True:
            if pos >= n:
                raise MalformedLine(f"unterminated value of label {label}")
            c = text[pos]
            if c == "\\":
                if pos + 1 >= n:
                    raise MalformedLine("dangling escape")
                nxt = text[pos + 1]
                chars.append(_UNESCAPE.get(nxt, "\\" + nxt))
                pos += 2
            elif c == '"':
                pos += 1
                break
            else:
                chars.append(c)
                pos += 1
        labels.append((label, "".join(chars)))
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] == ",":
            pos += 1
            continue
        if pos < n and text[pos] == "}":
            pos += 1
            break
        raise MalformedLine("expected ',' or '}' between labels")
    if text[pos:].strip():
        raise MalformedLine("text after the labels")
    if len({k for k, _ in labels}) != len(labels):
        raise MalformedLine("a label appears twice")
    return SeriesRef(name, tuple(labels))


class SeriesCapExceeded(ValueError):
    """A new series past the target's series cap (a label explosion)."""


class SeriesCache:
    """A target's memory of the series part of its lines.

    It is also the target's series cap: once ``limit`` distinct series are known, new ones
    are refused (and counted) until ``clear()``, which the collector calls now and then so
    series that churn (pod names) do not lock the cap for ever.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._refs: dict[str, SeriesRef | MalformedLine] = {}

    def __len__(self) -> int:
        return len(self._refs)

    def clear(self) -> None:
        self._refs.clear()

    def get(self, key: str) -> SeriesRef:
        hit = self._refs.get(key)
        if hit is None:
            if len(self._refs) >= self.limit:
                raise SeriesCapExceeded(f"series cap of {self.limit} reached")
            try:
                hit = parse_series(key)
            except MalformedLine as exc:
                hit = exc
            self._refs[key] = hit
        if isinstance(hit, MalformedLine):
            raise hit
        return hit


def split_line(line: str) -> tuple[str, str, str | None]:
    """Series part, value and optional timestamp of a sample line."""
    head, _, last = line.rpartition(" ")
    if not head:
        raise MalformedLine("no value")
    head = head.rstrip()
    closing = head.rfind("}")
    if closing == -1:
        if " " in head.strip():  # name value timestamp
            series, _, value = head.rpartition(" ")
            return series.rstrip(), value, last
        return head, last, None
    if closing != len(head) - 1:  # name{...} value timestamp
        series, _, value = head.rpartition(" ")
        return series.rstrip(), value, last
    return head, last, None


def iter_lines(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        line = line.strip()
        if line:
            yield line


def parse(text: str, cache: SeriesCache | None = None) -> ParsedPage:
    """Parse a page; malformed lines are counted in ``ParsedPage.malformed``."""
    cache = cache if cache is not None else SeriesCache()
    page = ParsedPage()
    samples = page.samples
    get = cache.get
    seen: set[str] = set()
    for line in iter_lines(text):
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                page.types[parts[2]] = parts[3].strip()
            continue
        try:
            key, value_text, ts_text = split_line(line)
            series = get(key)
            value = parse_value(value_text)
            ts = int(float(ts_text)) if ts_text is not None else None
        except SeriesCapExceeded:
            page.series_capped += 1
            continue
        except (MalformedLine, ValueError, OverflowError) as exc:
            page.error(line, str(exc) or type(exc).__name__)
            continue
        if key in seen:
            page.error(line, "the same series twice on one page")
            continue
        seen.add(key)
        samples.append(ParsedSample(key, series, value, ts))
    return page


def family_of(name: str, types: dict[str, str]) -> tuple[str, str]:
    """The family a sample belongs to and its suffix (``_bucket``, ``_sum``, ``_count``)."""
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if types.get(base) in ("histogram", "summary", "counter") or suffix == "_bucket":
                return base, suffix
    return name, ""
