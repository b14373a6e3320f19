"""Per-target scrape limits, checked on the raw page before a translator sees it.

A target is untrusted input: a page with a million series, or with label values that are
new and 100 KB long on every scrape, would otherwise be parsed in full and remembered in
the translator's per-line memo, growing the collector's memory without bound.  Like
Prometheus' ``sample_limit``, a page over the sample limit is refused whole (the target
is down, with the reason); a series with an over-long label value is dropped and counted
(``label_too_long``) before it can be memoised, and the rest of the page is kept.
"""

from __future__ import annotations

import re

#: A quoted label value (escapes included); run only on lines longer than the limit.
_LABEL_VALUE = re.compile(r'="((?:[^"\\\n]|\\.)*)"')


class LimitExceeded(Exception):
    """A page refused whole by a per-target limit."""


def count_samples(text: str) -> int:
    """Sample lines on a page (non-blank lines not starting with ``#``), at C speed.

    Three ``str.count`` passes instead of a Python loop over the lines: a million-line
    page is counted in milliseconds.  Lines of only whitespace count as samples; the
    translator counts them as malformed later.
    """
    if not text:
        return 0
    lines = text.count("\n") + (not text.endswith("\n"))
    comments = text.count("\n#") + text.startswith("#")
    blank = text.count("\n\n") + text.startswith("\n")
    return max(0, lines - comments - blank)


def check_sample_limit(text: str, limit: int) -> None:
    """Refuse the page whole past ``limit`` samples (raises ``LimitExceeded``)."""
    if text.count("\n") < limit:  # fewer lines than the limit: one pass decides
        return
    n = count_samples(text)
    if n > limit:
        raise LimitExceeded(f"sample limit {limit} exceeded ({n} samples on the page)")


def drop_long_labels(text: str, limit: int) -> tuple[str, int]:
    """The page without series that have a label value over ``limit`` characters.

    Returns the (possibly unchanged) page and how many lines were dropped.  Only lines
    longer than the limit can hold such a value, so a normal page costs one length check.
    """
    if len(text) <= limit:
        return text, 0
    lines = text.split("\n")
    if max(map(len, lines)) <= limit:
        return text, 0
    kept, dropped = [], 0
    for line in lines:
        if len(line) > limit and line[:1] != "#" and _has_long_value(line, limit):
            dropped += 1
        else:
            kept.append(line)
    return "\n".join(kept), dropped


def _has_long_value(line: str, limit: int) -> bool:
    """A label value, or the metric name (Prometheus' ``__name__``), over ``limit``."""
    name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
    if name_end > limit:
        return True
    return any(len(value) > limit for value in _LABEL_VALUE.findall(line))
