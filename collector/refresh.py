"""Exporters that refresh slower than the scrape: unchanged pages, and the refresh measured.

dcgm-exporter collects every 30 s by default (``-c 30000``) and DME caches its page too, so
a 1 s scrape reads the same text 29 times in 30.  Parsing, translating and storing it again
would cost a full scrape each time and store 30 identical samples per series; instead a page
identical to the target's previous one is recognised by a 64-bit hash of its text (Python's
own string hash: ~18 us for a 44 KB page, less than ``zlib.crc32`` of its bytes, and a
collision chance of 2^-64 a change) and yields nothing.  What is kept is the effective
resolution: ``hbmwatch_target_refresh_seconds``, the interval between the page's last two
changes, or the age of the current page once that is longer (an exporter that froze).

Only point-in-time translators may skip (``SKIPS_UNCHANGED``): an inference page's windows
move with time even when its counters do not (an idle service's requests leave the window),
so those pages are translated every scrape as before.  A page seen after a failed scrape
counts as new: its series went stale with the failure and are written again.  A target
whose page carries comments other than ``# HELP`` and ``# TYPE`` (a generation timestamp)
is compared without them, so such a comment alone does not make a page new (looked for
when the target comes up and every ``COMMENTS_EVERY`` changes: the search costs more than
the hash).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Target kinds whose translation depends on the page alone, so an unchanged page adds
#: nothing.  Inference, mapped and federated pages keep windows over time: not skipped.
SKIPS_UNCHANGED = frozenset({"dme", "dcgm"})
KEPT_COMMENTS = ("# HELP ", "# TYPE ")
#: A target's page is searched for other comments when it comes up and every this many
#: changes (~0.2 ms for a 120 KB page, against ~0.05 ms to hash it).
COMMENTS_EVERY = 100


def other_comments(text: str) -> bool:
    """Whether the page has comment lines other than ``# HELP`` and ``# TYPE``.

    >>> other_comments("# HELP a x\\n# TYPE a gauge\\na 1\\n")
    False
    >>> other_comments("a 1\\n# generated at 12:00\\n")
    True
    """
    if text.startswith("#") and not text.startswith(KEPT_COMMENTS):
        return True
    at = text.find("\n#")
    while at >= 0:
        if not text.startswith(KEPT_COMMENTS, at + 1):
            return True
        at = text.find("\n#", at + 2)
    return False


def content(text: str) -> str:
    """The page without its other comment lines (what two pages are compared on).

    >>> content("# generated 12:00:01\\n# TYPE a gauge\\na 1\\n")
    '# TYPE a gauge\\na 1\\n'
    """
    lines = text.split("\n")
    return "\n".join(x for x in lines if not x.startswith("#") or x.startswith(KEPT_COMMENTS))


@dataclass
class PageMemory:
    """One target's last page (its hash) and when it changed."""

    digest: tuple[int, int] | None = None  # (length, hash) of the last page's content
    since_ms: int | None = None  # when the current page was first seen
    refresh_ms: int | None = None  # between the last two changes seen in a row of good scrapes
    unchanged: int = 0  # scrapes that found the page unchanged since the target came up
    changes: int = 0  # pages that counted as new
    strip: bool = False  # compare without other comment lines
    #: The devices the last translated page showed: an unchanged page yields them (and no
    #: samples), so the inventory is still written, and retried after a failure.
    devices: dict[Any, Any] = field(default_factory=dict)

    def same(self, text: str, ts_ms: int, trusted: bool) -> bool:
        """Whether ``text`` is the page seen last; remembers it when it is not.

        ``trusted``: the previous scrape succeeded.  After a failure the page counts as new
        (and the refresh is measured afresh), so the series that went stale are written.
        """
        if not trusted:
            self.digest = self.refresh_ms = None
            self.unchanged = 0
            self.strip = other_comments(text)
        digest = self._digest(text)
        if digest == self.digest:
            self.unchanged += 1
            return True
        if self.digest is not None and self.since_ms is not None:
            self.refresh_ms = ts_ms - self.since_ms
        self.changes += 1
        if self.changes % COMMENTS_EVERY == 0 and other_comments(text) != self.strip:
            self.strip = not self.strip  # comments came or went without a failed scrape
            digest = self._digest(text)
        self.digest, self.since_ms = digest, ts_ms
        return False

    def _digest(self, text: str) -> tuple[int, int]:
        body = content(text) if self.strip else text
        return len(body), hash(body)

    def refresh_seconds(self, ts_ms: int) -> float | None:
        """The target's effective resolution now; None until a page was seen unchanged
        (a target whose page changes at every scrape is at its scrape interval)."""
        if not self.unchanged or self.since_ms is None:
            return None
        return max(self.refresh_ms or 0, ts_ms - self.since_ms) / 1000.0
