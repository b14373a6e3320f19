"""The incident's timeline as on-call read it: in time order, with repeats folded.

The stored timeline is a log of what the alert engine did, appended as it happened but
stamped with when things happened (an alert resolves at the time its finding ended, which
may be before events logged earlier).  A rack whose healthy GPUs throttle at the daily peak
logs dozens of alert_added/alert_resolved pairs; read at 3 am that is noise hiding the two
rows that matter.  So the page shows rows, not events:

- every row in time order, at one instant in the engine's order (``alerts.timeline``:
  opened, then alerts added, severity, alerts resolved, resolved);
- the alerts of one name that came and went three or more times fold into one row ("12
  GPUThrottling alerts came and went") spanning the first to the last of their events;
- resolve/reopen churn (two or more reopenings) and repeated severity changes (three or
  more) fold the same way; the incident's final "resolved" stays its own row.

It folds whatever it is given: a timeline the engine already folded passes through, and
kinds it does not know are shown as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hbmwatch.alerts.timeline import ordered
from hbmwatch.records import Alert, IncidentEvent

#: Alerts of one name fold when at least this many came (and went) in one incident.
FOLD_ALERTS = 3
#: Reopenings that fold the resolve/reopen churn into one row.
FOLD_REOPENED = 2
#: Severity changes that fold into one row.
FOLD_SEVERITY = 3
#: Entities named in a folded row before "+N more".
NAMED = 4
ALERT_KINDS = ("alert_added", "alert_resolved")


@dataclass(frozen=True)
class TimelineRow:
    """One row of the page's timeline: an event, or several folded (``count`` > 1)."""

    at_ms: int
    kind: str
    text: str
    actor: str | None = None
    until_ms: int | None = None  # the last folded event, when it differs from ``at_ms``
    count: int = 1  # events behind this row

    @property
    def folded(self) -> bool:
        return self.count > 1


def timeline_rows(
    events: Sequence[IncidentEvent], alerts: Sequence[Alert] = (), resolved: bool = False
) -> tuple[TimelineRow, ...]:
    """The rows to show: ``events`` ordered and folded.

    ``alerts`` (the incident's) name the alerts events point at; ``resolved`` keeps the last
    "resolved" event out of any fold, so a closed incident's last row says so.
    """
    ordered = order_events(events)
    by_id = {a.id: a for a in alerts}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(ordered):
        key = _fold_key(e, by_id)
        if key is not None:
            groups.setdefault(key, []).append(i)
    if resolved:
        last = max((i for i, e in enumerate(ordered) if e.kind == "resolved"), default=None)
        groups = {k: [i for i in v if i != last] for k, v in groups.items()}
    rows: dict[int, TimelineRow] = {}
    folded: set[int] = set()
    for key, members in groups.items():
        picked = [ordered[i] for i in members]
        row = _FOLDERS[key[0]](key[1], picked, by_id)
        if row is not None:
            rows[members[0]] = row
            folded.update(members)
    for i, e in enumerate(ordered):
        if i not in folded:
            rows[i] = TimelineRow(e.at_ms, e.kind, e.text, e.actor)
    return tuple(rows[i] for i in sorted(rows))


def order_events(events: Sequence[IncidentEvent]) -> list[IncidentEvent]:
    """In the engine's order (``alerts.timeline``), whatever order they were stored in."""
    return ordered(events)


def _fold_key(e: IncidentEvent, by_id: Mapping[str, Alert]) -> tuple[str, str] | None:
    if e.kind in ALERT_KINDS:
        return ("alerts", _alertname(e, by_id))
    if e.kind in ("resolved", "reopened"):
        return ("lifecycle", "")
    if e.kind == "severity":
        return ("severity", "")
    return None


def _alertname(e: IncidentEvent, by_id: Mapping[str, Alert]) -> str:
    """The alert's name from the alert itself, else the event text's first word."""
    alert = by_id.get(e.alert or "")
    if alert is not None and alert.labels.get("alertname"):
        return alert.labels["alertname"]
    words = e.text.split()
    return words[0] if words else ""


def _span(events: Sequence[IncidentEvent]) -> tuple[int, int | None]:
    first, last = events[0].at_ms, events[-1].at_ms
    return first, (last if last != first else None)


