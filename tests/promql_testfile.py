"""Prometheus' PromQL test files (``promql/testdata/*.test``), read as Prometheus 2.42 reads them.

The format (Prometheus' ``promql/test.go``): ``load <interval>`` followed by series in the
expanding notation (``0+10x10``, ``1 _ 3``, ``_x3``, ``stale``, ``Inf``), ``clear``, and
``eval[_fail|_ordered] instant at <duration> <expr>`` followed by the expected series
(``{labels} value``) or one scalar.  A ``load`` gives a series' n-th value the timestamp
n * interval from 0.  ``Store`` holds what the loads so far wrote, as a ``SampleSource``.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hbmwatch.matchers import Matcher
from hbmwatch.promql.values import NAME, Labels, RawSeries

#: Prometheus' staleness marker: a NaN with these bits.
STALE_BITS = 0x7FF0000000000002
STALE_NAN = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]

_EVAL = re.compile(r"^eval(?:_(fail|ordered))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_LOAD = re.compile(r"^load\s+(.+?)$")
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|nan)")


class FormatError(ValueError):
    """A line the test format does not allow."""


def is_stale(value: float) -> bool:
    return math.isnan(value) and struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_BITS


def parse_duration(text: str) -> int:
    """Prometheus' ``model.ParseDuration`` in ms (``1h30m``, ``50m``, ``0``)."""
    if text == "0":
        return 0
    m = _DURATION.match(text)
    if not text or m is None:
        raise FormatError(f"bad duration {text!r}")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_MS, strict=True) if g)


def _unquote(token: str) -> str:
    if token[0] == "`":
        return token[1:-1]
    body = token[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), body)


def parse_metric(text: str) -> tuple[Labels, str]:
    """``name{a="1", b='2'}``, ``{...}`` or ``name``: the label set and the rest of the line."""
    pairs: dict[str, str] = {}
    pos = 0
    m = _NAME.match(text)
    if m:
        pairs[NAME] = m[0]
        pos = m.end()
    if pos < len(text) and text[pos] == "{":
        pos += 1
        while True:
            while pos < len(text) and text[pos] in " \t,":
                pos += 1
            if pos < len(text) and text[pos] == "}":
                pos += 1
                break
            lm = _LABEL.match(text, pos)
            sm = _STRING.match(text, lm.end()) if lm else None
            if lm is None or sm is None:
                raise FormatError(f"bad label set in {text!r}")
            pairs[lm[1]] = _unquote(sm[0])
            pos = sm.end()
    elif not pairs:
        raise FormatError(f"no metric in {text!r}")
    labels = tuple(sorted((k, v) for k, v in pairs.items() if v != ""))
    return labels, text[pos:]


def _number(text: str, pos: int) -> tuple[float, int]:
    m = _NUMBER.match(text, pos)
    if m is None:
        raise FormatError(f"expected a number at {text[pos:]!r}")
    return float(m[0]), m.end()


def _item(token: str) -> list[float | None]:
    """One space-separated item of a series: ``None`` where a value is omitted."""
    if token == "_":
        return [None]
    if token.startswith("_x"):
        return [None] * int(token[2:])
    if token == "stale":
        return [STALE_NAN]
    sign = -1.0 if token[0] == "-" else 1.0
    pos = 1 if token[0] in "+-" else 0
    if token.startswith("stale", pos):
        raise FormatError("a signed stale marker")
    start, pos = _number(token, pos)
    start *= sign
    if pos == len(token):
        return [start]
    delta = 0.0
    if token[pos] in "+-":
        step, end = _number(token, pos + 1)
        delta, pos = (step if token[pos] == "+" else -step), end
    if token[pos] != "x" or not token[pos + 1 :].isdigit():
        raise FormatError(f"bad series item {token!r}")
    out: list[float | None] = []
    value = start
    for _ in range(int(token[pos + 1 :]) + 1):
        out.append(value)
        value += delta  # accumulated as Prometheus does, so the same bits
    return out


def parse_series(line: str) -> tuple[Labels, list[float | None]]:
    """A series description: labels and the values, ``None`` for an omitted one."""
    labels, rest = parse_metric(line)
    values: list[float | None] = []
    for token in rest.split():
        values.extend(_item(token))
    return labels, values


