"""Name checks and the domain errors, in one place so every room fails the same way.

Every domain error subclasses ``ValueError`` and carries the offending data, so the API can
turn any of them into a 4xx with a reason and the CLI into a one-line message.
"""

from __future__ import annotations

import math
import re
from typing import Any

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_LABEL_VALUE_LENGTH = 256


class HbmwatchError(ValueError):
    """Base of hbmwatch's domain errors; ``detail`` holds the offending data."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.detail = detail


class InvalidName(HbmwatchError):
    """A metric or label name that Prometheus would not accept."""


class UnknownMetric(HbmwatchError):
    """A metric that is not in the canonical model."""


class InvalidLabels(HbmwatchError):
    """Labels a metric does not declare, or values it does not allow."""


class CardinalityExceeded(HbmwatchError):
    """A new series past a series cap."""


class InvalidQuery(HbmwatchError):
    """A query that cannot be answered as asked (bad matcher, range, step, aggregation)."""


class QueryTooExpensive(InvalidQuery):
    """A query over one of its budgets (series, points, time); ``limit`` names the setting."""


class ConfigError(HbmwatchError):
    """A settings or scenario value that cannot be used; names the field."""


def check_metric_name(name: str) -> str:
    """Return ``name`` if Prometheus accepts it as a metric name.

    >>> check_metric_name("gpu_power_watts")
    'gpu_power_watts'
    >>> check_metric_name("1bad")
    Traceback (most recent call last):
    ...
    hbmwatch.validation.InvalidName: invalid metric name '1bad'
    """
    if not METRIC_NAME_RE.match(name):
        raise InvalidName(f"invalid metric name {name!r}", name=name)
    return name


def check_label_name(name: str) -> str:
    if not LABEL_NAME_RE.match(name) or name.startswith("__"):
        raise InvalidName(f"invalid label name {name!r}", name=name)
    return name


def check_label_value(name: str, value: str) -> str:
    if len(value) > MAX_LABEL_VALUE_LENGTH:
        raise InvalidLabels(
            f"label {name} is {len(value)} characters long, over {MAX_LABEL_VALUE_LENGTH}",
            label=name,
        )
    return value


_UNITS = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0,
          "s": 1.0, "ms": 0.001}  # fmt: skip
# Prometheus's spelling: units largest first, each at most once ("1h30m", "2w", "500ms"); a
# number may carry a fraction ("1.5h") and parts may be spaced ("1h 30m").
_DURATION = re.compile(
    r"^\s*"
    + "".join(rf"(?:(\d+(?:\.\d+)?){unit}{'(?!s)' if unit == 'm' else ''}\s*)?" for unit in _UNITS)
    + r"$"
)
_SECONDS = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")
DURATION_HELP = (
    "seconds (90) or a number with units y, w, d, h, m, s, ms, largest first (1h30m, 7d)"
)


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration string.

    Every duration people type (silences, scenario timings, API steps) goes through here, so
    they all accept the same spellings and fail with the same message.

    >>> parse_duration("1h30m"), parse_duration("90s"), parse_duration(12), parse_duration("2w")
    (5400.0, 90.0, 12.0, 1209600.0)
    >>> parse_duration("1d12h"), parse_duration("250ms"), parse_duration("3600")
    (129600.0, 0.25, 3600.0)
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration: use {DURATION_HELP}")
    if isinstance(value, int | float) or (isinstance(value, str) and _SECONDS.match(value)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)) and any(m.groups()):
        seconds = sum(
            float(n) * unit for n, unit in zip(m.groups(), _UNITS.values(), strict=True) if n
        )
    else:
        raise ValueError(f"{value!r} is not a duration: use {DURATION_HELP}")
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a duration: it must be finite")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds
