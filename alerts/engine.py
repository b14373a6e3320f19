"""The alert lifecycle and incident grouping, as a computation over state (no I/O).

``AlertEngine.apply(findings, now)`` follows each finding fingerprint with one alert:

* **pending -> firing** once the finding has been open ``pending_seconds``;
* **firing -> resolved** ``keep_firing_seconds`` after the finding ends, unless it comes
  back meanwhile (flap damping: the alert never resolved, its ``flaps`` count goes up);
* a finding whose severity rises resolves its alert and starts another with the new
  labels (Alertmanager sees a different label set, so it pages anew); one whose severity
  falls keeps its alert, so a finding hovering at a threshold is one alert, not many;
* an ``info`` finding is recorded but raises no alert (it pages once it escalates).

Firing alerts join incidents by **problem**, a cause family at a place (``alerts.grouping``):
an open incident whose problem is the same, or explains it (a rack's cooling explains its
GPUs' heat), takes them; one resolved in the last ``group_seconds`` reopens.  A wider
cause arriving later takes over the narrower incidents it explains, and incidents whose
problems meet are merged into the oldest, so a rack losing coolant is one incident listing
its GPUs while a target down and a hot GPU on that rack are two; what is live on one GPU
(a regression and the throttle paging for it) is one page.  Title, severity and
causes come from the incident's problem (``alerts.summary``).  Silences and inhibition rules
mute alerts without changing their state.  The caller persists what ``apply`` reports as
changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from hbmwatch.alerts import summary
from hbmwatch.alerts.grouping import Problem
from hbmwatch.alerts.incidents import IncidentGrouping, describe, place
from hbmwatch.alerts.labels import alert_labels, annotations, label_fingerprint
from hbmwatch.alerts.matchers import matches_all, parse_matcher
from hbmwatch.alerts.workloads import Attributor
from hbmwatch.alerts.workloads import describe as describe_workloads
from hbmwatch.records import (
    Alert,
    AlertState,
    Finding,
    Incident,
    IncidentState,
    Matcher,
    Severity,
    Silence,
)
from hbmwatch.settings import AlertSettings
from hbmwatch.validation import HbmwatchError

SEVERITY_RANK = summary.SEVERITY_RANK
__all__ = ["AlertEngine", "Changes", "IncidentClosed", "describe", "place"]


class IncidentClosed(HbmwatchError):
    """An action a resolved incident cannot take (acknowledging it); the API answers 409."""


@dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


@dataclass
class Changes:
    """What one ``apply`` changed: ids of alerts and incidents to persist."""

    alerts: set[str] = field(default_factory=set)
    incidents: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.alerts or self.incidents)


class AlertEngine(IncidentGrouping):
    def __init__(self, settings: AlertSettings, *, external_url: str | None = None) -> None:
        self.pending_ms = int(settings.pending_seconds * 1000)
        self.keep_ms = int(settings.keep_firing_seconds * 1000)
        self.group_ms = int(settings.group_seconds * 1000)
        self.external_url = (external_url or settings.external_url).rstrip("/")
        self.rules = [
            InhibitRule(
                tuple(parse_matcher(m) for m in r.source_matchers),
                tuple(parse_matcher(m) for m in r.target_matchers),
                tuple(r.equal),
            )
            for r in settings.inhibit_rules
        ]
        self.alerts: dict[str, Alert] = {}  # by id: active, and resolved within group_ms
        self.current: dict[str, str] = {}  # finding fingerprint -> its alert's id
        self.incidents: dict[str, Incident] = {}  # open, and resolved within group_ms
        self.silences: dict[str, Silence] = {}
        self.findings: dict[str, Finding] = {}  # the latest statement behind each alert
        self.problems: dict[str, Problem] = {}  # incident id -> its problem (from its alerts)
        self.peaks: dict[str, dict[str, float]] = {}  # incident id -> its title's figures
        #: What ran on device findings' GPUs; its ``lookup`` is set by the caller (no I/O here).
        self.attribution = Attributor()
        self.changes = Changes()

    # -- state in and out ---------------------------------------------------------------
    def load(
        self,
        alerts: Iterable[Alert],
        incidents: Iterable[Incident],
        silences: Iterable[Silence],
        findings: Iterable[Finding] = (),
    ) -> None:
        """Resume from persisted state (a restart keeps every alert and incident)."""
        for a in sorted(alerts, key=lambda a: a.updated_ms):
            self.alerts[a.id] = a
            if a.source:
                self.current[a.source] = a.id
        self.incidents.update({i.id: i for i in incidents})
        self.silences.update({s.id: s for s in silences})
        self.findings.update({f.id: f for f in findings})

    def apply(self, findings: Iterable[Finding], now_ms: int) -> Changes:
        """Take the findings' latest statements, advance timers, mute, group."""
        self.changes = Changes()
        for f in {f.id: f for f in findings}.values():
            self._follow(f, now_ms)
        self._advance(now_ms)
        self._mute(now_ms)
        self._group(now_ms)
        self._attribute()
        self._forget(now_ms)
        return self.changes

    # -- lifecycle ----------------------------------------------------------------------
    def _put(self, alert: Alert) -> None:
        self.alerts[alert.id] = alert
        self.changes.alerts.add(alert.id)

    def _follow(self, f: Finding, now: int) -> None:
        cur = self.alerts.get(self.current.get(f.fingerprint, ""))
        labels = alert_labels(f)
        fp = label_fingerprint(labels)
        if cur is not None and cur.finding_id != f.id and not f.open:
            return  # an older statement of a finding this alert no longer follows
        idle = cur is None or cur.state is AlertState.RESOLVED
        if f.severity is Severity.INFO and idle:
            return  # recorded (finding, dashboard), not paged: it alerts once it escalates
        self.findings[f.id] = f
        ann = annotations(f, self._incident_url(cur.incident_id if cur else None))
        if workloads := self.attribution.of(f, now):
            ann["workloads"] = describe_workloads(workloads)
        if f.open and (cur is None or cur.state is AlertState.RESOLVED):
            self._start(f, labels, fp, ann, now)
        elif f.open and cur is not None and _escalates(cur, f):
            self._resolve(cur, now, why=f"escalated to {f.severity.value}")
            self._start(f, labels, fp, ann, now, firing=True, incident=cur.incident_id)
        elif f.open and cur is not None:  # same alert (a lower severity does not de-escalate)
            flapped = cur.ending_ms is not None
            same = cur.annotations == ann and cur.finding_id == f.id and not flapped
            if not same:  # a restatement that changes nothing is not written again
                self._put(dataclasses.replace(
                    cur, annotations=ann, finding_id=f.id, updated_ms=now, ending_ms=None,
                    flaps=cur.flaps + int(flapped),
                ))  # fmt: skip
        elif cur is not None and cur.state is AlertState.PENDING:
            self._resolve(cur, f.ended_ms or now, why="ended before it fired")
        elif cur is not None and cur.state is AlertState.FIRING and cur.ending_ms is None:
            ended = f.ended_ms if f.ended_ms is not None else now
            self._put(dataclasses.replace(cur, annotations=ann, updated_ms=now, ending_ms=ended))

    def _start(
        self, f: Finding, labels: dict[str, str], fp: str, ann: dict[str, str], now: int,
        *, firing: bool = False, incident: str | None = None,
    ) -> None:  # fmt: skip
        started = now if firing else f.started_ms
        alert = Alert(
            id=f"{fp}-{started}", fingerprint=fp, labels=labels, annotations=ann,
            state=AlertState.FIRING if firing else AlertState.PENDING, severity=f.severity,
            finding_id=f.id, started_ms=started, updated_ms=now,
            firing_ms=now if firing else None, incident_id=incident, source=f.fingerprint,
        )  # fmt: skip
        self.current[f.fingerprint] = alert.id
        self._put(alert)
        if incident in self.incidents:
            self._join(self.incidents[incident], alert, now)

    def _resolve(self, alert: Alert, at_ms: int, *, why: str = "") -> None:
        resolved = dataclasses.replace(
            alert, state=AlertState.RESOLVED, resolved_ms=at_ms, updated_ms=at_ms
        )
        self._put(resolved)
        inc = self.incidents.get(alert.incident_id or "")
        if inc is not None:
            text = f"{alert.labels.get('alertname')} resolved" + (f" ({why})" if why else "")
            self._event(inc, at_ms, "alert_resolved", text, alert=alert.id)

    def _advance(self, now: int) -> None:
        for a in list(self.alerts.values()):
            if a.state is AlertState.PENDING and now - a.started_ms >= self.pending_ms:
                self._put(dataclasses.replace(
                    a, state=AlertState.FIRING, firing_ms=now, updated_ms=now
                ))  # fmt: skip
            elif (
                a.state is AlertState.FIRING
                and a.ending_ms is not None
                and now - a.ending_ms >= self.keep_ms
            ):
                self._resolve(a, a.ending_ms)

    def _attribute(self) -> None:
        """Each open incident names the workloads on its alerts' GPUs (a union: a pod
        that moved away stays named)."""
        if not self.attribution.found:
            return
        for inc in list(self.incidents.values()):
            if not inc.open:
                continue
            sources = [self.alerts[a].source for a in inc.alerts if a in self.alerts]
            merged = self.attribution.union(inc, sources)
            if merged != inc.workloads:
                self._store_incident(dataclasses.replace(inc, workloads=merged))

    # -- silences and inhibition -------------------------------------------------------
    def _mute(self, now: int) -> None:
        live = [a for a in self.alerts.values() if a.state is not AlertState.RESOLVED]
        active = [s for s in self.silences.values() if s.starts_ms <= now < s.ends_ms]
        sources = [
            (rule, [a for a in live if a.state is AlertState.FIRING
                    and matches_all(rule.source, a.labels)])
            for rule in self.rules
        ]  # fmt: skip
        for a in live:
            silenced = tuple(sorted(s.id for s in active if matches_all(s.matchers, a.labels)))
            inhibited = tuple(sorted({
                s.fingerprint
                for rule, srcs in sources if matches_all(rule.target, a.labels)
                for s in srcs
                if s.id != a.id and all(s.labels.get(k, "") == a.labels.get(k, "")
                                        for k in rule.equal)
            }))  # fmt: skip
            if (silenced, inhibited) != (a.silenced_by, a.inhibited_by):
                self._put(dataclasses.replace(a, silenced_by=silenced, inhibited_by=inhibited))

    def add_silence(self, silence: Silence, now_ms: int) -> Changes:
        self.changes = Changes()
        self.silences[silence.id] = silence
        self._mute(now_ms)
        return self.changes

    def expire_silence(self, silence_id: str, now_ms: int) -> Silence | None:
        s = self.silences.get(silence_id)
        if s is None:
            return None
        if s.ends_ms > now_ms:
            s = self.silences[silence_id] = dataclasses.replace(s, ends_ms=now_ms)
        self.changes = Changes()
        self._mute(now_ms)
        return s

    # -- people's actions ---------------------------------------------------------------
    def acknowledge(self, incident_id: str, by: str, now_ms: int, comment: str = "") -> Incident:
        inc = self._get_incident(incident_id)
        if inc.state is IncidentState.RESOLVED:
            raise IncidentClosed(
                f"incident {incident_id} is resolved; nothing to acknowledge",
                incident=incident_id,
                state=inc.state.value,
            )
        self.changes = Changes()
        inc = dataclasses.replace(inc, state=IncidentState.ACKNOWLEDGED, acknowledged_by=by,
                                  acknowledged_ms=now_ms)  # fmt: skip
        self._event(inc, now_ms, "acknowledged", comment or "acknowledged", actor=by)
        return self.incidents[incident_id]

    def resolve_incident(
        self, incident_id: str, by: str, now_ms: int, comment: str = ""
    ) -> Incident:
        """Close the page by hand; alerts still firing stay firing (and delivered)."""
        inc = self._get_incident(incident_id)
        self.changes = Changes()
        if inc.state is not IncidentState.RESOLVED:
            inc = dataclasses.replace(inc, state=IncidentState.RESOLVED, resolved_ms=now_ms)
            self._event(inc, now_ms, "resolved", comment or "resolved by hand", actor=by)
        return self.incidents[incident_id]

    def _get_incident(self, incident_id: str) -> Incident:
        inc = self.incidents.get(incident_id)
        if inc is None:
            raise KeyError(incident_id)
        return inc

    def _store_incident(self, inc: Incident) -> None:
        self.incidents[inc.id] = inc
        self.changes.incidents.add(inc.id)

    def _forget(self, now: int) -> None:
        """Drop from memory what is resolved and past the grouping window (it stays stored)."""
        horizon = now - max(self.group_ms, self.keep_ms)
        for a in list(self.alerts.values()):
            if a.state is AlertState.RESOLVED and (a.resolved_ms or 0) < horizon:
                del self.alerts[a.id]
                if self.current.get(a.source) == a.id:
                    del self.current[a.source]
                    self.attribution.forget(a.source)
                self.findings.pop(a.finding_id, None)
        for inc in list(self.incidents.values()):
            if not inc.open and (inc.resolved_ms or 0) < horizon:
                del self.incidents[inc.id]
                self.problems.pop(inc.id, None)
                self.peaks.pop(inc.id, None)
        for s in list(self.silences.values()):
            if s.ends_ms < horizon:
                del self.silences[s.id]


def _escalates(alert: Alert, f: Finding) -> bool:
    return SEVERITY_RANK[f.severity] > SEVERITY_RANK[alert.severity]
