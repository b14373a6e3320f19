"""An incident's timeline: kept in time order, and folded for people to read.

The engine appends events as it learns of them, which is not always the order they
happened in (an alert resolves at its finding's end, written a keep-firing hold later), so
``insert`` places each by time: no "resolved" row before "opened".  The stored timeline
keeps every event (the API serves it raw); ``fold`` turns the churn of many alerts of one
name into one row, "12 GPUThrottling alerts came and went", for the page and the title.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from hbmwatch.records import IncidentEvent

#: Within one millisecond, the order events read in.
_RANK = {"opened": 0, "reopened": 0, "widened": 1, "merged": 1, "alert_added": 2, "severity": 3,
         "alert_resolved": 4, "acknowledged": 5, "resolved": 6}  # fmt: skip
ALERT_EVENTS = ("alert_added", "alert_resolved")
#: Fold an alert name's add/resolve rows once this many alerts of that name came.
FOLD_AT = 3


def _key(e: IncidentEvent) -> tuple[int, int]:
    return e.at_ms, _RANK.get(e.kind, 5)


def insert(timeline: Sequence[IncidentEvent], event: IncidentEvent) -> tuple[IncidentEvent, ...]:
    """The timeline with ``event`` in its place (after events of the same time and rank)."""
    keys = [_key(e) for e in timeline]
    at = bisect.bisect_right(keys, _key(event))
    return (*timeline[:at], event, *timeline[at:])


def ordered(events: Iterable[IncidentEvent]) -> list[IncidentEvent]:
    """Events in time order; a stable sort, so same-time events keep their given order."""
    return sorted(events, key=_key)


def alert_name(e: IncidentEvent) -> str:
    """The alertname an alert event is about (its text starts with it)."""
    return e.text.split(" ", 1)[0] if e.kind in ALERT_EVENTS else ""


def fold(events: Iterable[IncidentEvent], at_least: int = FOLD_AT) -> list[IncidentEvent]:
    """In time order, each alert name with ``at_least`` alerts folded into one row.

    The row stands where that name's first alert came and counts what came and went:
    "12 GPUThrottling alerts came and went over 9 min" or "... fired, 3 still firing".
    """
    rows = ordered(events)
    added: dict[str, set[str]] = {}
    resolved: dict[str, set[str]] = {}
    for e in rows:
        name = alert_name(e)
        if name:
            into = added if e.kind == "alert_added" else resolved
            into.setdefault(name, set()).add(e.alert or e.text)
    fold_names = {n for n, ids in added.items() if len(ids) >= at_least}
    out: list[IncidentEvent] = []
    first: dict[str, IncidentEvent] = {}
    last: dict[str, int] = {}
    for e in rows:
        name = alert_name(e)
        if name not in fold_names:
            out.append(e)
            continue
        last[name] = e.at_ms
        if name not in first:
            first[name] = e
            out.append(e)  # a placeholder, replaced below
    for name, e in first.items():
        n, gone = len(added[name]), len(added[name] & resolved.get(name, set()))
        span = (last[name] - e.at_ms) / 60_000
        over = f" over {span:.0f} min" if span >= 1 else ""
        text = (f"{n} {name} alerts came and went{over}" if gone == n
                else f"{n} {name} alerts fired{over}, {n - gone} still firing")  # fmt: skip
        out[out.index(e)] = IncidentEvent(e.at_ms, "alerts_folded", text)
    return out
