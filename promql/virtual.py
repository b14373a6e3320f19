"""Alerting state as series: ``ALERTS``, ``hbmwatch_incident_open``, ``hbmwatch_findings_open``.

Dashboards count, list and annotate alerts and incidents with PromQL, the same queries over
hbmwatch and over a Prometheus.  These series are built, at query time, from the alert,
incident and finding tables: a sample every ``TICK_MS`` while the row is in a state, and a
staleness marker when it leaves it, so a resolved alert disappears at once rather than
after the 5-minute lookback.

* ``ALERTS``: 1, with the alert's labels, ``alertstate`` (pending, firing), ``muted`` and
  ``incident`` (its incident's id once grouped);
* ``hbmwatch_incident_open``: 1, with ``incident_id``, ``title``, ``severity``, ``state``
  (open, acknowledged), ``kind`` (its first alert's) and its scope labels;
* ``hbmwatch_findings_open``: the number of open findings by ``kind`` and ``severity``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.promql.source import SampleSource
from hbmwatch.promql.values import NAME, STALE_NAN, Labels, RawSeries, rows_sorted
from hbmwatch.records import IncidentState
from hbmwatch.store.store import Store

ALERTS = "ALERTS"
INCIDENTS = "hbmwatch_incident_open"
FINDINGS = "hbmwatch_findings_open"
NAMES = (ALERTS, INCIDENTS, FINDINGS)
TICK_MS = 15_000
#: rows read per query, newest first; more than a dashboard can show
MAX_ROWS = 5000

Period = tuple[dict[str, str], int, int | None]  # labels, from, until (None: still)


def _series(name: str, periods: Iterable[Period], lo: int, hi: int) -> list[RawSeries]:
    """Periods as samples: 1 every tick inside, a staleness marker at each end."""
    pieces: dict[Labels, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for labels, start, end in periods:
        stop = hi if end is None else min(end - 1, hi)
        first = max(start, lo)
        if stop < first:
            if end is not None and lo <= end <= hi:
                pieces[_key(name, labels)].append((np.array([end]), np.array([STALE_NAN])))
            continue
        ticks = np.arange(first - first % TICK_MS, stop + 1, TICK_MS, dtype=np.int64)
        ticks = np.unique(np.r_[first, ticks[ticks >= first]])
        values = np.ones(len(ticks))
        if end is not None and end <= hi:
            ticks, values = np.r_[ticks, end], np.r_[values, STALE_NAN]
        pieces[_key(name, labels)].append((ticks, values))
    return [_joined(labels, parts) for labels, parts in pieces.items()]


def _key(name: str, labels: dict[str, str]) -> Labels:
    return tuple(sorted({**{k: v for k, v in labels.items() if v}, NAME: name}.items()))


def _joined(labels: Labels, parts: list[tuple[np.ndarray, np.ndarray]]) -> RawSeries:
    times = np.concatenate([p[0] for p in parts]).astype(np.int64)
    values = np.concatenate([p[1] for p in parts])
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    keep = np.r_[times[1:] != times[:-1], True]  # a new period's first sample beats a marker
    return RawSeries(labels, times[keep], values[keep])


def alerts(store: Store, lo: int, hi: int) -> list[RawSeries]:
    periods: list[Period] = []
    for a in store.alerts.alerts(since_ms=lo, limit=MAX_ROWS):
        if a.started_ms > hi:
            continue
        base = {**a.labels, "muted": str(a.muted).lower(), "incident": a.incident_id or ""}
        fired = a.firing_ms
        pending_end = fired if fired is not None else a.resolved_ms
        periods.append(({**base, "alertstate": "pending"}, a.started_ms, pending_end))
        if fired is not None:
            periods.append(({**base, "alertstate": "firing"}, fired, a.resolved_ms))
    return _series(ALERTS, periods, lo, hi)


def incidents(store: Store, lo: int, hi: int) -> list[RawSeries]:
    recent = store.alerts.alerts(since_ms=lo, limit=MAX_ROWS)
    kind_of = {a.id: a.labels.get("kind", "") for a in recent}
    periods: list[Period] = []
    for i in store.alerts.incidents(since_ms=lo, limit=MAX_ROWS):
        if i.opened_ms > hi:
            continue
        base = {**i.scope, "incident_id": i.id, "title": i.title, "severity": i.severity.value,
                "kind": kind_of.get(i.alerts[0], "") if i.alerts else ""}  # fmt: skip
        acked = i.acknowledged_ms if i.state is not IncidentState.OPEN else None
        periods.append(({**base, "state": "open"}, i.opened_ms, acked or i.resolved_ms))
        if acked is not None:
            periods.append(({**base, "state": "acknowledged"}, acked, i.resolved_ms))
    return _series(INCIDENTS, periods, lo, hi)


def findings(store: Store, lo: int, hi: int) -> list[RawSeries]:
    spans: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for f in store.findings.query(since_ms=lo, until_ms=hi, limit=MAX_ROWS):
        spans[(f.kind, f.severity.value)].append((f.started_ms, f.ended_ms or 2**62))
    out = []
    for (kind, severity), pairs in spans.items():
        first = max(lo, min(s for s, _ in pairs))
        ticks = np.arange(first - first % TICK_MS + TICK_MS, hi + 1, TICK_MS, dtype=np.int64)
        starts = np.sort([s for s, _ in pairs])
        ends = np.sort([e for _, e in pairs])
        counts = np.searchsorted(starts, ticks, "right") - np.searchsorted(ends, ticks, "right")
        labels = _key(FINDINGS, {"kind": kind, "severity": severity})
        out.append(RawSeries(labels, ticks, counts.astype(float)))
    return out


BUILDERS: dict[str, Callable[[Store, int, int], list[RawSeries]]] = {
    ALERTS: alerts,
    INCIDENTS: incidents,
    FINDINGS: findings,
}


def wanted(matchers: Sequence[Matcher]) -> tuple[list[str], bool]:
    """The virtual names the matchers select, and whether they select stored series too."""
    names = [m for m in matchers if m.label == NAME]
    chosen = [n for n in NAMES if all(m.matches(n) for m in names)]
    only = any(m.op is MatchOp.EQ and m.value in NAMES for m in names)
    return chosen, not only


def matching(store: Store, matchers: Sequence[Matcher], lo: int, hi: int) -> list[RawSeries]:
    chosen, _ = wanted(matchers)
    out = []
    for name in chosen:
        for s in BUILDERS[name](store, lo, hi):
            labels = dict(s.labels)
            if all(m.matches(labels.get(m.label, "")) for m in matchers):
                out.append(s)
    return out


class WithVirtual:
    """A ``SampleSource`` that adds the virtual series to another's."""

    def __init__(self, store: Store, inner: SampleSource) -> None:
        self.store, self.inner = store, inner

    @property
    def warnings(self) -> list[str]:
        return self.inner.warnings

    def select(self, matchers: Sequence[Matcher], lo: int, hi: int) -> list[RawSeries]:
        _, stored = wanted(matchers)
        out = self.inner.select(matchers, lo, hi) if stored else []
        return rows_sorted([*out, *matching(self.store, matchers, lo, hi)])
