"""Name checks and the domain errors, in one place so every room fails the same way.

Every domain error subclasses ``ValueError`` and carries the offending data, so the API can
turn any of them into a 4xx with a reason and the CLI into a one-line message.
"""

from __future__ import annotations

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


_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$"
)


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``90s``, ``15m``, ``1h30m``.

    >>> parse_duration("1h30m"), parse_duration("90s"), parse_duration(12)
    (5400.0, 90.0, 12.0)
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif (
        isinstance(value, str)
        and value.strip()
        and (m := _DURATION.match(value))
        and any(m.groups())
    ):
        h, mi, s = (float(x) if x else 0.0 for x in m.groups())
        seconds = h * 3600 + mi * 60 + s
    else:
        raise ValueError(f"{value!r} is not a duration (use seconds or e.g. '90s', '15m', '1h')")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds
