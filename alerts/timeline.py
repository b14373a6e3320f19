"""An incident's timeline, kept in time order.

The engine appends events as it learns of them, which is not always the order they
happened in (an alert resolves at its finding's end, written a keep-firing hold later), so
``insert`` places each by time: no "resolved" row before "opened".  The stored timeline
keeps every event (the API serves it raw); the incident page folds repeats for people
(``api/incident/timeline.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from hbmwatch.records import IncidentEvent

#: Within one millisecond, the order events read in.
_RANK = {"opened": 0, "reopened": 0, "widened": 1, "merged": 1, "alert_added": 2, "severity": 3,
         "alert_resolved": 4, "acknowledged": 5, "resolved": 6}  # fmt: skip


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