def _fold_alerts(
    name: str, events: Sequence[IncidentEvent], by_id: Mapping[str, Alert]
) -> TimelineRow | None:
    """``12 GPUThrottling alerts came and went (n1 gpu 0, n1 gpu 3 +4 more)``, or
    ``... fired (...): 10 came and went, 2 still firing``, or ``... fired (...), all still
    firing``."""
    added = _unique(e.alert or f"#{i}" for i, e in enumerate(events) if e.kind == "alert_added")
    gone = {e.alert for e in events if e.kind == "alert_resolved" and e.alert}
    if len(added) < FOLD_ALERTS:
        return None
    where = _unique(w for w in (_where(by_id.get(a)) for a in added) if w)
    more = f" +{len(where) - NAMED} more" if len(where) > NAMED else ""
    named = ", ".join(where[:NAMED]) + more
    firing = sum(1 for a in added if a not in gone and not a.startswith("#"))
    where = f" ({named})" if named else ""
    if not firing:
        text = f"{len(added)} {name} alerts came and went{where}"
    elif firing == len(added):
        text = f"{len(added)} {name} alerts fired{where}, all still firing"
    else:
        text = (f"{len(added)} {name} alerts fired{where}: {len(added) - firing} came and "
                f"went, {firing} still firing")  # fmt: skip
    first, last = _span(events)
    return TimelineRow(first, "alerts_folded", text, until_ms=last, count=len(events))


def _fold_lifecycle(
    _: str, events: Sequence[IncidentEvent], __: Mapping[str, Alert]
) -> TimelineRow | None:
    """``resolved and reopened 3 times``."""
    reopened = sum(1 for e in events if e.kind == "reopened")
    if reopened < FOLD_REOPENED:
        return None
    first, last = _span(events)
    text = f"resolved and reopened {reopened} times"
    return TimelineRow(first, "reopened", text, until_ms=last, count=len(events))


def _fold_severity(
    _: str, events: Sequence[IncidentEvent], __: Mapping[str, Alert]
) -> TimelineRow | None:
    """``severity changed 4 times; last: severity warning -> critical``."""
    if len(events) < FOLD_SEVERITY:
        return None
    first, last = _span(events)
    text = f"severity changed {len(events)} times; last: {events[-1].text}"
    return TimelineRow(first, "severity", text, until_ms=last, count=len(events))


_FOLDERS: dict[
    str, Callable[[str, Sequence[IncidentEvent], Mapping[str, Alert]], TimelineRow | None]
] = {"alerts": _fold_alerts, "lifecycle": _fold_lifecycle, "severity": _fold_severity}


def _where(alert: Alert | None) -> str:
    """``n1 gpu 0``: the entity an alert names, short."""
    if alert is None:
        return ""
    lab = alert.labels
    parts = [lab.get("host") or lab.get("service") or lab.get("target") or lab.get("rack", "")]
    if lab.get("gpu"):
        parts.append(f"gpu {lab['gpu']}")
    return " ".join(p for p in parts if p)


def _unique(items: Iterable[str]) -> list[str]:
    """Each once, in the order first seen."""
    return list(dict.fromkeys(items))


@dataclass(frozen=True)
class AlertGroup:
    """Resolved alerts of one name, shown as one row of the alerts table."""

    name: str
    alerts: tuple[Alert, ...]

    @property
    def where(self) -> str:
        places = _unique(w for w in (_where(a) for a in self.alerts) if w)
        more = f" +{len(places) - NAMED} more" if len(places) > NAMED else ""
        return ", ".join(places[:NAMED]) + more

    @property
    def first_ms(self) -> int:
        return min(a.started_ms for a in self.alerts)

    @property
    def last_ms(self) -> int:
        return max(a.resolved_ms or a.updated_ms for a in self.alerts)


def alert_rows(alerts: Sequence[Alert]) -> tuple[Alert | AlertGroup, ...]:
    """The alerts table: live alerts first, as they joined; then the resolved ones, those of
    a name that came and went ``FOLD_ALERTS`` times or more as one group."""
    live = [a for a in alerts if a.resolved_ms is None]
    done: dict[str, list[Alert]] = {}
    for a in alerts:
        if a.resolved_ms is not None:
            done.setdefault(a.labels.get("alertname", ""), []).append(a)
    rows: list[Alert | AlertGroup] = list(live)
    for name, members in done.items():
        if len(members) >= FOLD_ALERTS:
            rows.append(AlertGroup(name, tuple(members)))
        else:
            rows.extend(members)
    return tuple(rows)
