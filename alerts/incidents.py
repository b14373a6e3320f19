"""Incidents from firing alerts: grouped by problem, merged when one cause explains both.

The alert engine (``alerts.engine``) mixes this in; it is the half of the engine that owns
``incidents``.  An incident's problem (``alerts.grouping``) is the widest of its alerts'
problems, kept in memory and recomputed from its alerts' findings after a restart.  A
problem that explains an open incident's (a rack's cooling over a GPU's heat, a cause
found for a regression that had none) takes that incident over rather than opening a
second page; two open incidents whose problems meet are merged into the older one.  What
is live on one GPU rides on one incident (``_carrier``): a throttle paging for its GPU's
regression joins that regression's incident, and a hot GPU's regression joins the incident
of the rack's cooling (or the room's heat) that explains its heat.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from hbmwatch.alerts import summary, timeline
from hbmwatch.alerts.grouping import HEAT, REGRESSIONS, Problem, problem_of, widest
from hbmwatch.records import Alert, AlertState, Finding, Incident, IncidentEvent, IncidentState
from hbmwatch.taxonomy import Cause, FindingKind

MAX_EVIDENCE = 12


class IncidentGrouping:
    """The incident side of ``AlertEngine`` (state is the engine's)."""

    alerts: dict[str, Alert]
    incidents: dict[str, Incident]
    findings: dict[str, Finding]
    problems: dict[str, Problem]
    peaks: dict[str, dict[str, float]]
    group_ms: int
    external_url: str

    def _put(self, alert: Alert) -> None: ...  # the engine's
    def _store_incident(self, inc: Incident) -> None: ...  # the engine's

    # -- problems -----------------------------------------------------------------------
    def _problem(self, alert: Alert) -> Problem:
        f = self.findings.get(alert.finding_id)
        if f is not None:
            return problem_of(f)
        return Problem("", tuple(place(alert.labels).items()))  # matches only its own place

    def _members(self, inc: Incident) -> list[Alert]:
        """Its alerts still in memory (an alert merged elsewhere is not a member)."""
        found = (self.alerts.get(a) for a in inc.alerts)
        return [a for a in found if a is not None and a.incident_id == inc.id]

    def _key(self, inc: Incident) -> Problem:
        if inc.id not in self.problems:  # after a restart: from its alerts' findings
            members = [self._problem(a) for a in self._members(inc)]
            fallback = Problem(Cause.NONE, tuple(inc.scope.items()))
            self.problems[inc.id] = _widest(members) if members else fallback
        return self.problems[inc.id]

    # -- grouping -----------------------------------------------------------------------
    def _group(self, now: int) -> None:
        waiting = [a for a in self.alerts.values()
                   if a.state is AlertState.FIRING and a.incident_id is None]  # fmt: skip

        # The widest problem of a moment first: its GPUs then join it, no page is merged;
        # then regressions, then throttles, so each finds what it rides on (``_carrier``).
        def order(a: Alert) -> tuple[int, int, int, bool, str]:
            width, found = _rank(self._problem(a))
            return a.firing_ms or 0, -width, self._tier(a), not found, a.id

        for a in sorted(waiting, key=order):
            carried = self._carrier(a)
            if carried is not None:  # not silent: the timeline says why it joined
                self._join(carried[0], a, now, why=carried[1])
            else:
                self._join(self._incident_for(a, now), a, now)
        self._rekey(now)
        for inc in list(self.incidents.values()):
            self._settle(inc, now)

    def _open(self) -> list[Incident]:
        return sorted((i for i in self.incidents.values() if i.open), key=lambda i: i.opened_ms)

    def _incident_for(self, alert: Alert, now: int) -> Incident:
        p = self._problem(alert)
        for inc in self._open():
            if self._key(inc).explains(p):
                return inc
        under = [i for i in self._open() if p.explains(self._key(i))]
        if under:  # a wider cause: the oldest page it explains becomes its incident
            return self._widen(under, p, now, f"{alert.labels.get('alertname')} fired")
        for inc in sorted(self._recent(now), key=lambda i: -i.opened_ms):
            if self._key(inc).explains(p):
                inc = dataclasses.replace(inc, state=IncidentState.OPEN, resolved_ms=None)
                self._event(inc, now, "reopened", f"{alert.labels.get('alertname')} fired again")
                return self.incidents[inc.id]
        scope = p.scope
        key = ",".join(f"{k}={v}" for k, v in sorted(scope.items()))
        inc_id = "inc-" + hashlib.sha1(f"{key}|{alert.id}".encode()).hexdigest()[:12]
        inc = Incident(
            id=inc_id, title="", scope=scope, state=IncidentState.OPEN,
            severity=alert.severity, opened_ms=alert.firing_ms or now, updated_ms=now,
        )  # fmt: skip
        self.problems[inc_id] = p
        self._event(inc, alert.firing_ms or now, "opened", f"opened for {describe(scope)}")
        return self.incidents[inc_id]

    # -- one GPU, one page -------------------------------------------------------------
    def _tier(self, alert: Alert) -> int:
        """Placing order within a moment: causes, then regressions, then throttles."""
        f = self.findings.get(alert.finding_id)
        kind = f.kind if f is not None else ""
        return 2 if kind == FindingKind.THROTTLE else int(kind in REGRESSIONS)

    def _carrier(self, alert: Alert) -> tuple[Incident, str] | None:
        """The open incident this alert rides on, from what is live on its own GPU.

        * A throttle pages only while a workload on its GPU regresses (or past its clock
          budget): it joins the incident that regression is in, rather than opening a
          second page for the same GPU under its own cause (power throttling at the daily
          peak on a GPU a co-tenant slows, or one its rack's failing cooling heats).
        * A regression on a GPU whose heat a rack's cooling (or a room's heat) explains,
          in an open incident, joins that incident: the wider cause explains that GPU.
        Its own cause stays in the incident's ranked causes, after the incident's own.
        """
        f = self.findings.get(alert.finding_id)
        if f is None or f.kind not in (*REGRESSIONS, FindingKind.THROTTLE):
            return None
        where = _gpu_of(f)
        if where is None:
            return None
        found: list[tuple[Incident, str]] = []
        for other in self.alerts.values():
            inc = self.incidents.get(other.incident_id or "")
            g = self.findings.get(other.finding_id)
            if inc is None or not inc.open or g is None or other.state is not AlertState.FIRING:
                continue
            if other.id == alert.id or _gpu_of(g) != where:
                continue
            name = other.labels.get("alertname", "")
            if f.kind == FindingKind.THROTTLE and g.kind in REGRESSIONS:
                found.append((inc, f"joined: {name} on this GPU, which it pages for, is here"))
            elif f.kind in REGRESSIONS and g.kind not in REGRESSIONS:
                key = self._key(inc)
                if key.width > 0 and key.family in HEAT and problem_of(g).family in HEAT:
                    found.append((inc, f"joined: this GPU's heat ({name}) is this {key.family}"))
        return min(found, key=lambda x: x[0].opened_ms, default=None)

    def _recent(self, now: int) -> list[Incident]:
        """Resolved within ``group_ms`` (and not merged away): these may reopen."""
        return [
            i for i in self.incidents.values()
            if not i.open and i.resolved_ms is not None and now - i.resolved_ms <= self.group_ms
            and self._members(i)
        ]  # fmt: skip

    def _rekey(self, now: int) -> None:
        """Widen each open incident to what its alerts now say; merge those that meet."""
        for inc in self._open():
            members = [self._problem(a) for a in self._members(inc)]
            if not members:
                continue
            best, key = _widest(members), self._key(inc)
            if best == key and best.own != key.own:  # its heat ranked over its rack's, or not
                self.problems[inc.id] = best
            elif best != key and _rank(best) > _rank(key):
                self._widen([inc], best, now, "its alerts' cause")
        opened = self._open()
        for i, older in enumerate(opened):
            for newer in opened[i + 1 :]:
                a, b = self._key(self.incidents[older.id]), self._key(self.incidents[newer.id])
                both_open = self.incidents[older.id].open and self.incidents[newer.id].open
                if both_open and (a.explains(b) or b.explains(a)):
                    wide = a if a.explains(b) else b
                    self._widen([self.incidents[older.id], self.incidents[newer.id]], wide, now,
                                "its alerts' cause")  # fmt: skip

    def _widen(self, under: list[Incident], p: Problem, now: int, why: str) -> Incident:
        """The first of ``under`` takes problem ``p`` (and its scope); the rest merge in."""
        first = under[0]
        if self._key(first) != p:
            text = f"now {p.family} over {describe(p.scope)} ({why})"
            first = dataclasses.replace(first, scope=p.scope)
            self._event(first, now, "widened", text)
            self.problems[first.id] = p
        for other in under[1:]:
            self._merge(self.incidents[first.id], other, now)
        return self.incidents[first.id]

    def _merge(self, into: Incident, other: Incident, now: int) -> None:
        """``other``'s alerts move to ``into``; ``other`` resolves, saying where they went."""
        for alert in self._members(other):
            self._join(self.incidents[into.id], dataclasses.replace(alert, incident_id=None), now)
        self._event(self.incidents[into.id], now, "merged", f"{other.id} merged in ({other.title})")
        closed = dataclasses.replace(self.incidents[other.id], state=IncidentState.RESOLVED,
                                     resolved_ms=now)  # fmt: skip
        self._event(closed, now, "merged", f"merged into {into.id}")
        self.problems.pop(other.id, None)

    def _join(self, inc: Incident, alert: Alert, now: int, *, why: str = "") -> None:
        ann = dict(alert.annotations, incident_url=self._incident_url(inc.id))
        labels = dict(alert.labels, incident=inc.id)  # Alertmanager can group by it
        alert = dataclasses.replace(alert, incident_id=inc.id, annotations=ann, labels=labels)
        self._put(alert)
        if alert.id not in inc.alerts:
            inc = dataclasses.replace(inc, alerts=(*inc.alerts, alert.id))
            what = ", ".join(
                f"{k}={alert.labels[k]}" for k in ("host", "gpu", "service", "target")
                if alert.labels.get(k)
            )  # fmt: skip
            text = f"{alert.labels.get('alertname')} {what}: {alert.annotations.get('summary')}"
            text += f" ({why})" if why else ""
            self._event(inc, alert.firing_ms or now, "alert_added", text.strip(), alert=alert.id)

    # -- what it says -------------------------------------------------------------------
    def _settle(self, inc: Incident, now: int) -> None:
        """Severity, title, causes and evidence from its problem and alerts; resolved when
        its alerts all are."""
        members = self._members(inc)
        if not members:
            return
        live = [a for a in members if a.state is not AlertState.RESOLVED]
        rank = summary.SEVERITY_RANK
        found = [self.findings[a.finding_id]
                 for a in sorted(members, key=lambda a: (-rank[a.severity], a.started_ms))
                 if a.finding_id in self.findings]  # fmt: skip
        key = self._key(inc)
        causes = summary.incident_causes(found, key.family)
        top = str(causes[0].cause) if causes else key.family
        peaks = self.peaks.setdefault(inc.id, {})
        new = dataclasses.replace(
            inc, title=summary.title(describe(inc.scope), top, found, peaks), causes=causes,
            severity=summary.severity_of((a.severity for a in live or members), inc.severity),
            evidence=tuple(e for f in found for e in f.evidence[:2])[:MAX_EVIDENCE],
        )  # fmt: skip
        if new.severity != inc.severity and inc.alerts:
            self._event(new, now, "severity",
                        f"severity {inc.severity.value} -> {new.severity.value}")  # fmt: skip
            new = self.incidents[inc.id]
        if not live and inc.state is not IncidentState.RESOLVED:
            ended = max(a.resolved_ms or now for a in members)
            new = dataclasses.replace(new, state=IncidentState.RESOLVED, resolved_ms=ended)
            self._event(new, ended, "resolved", "all alerts resolved")
            return
        if new != inc:
            self._store_incident(dataclasses.replace(new, updated_ms=now))

    def _event(self, inc: Incident, at_ms: int, kind: str, text: str, *,
               alert: str | None = None, actor: str | None = None) -> None:  # fmt: skip
        """Add an event in its place in time (the engine learns of some late)."""
        event = IncidentEvent(at_ms, kind, text, alert, actor)
        updated = max(inc.updated_ms, at_ms)
        self._store_incident(dataclasses.replace(
            inc, timeline=timeline.insert(inc.timeline, event), updated_ms=updated
        ))  # fmt: skip

    def _incident_url(self, incident_id: str | None) -> str:
        return f"{self.external_url}/incidents/{incident_id}" if incident_id else ""


def _rank(p: Problem) -> tuple[int, bool]:
    """What explains more: a wider place, and any cause over none found."""
    return p.width, p.family != Cause.NONE


def _widest(problems: list[Problem]) -> Problem:
    found = [p for p in problems if p.family != Cause.NONE]
    return widest(found or problems)


def _gpu_of(f: Finding) -> tuple[str, str, str] | None:
    """The one GPU a finding is about (cluster, host, gpu), if it names one."""
    e = f.entity
    return (e.get("cluster", ""), e["host"], e["gpu"]) if e.get("host") and e.get("gpu") else None


def place(labels: Mapping[str, str]) -> dict[str, str]:
    """Where an alert is: its rack, else its host, else its service or target."""
    cluster = {"cluster": labels["cluster"]} if labels.get("cluster") else {}
    for key in ("rack", "host", "service", "target"):
        if labels.get(key):
            return {**cluster, key: labels[key]}
    return cluster or {"fleet": "all"}


def describe(scope: Mapping[str, str]) -> str:
    """``rack r0 (c0)``: a place in words."""
    text = ", ".join(f"{k} {v}" for k, v in scope.items() if k != "cluster") or "fleet"
    return f"{text} ({scope['cluster']})" if scope.get("cluster") else text
