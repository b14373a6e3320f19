"""Label matchers on alerts, as Alertmanager spells them (``=``, ``!=``, ``=~``, ``!~``).

The matching itself is the series selectors' (``hbmwatch.query.Matcher``): regular
expressions anchored at both ends, a missing label matching as the empty string.  Here a
matcher is the plain ``records.Matcher`` that silences and rules store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from hbmwatch import query
from hbmwatch.records import Matcher

_MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


def parse_matcher(text: str) -> Matcher:
    """``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex``; quotes optional.

    >>> parse_matcher('rack=~"r[0-3]"')
    Matcher(name='rack', value='r[0-3]', op='=~')
    """
    m = _MATCHER.match(text)
    if m is None:
        raise ValueError(f"bad matcher {text!r}: expected name=value, !=, =~ or !~")
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return checked(Matcher(name, value, op))


def checked(m: Matcher) -> Matcher:
    """The matcher, if its name is valid, its operator known and its regex compiles."""
    _compiled(m)  # raises InvalidQuery (a ValueError) naming what is wrong
    return m


@lru_cache(maxsize=4096)
def _compiled(m: Matcher) -> query.Matcher:
    return query.Matcher.of(m.name, m.op, m.value)


def matches(m: Matcher, labels: Mapping[str, str]) -> bool:
    return _compiled(m).matches(labels.get(m.name, ""))


def matches_all(ms: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(matches(m, labels) for m in ms)
