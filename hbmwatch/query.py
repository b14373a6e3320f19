"""Series selectors: a metric name plus label matchers (=, !=, =~, !~), as in PromQL, and the
time budget every query runs under.

The matcher grammar and the regex engine (RE2, anchored at both ends as Prometheus anchors
them) are ``hbmwatch.matchers``'; this module adds the metric name around them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum

from hbmwatch.matchers import Matcher, MatchOp, parse_matchers, quote
from hbmwatch.records import SeriesKey
from hbmwatch.validation import InvalidQuery, QueryTooExpensive, check_metric_name

__all__ = [
    "Aggregation",
    "MatchOp",
    "Matcher",
    "Selector",
    "check_time_budget",
    "parse_selector",
    "time_budget",
]


class Aggregation(StrEnum):
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    SUM = "sum"
    COUNT = "count"
    LAST = "last"
    QUANTILE = "quantile"


#: (monotonic deadline, the budget in seconds) of the query running in this context.
_budget: ContextVar[tuple[float, float] | None] = ContextVar("query_budget", default=None)


@contextmanager
def time_budget(seconds: float | None) -> Iterator[None]:
    """Run a query under a time budget: ``check_time_budget`` raises once it is spent.

    The budget is checked between series (selection, conversion), so one query cannot hold a
    worker thread long after its answer stopped being useful.
    """
    if seconds is None:
        yield
        return
    token = _budget.set((time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _budget.reset(token)


def check_time_budget() -> None:
    """Raise ``QueryTooExpensive`` naming the budget when this context's query is past it."""
    budget = _budget.get()
    if budget is not None and time.monotonic() > budget[0]:
        raise QueryTooExpensive(
            f"the query ran past its time budget of {budget[1]:g} s "
            "(api.query_timeout_seconds); add matchers, shorten the range or widen step",
            limit="api.query_timeout_seconds",
            budget_seconds=budget[1],
        )


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...] = ()

    def matches(self, key: SeriesKey) -> bool:
        check_time_budget()
        if key.metric != self.metric:
            return False
        labels = key.label_dict
        return all(m.matches(labels.get(m.label, "")) for m in self.matchers)

    def __str__(self) -> str:
        body = ",".join(f"{m.label}{m.op.value}{quote(m.value)}" for m in self.matchers)
        return f"{self.metric}{{{body}}}"


_SELECTOR_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.S)


def parse_selector(text: str) -> Selector:
    """Parse ``metric{label="v",other=~"re"}``; simple values need no quotes.

    >>> s = parse_selector('gpu_power_watts{host=n1,gpu=~"0|1"}')
    >>> s.metric, [(m.label, m.op.value, m.value) for m in s.matchers]
    ('gpu_power_watts', [('host', '=', 'n1'), ('gpu', '=~', '0|1')])
    >>> parse_selector('gpu_power_watts{host=~"(?=n)"}')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    hbmwatch.validation.InvalidQuery: bad regular expression '(?=n)': invalid perl operator: ...
    """
    match = _SELECTOR_RE.match(text)
    if not match:
        raise InvalidQuery(f'cannot parse selector {text!r}: expected metric{{label="value"}}')
    metric, body = match.group(1), match.group(2) or ""
    check_metric_name(metric)
    return Selector(metric, tuple(parse_matchers(body)))