def parse_number(text: str) -> float | None:
    """Go's ``ParseInt(s, 0, 64)`` then ``ParseFloat``: a scalar expectation, else None."""
    try:
        return float(int(text, 0))
    except ValueError:
        pass
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class Load:
    interval_ms: int
    series: dict[Labels, list[tuple[int, float]]]


@dataclass
class Clear:
    pass


@dataclass
class Expected:
    labels: Labels
    value: float
    pos: int


@dataclass
class Eval:
    """One ``eval`` command: ``line`` is its line number (1-based) in the file."""

    expr: str
    at_ms: int
    line: int
    fail: bool = False
    ordered: bool = False
    scalar: float | None = None
    series: list[Expected] = field(default_factory=list)


Command = Load | Clear | Eval


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.split("\n"):
        line = raw.strip()
        out.append("" if line.startswith("#") else line)
    return out


def _load(lines: list[str], i: int) -> tuple[int, Load]:
    m = _LOAD.match(lines[i])
    if m is None:
        raise FormatError(f"line {i + 1}: bad load command")
    gap = parse_duration(m[1])
    cmd = Load(gap, {})
    while i + 1 < len(lines) and lines[i + 1]:
        i += 1
        labels, values = parse_series(lines[i])
        cmd.series[labels] = [(n * gap, v) for n, v in enumerate(values) if v is not None]
    return i, cmd


def _eval(lines: list[str], i: int) -> tuple[int, Eval]:
    m = _EVAL.match(lines[i])
    if m is None:
        raise FormatError(f"line {i + 1}: bad eval command")
    cmd = Eval(m[3], parse_duration(m[2] or ""), i + 1, m[1] == "fail", m[1] == "ordered")
    pos = 0
    while i + 1 < len(lines) and lines[i + 1]:
        i += 1
        pos += 1
        number = parse_number(lines[i])
        if number is not None:
            cmd.scalar = number
            break
        labels, values = parse_series(lines[i])
        if len(values) != 1 or values[0] is None:
            raise FormatError(f"line {i + 1}: an expected series needs one value")
        cmd.series.append(Expected(labels, values[0], pos))
    return i, cmd


def parse_file(text: str) -> list[Command]:
    """The commands of one test file, in order."""
    lines = _lines(text)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        word = lines[i].split(maxsplit=1)[0].lower() if lines[i] else ""
        if word == "clear":
            commands.append(Clear())
        elif word == "load":
            i, load = _load(lines, i)
            commands.append(load)
        elif word.startswith("eval"):
            i, ev = _eval(lines, i)
            commands.append(ev)
        elif word:
            raise FormatError(f"line {i + 1}: unknown command {lines[i]!r}")
        i += 1
    return commands


def read_file(path: Path) -> list[Command]:
    return parse_file(path.read_text(encoding="utf-8"))


class Store:
    """Series in memory, as a ``SampleSource``: what the loads so far appended, staleness
    markers (``stale``) included, as Prometheus' storage returns them to its engine."""

    def __init__(self) -> None:
        self.data: dict[Labels, list[tuple[int, float]]] = {}
        self.warnings: list[str] = []

    def load(self, cmd: Load) -> None:
        """Append as Prometheus' TSDB head appends: in time order per series."""
        for labels, samples in cmd.series.items():
            have = self.data.setdefault(labels, [])
            for t, v in samples:
                if have and t <= have[-1][0]:
                    if t == have[-1][0] and _same(v, have[-1][1]):
                        continue
                    raise FormatError(f"out-of-order or duplicate sample for {labels} at {t}")
                have.append((t, v))

    def select(self, matchers: Sequence[Matcher], lo: int, hi: int) -> list[RawSeries]:
        out = []
        for labels in sorted(self.data):
            got = dict(labels)
            if not all(m.matches(got.get(m.label, "")) for m in matchers):
                continue
            window = [(t, v) for t, v in self.data[labels] if lo <= t <= hi]
            if window:
                times = np.array([t for t, _ in window], dtype=np.int64)
                values = np.array([v for _, v in window], dtype=np.float64)
                out.append(RawSeries(labels, times, values))
        return out


def _same(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)
