"""Label matchers: one grammar for API selectors, ``hbmwatch silence add``, silences and inhibit
rules, and one regex engine (RE2) for all of them.

A matcher is ``label OP value`` with OP one of ``=``, ``!=``, ``=~``, ``!~``.  The value is
either double-quoted (escapes ``\\"``, ``\\\\``, ``\\n``, ``\\t``; any other backslash stays, so
``"r\\d+"`` is the regex ``r\\d+``) or unquoted: a run without whitespace, commas or quotes
(``host=n1``, ``rack=~r[0-3]``).  Matchers in a list are separated by commas.

Regexes go through RE2, whose matching time is linear in the input, so no user regex can
stall the process; they are anchored at both ends as Prometheus anchors them, and ``.``
matches a newline as it does there.  Patterns RE2 refuses (backreferences, lookaround) are an
``InvalidQuery`` naming the pattern and the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

import re2

from hbmwatch.validation import InvalidQuery, check_label_name

#: Longest regex accepted anywhere; RE2 programs grow with the pattern.
MAX_REGEX_LENGTH = 4000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error goes back to the caller, not to stderr
_OPTIONS.dot_nl = True


class MatchOp(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


@lru_cache(maxsize=4096)
def compile_regex(pattern: str) -> Any:
    """An RE2 program for ``pattern`` (anchored by ``fullmatch``), or ``InvalidQuery``."""
    if len(pattern) > MAX_REGEX_LENGTH:
        raise InvalidQuery(
            f"regular expression is {len(pattern)} characters, over {MAX_REGEX_LENGTH}",
            regex=pattern[:100],
        )
    try:
        return re2.compile(f"(?:{pattern})", _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise InvalidQuery(
            f"bad regular expression {pattern!r}: {reason} (RE2 syntax: no backreferences "
            "or lookaround)",
            regex=pattern,
        ) from None


@dataclass(frozen=True)
class Matcher:
    """A parsed, checked matcher; regexes compiled once."""

    label: str
    op: MatchOp
    value: str
    _regex: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, label: str, op: str, value: str) -> Matcher:
        check_label_name(label)
        try:
            match_op = MatchOp(op)
        except ValueError:
            raise InvalidQuery(f"unknown match operator {op!r}", operator=op) from None
        regex = compile_regex(value) if match_op in (MatchOp.RE, MatchOp.NRE) else None
        return cls(label, match_op, value, regex)

    def matches(self, actual: str) -> bool:
        if self.op is MatchOp.EQ:
            return actual == self.value
        if self.op is MatchOp.NE:
            return actual != self.value
        hit = self._regex.fullmatch(actual) is not None
        return hit if self.op is MatchOp.RE else not hit

    def __str__(self) -> str:
        return f"{self.label}{self.op.value}{quote(self.value)}"


_ONE = re.compile(
    r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"  # label and operator
    r'(?:"((?:[^"\\]|\\.)*)"|((?![=~])[^\s,"]*))'  # "quoted" or bare value
    r"\s*(,|$)",
    re.S,
)
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def unescape(quoted: str) -> str:
    """The value inside double quotes: known escapes resolved, other backslashes kept."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), quoted, flags=re.S)


def quote(value: str) -> str:
    """``value`` as a double-quoted string that ``parse_matchers`` reads back unchanged."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped.replace(chr(9), chr(92) + "t")}"'


_EXPECTED = 'expected label=value, label=~regex or label="quoted value"'


def parse_matchers(text: str) -> list[Matcher]:
    """Comma-separated matchers, quotes optional for simple values.

    >>> [str(m) for m in parse_matchers('host=n1, gpu=~"0|1",rack!~r[2-3]')]
    ['host="n1"', 'gpu=~"0|1"', 'rack!~"r[2-3]"']
    """
    out: list[Matcher] = []
    pos, body = 0, text.strip()
    while pos < len(body):
        m = _ONE.match(body, pos)
        if m is None:
            raise InvalidQuery(
                f"cannot parse matchers at {body[pos:][:80]!r}: {_EXPECTED}", matchers=text[:200]
            )
        out.append(_matcher(m))
        pos = m.end()
    return out


def parse_matcher(text: str) -> Matcher:
    """Exactly one matcher (CLI arguments, inhibit rules, ``match=`` query parameters).

    >>> parse_matcher('rack=~"r[0-3]"')
    Matcher(label='rack', op=<MatchOp.RE: '=~'>, value='r[0-3]')
    """
    m = _ONE.fullmatch(text)
    if m is None or m.group(5) == ",":
        raise InvalidQuery(f"bad matcher {text[:80]!r}: {_EXPECTED}", matcher=text[:200])
    return _matcher(m)


def _matcher(m: re.Match[str]) -> Matcher:
    label, op, quoted, bare = m.group(1), m.group(2), m.group(3), m.group(4)
    return Matcher.of(label, op, unescape(quoted) if quoted is not None else bare)
