"""Label matchers on alerts, as Alertmanager spells them (``=``, ``!=``, ``=~``, ``!~``).

The grammar and the matching are the kernel's (``hbmwatch.matchers``): the same text means the
same thing in an API selector, ``hbmwatch silence add`` and an inhibit rule; regexes run on
RE2, anchored at both ends, and a missing label matches as the empty string.  Here a matcher
is the plain ``records.Matcher`` that silences and rules store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

from hbmwatch import matchers as kernel
from hbmwatch.records import Matcher


def parse_matcher(text: str) -> Matcher:
    """``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex``; quotes optional.

    Raises ``InvalidQuery`` (a ``ValueError``) naming what is wrong.

    >>> parse_matcher('rack=~"r[0-3]"')
    Matcher(name='rack', value='r[0-3]', op='=~')
    """
    m = kernel.parse_matcher(text)
    return Matcher(m.label, m.value, m.op.value)


def checked(m: Matcher) -> Matcher:
    """The matcher, if its name is valid, its operator known and its regex compiles."""
    _compiled(m)  # raises InvalidQuery (a ValueError) naming what is wrong
    return m


@lru_cache(maxsize=4096)
def _compiled(m: Matcher) -> kernel.Matcher:
    return kernel.Matcher.of(m.name, m.op, m.value)


def matches(m: Matcher, labels: Mapping[str, str]) -> bool:
    return _compiled(m).matches(labels.get(m.name, ""))


def matches_all(ms: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(matches(m, labels) for m in ms)
