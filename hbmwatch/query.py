"""Series selectors: a metric name plus label matchers (=, !=, =~, !~), as in PromQL.

Regular expressions are anchored at both ends, as Prometheus anchors them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from hbmwatch.records import SeriesKey
from hbmwatch.validation import InvalidQuery, check_label_name, check_metric_name


class MatchOp(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


class Aggregation(StrEnum):
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    SUM = "sum"
    COUNT = "count"
    LAST = "last"
    QUANTILE = "quantile"


@dataclass(frozen=True)
class Matcher:
    label: str
    op: MatchOp
    value: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, label: str, op: str, value: str) -> Matcher:
        check_label_name(label)
        try:
            match_op = MatchOp(op)
        except ValueError:
            raise InvalidQuery(f"unknown match operator {op!r}", operator=op) from None
        regex = None
        if match_op in (MatchOp.RE, MatchOp.NRE):
            try:
                regex = re.compile(f"(?:{value})")
            except re.error as exc:
                raise InvalidQuery(
                    f"bad regular expression {value!r}: {exc}", regex=value
                ) from None
        return cls(label, match_op, value, regex)

    def matches(self, actual: str) -> bool:
        if self.op is MatchOp.EQ:
            return actual == self.value
        if self.op is MatchOp.NE:
            return actual != self.value
        assert self._regex is not None
        hit = self._regex.fullmatch(actual) is not None
        return hit if self.op is MatchOp.RE else not hit


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...] = ()

    def matches(self, key: SeriesKey) -> bool:
        if key.metric != self.metric:
            return False
        labels = key.label_dict
        return all(m.matches(labels.get(m.label, "")) for m in self.matchers)

    def __str__(self) -> str:
        body = ",".join(f'{m.label}{m.op.value}"{m.value}"' for m in self.matchers)
        return f"{self.metric}{{{body}}}"


_SELECTOR_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.S)
_MATCHER_RE = re.compile(
    r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)'
)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_selector(text: str) -> Selector:
    """Parse ``metric{label="v",other=~"re"}``.

    >>> s = parse_selector('gpu_power_watts{host="n1",gpu=~"0|1"}')
    >>> s.metric, [(m.label, m.op.value, m.value) for m in s.matchers]
    ('gpu_power_watts', [('host', '=', 'n1'), ('gpu', '=~', '0|1')])
    >>> parse_selector('gpu_power_watts{host=n1}')
    Traceback (most recent call last):
    ...
    hbmwatch.validation.InvalidQuery: cannot parse matchers at 'host=n1': expected label="value"
    """
    match = _SELECTOR_RE.match(text)
    if not match:
        raise InvalidQuery(f'cannot parse selector {text!r}: expected metric{{label="value"}}')
    metric, body = match.group(1), match.group(2) or ""
    check_metric_name(metric)
    matchers: list[Matcher] = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _MATCHER_RE.match(body, pos)
        if not m:
            raise InvalidQuery(
                f'cannot parse matchers at {body[pos:]!r}: expected label="value"',
                selector=text,
            )
        value = _unescape(m.group(3))
        matchers.append(Matcher.of(m.group(1), m.group(2), value))
        pos = m.end()
    return Selector(metric, tuple(matchers))
