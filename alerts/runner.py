"""The alerting service: the engine's state kept in the store, shared with the API.

Each detection cycle hands its findings to ``process``; what the engine changed is written
back in the same call, so a restart resumes with every open alert and incident.  On start
the engine also catches up with findings that ended while it was not running (a crash
between the detector's write and ours), so no resolution is lost.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from hbmwatch import log
from hbmwatch.alerts.engine import AlertEngine, Changes
from hbmwatch.alerts.matchers import checked
from hbmwatch.alerts.workloads import MAX_PER_INCIDENT
from hbmwatch.records import AlertState, Finding, Incident, Matcher, Silence, Workload
from hbmwatch.settings import AlertSettings
from hbmwatch.store.store import Store, StoreUnavailable

logger = log.get("hbmwatch.alerts.runner")


class Alerting:
    def __init__(self, store: Store, settings: AlertSettings) -> None:
        self.store = store
        self.settings = settings
        self.engine = AlertEngine(settings)
        self.engine.attribution.lookup = self._workloads
        #: Whether the store holds any attribution, asked once per cycle (None: not yet).
        self._attributed: bool | None = None
        self._lock = threading.Lock()
        #: What the engine changed but the store did not take (an outage): saved next time.
        self._unsaved = Changes()

    def start(self) -> None:
        """Load live state, then apply what the findings table says happened since."""
        now = self.store.now_ms()
        horizon = now - int(max(self.settings.group_seconds, self.settings.keep_firing_seconds)
                            * 1000)  # fmt: skip
        alerts, incidents, silences = self.store.alerts.live(horizon)
        live = [a for a in alerts if a.state is not AlertState.RESOLVED]
        findings = [f for f in (self.store.findings.get(a.finding_id) for a in alerts) if f]
        with self._lock:
            self.engine.load(alerts, incidents, silences, findings)
            self._save(self.engine.apply(findings, now))  # findings that ended meanwhile
        opened = sum(i.open for i in incidents)
        logger.info(
            "alerting ready", live_alerts=len(live), open_incidents=opened, silences=len(silences)
        )

    def process(self, findings: Iterable[Finding], now_ms: int | None = None) -> Changes:
        now = self.store.now_ms() if now_ms is None else now_ms
        # Silences may come from elsewhere (the CLI, another replica): the store decides.
        silences = self.store.alerts.silences(ends_after_ms=now - 3_600_000)
        self._attributed = None
        with self._lock:
            self._adopt_actions(now)
            self.engine.silences = {s.id: s for s in silences}
            changes = self.engine.apply(findings, now)
            self._save(changes)
        return changes

    def _workloads(self, place: Mapping[str, str], lo_ms: int, hi_ms: int) -> tuple[Workload, ...]:
        """What ran on a finding's GPU (the store's gpu_workload_info); none if the store
        cannot say: attribution never holds an alert back."""
        try:
            if self._attributed is None:
                self._attributed = self.store.any_workloads()
            if not self._attributed:
                return ()
            return tuple(self.store.workloads([place], lo_ms, hi_ms, limit=MAX_PER_INCIDENT))
        except Exception as exc:  # the page goes out without names rather than not at all
            logger.warning("workloads not looked up", error=f"{type(exc).__name__}: {exc}")
            return ()

    def _save(self, changes: Changes) -> None:
        """Write what changed; if the store is down, keep it to write with the next changes
        (the engine already holds the new state, so a retry of ``process`` alone would find
        nothing changed) and raise."""
        changes = Changes(changes.alerts | self._unsaved.alerts,
                          changes.incidents | self._unsaved.incidents)  # fmt: skip
        if not changes:
            return
        e = self.engine
        alerts = [e.alerts[i] for i in changes.alerts if i in e.alerts]
        incidents = [e.incidents[i] for i in changes.incidents if i in e.incidents]
        try:
            self.store.alerts.save(alerts=alerts, incidents=incidents)
        except StoreUnavailable:
            self._unsaved = changes
            raise
        self._unsaved = Changes()
        for inc in incidents:
            if len(inc.timeline) and inc.timeline[-1].kind in ("opened", "resolved", "reopened"):
                logger.info(f"incident {inc.timeline[-1].kind}", id=inc.id, title=inc.title,
                            severity=inc.severity.value, alerts=len(inc.alerts))  # fmt: skip

    def _adopt_actions(self, now_ms: int) -> None:
        """Take the acknowledgements and resolutions another process saved since.

        Past one machine the API that a person acts through (``hbmwatch serve``, an ``up``
        that does not lead) saves them with an engine of its own; only the alert leader
        builds incidents, so a stored incident newer than the leader's copy holds a
        person's action, and the leader carries it on instead of writing over it."""
        held = self.engine.incidents
        if not held:
            return
        horizon = now_ms - int(self.settings.group_seconds * 1000)
        for stored in self.store.alerts.incidents(since_ms=horizon):
            mine = held.get(stored.id)
            if mine is not None and stored.updated_ms > mine.updated_ms:
                held[stored.id] = stored

    # -- people's actions ---------------------------------------------------------------
    def add_silence(
        self, matchers: Sequence[Matcher], *, starts_ms: int | None, ends_ms: int,
        created_by: str, comment: str,
    ) -> Silence:  # fmt: skip
        now = self.store.now_ms()
        starts = now if starts_ms is None else starts_ms
        if not matchers:
            raise ValueError("a silence needs at least one matcher")
        if ends_ms <= max(starts, now):
            raise ValueError("a silence must end after it starts and after now")
        silence = Silence(
            id=str(uuid.uuid4()), matchers=tuple(checked(m) for m in matchers),
            starts_ms=starts, ends_ms=ends_ms, created_by=created_by, comment=comment,
            created_ms=now,
        )  # fmt: skip
        with self._lock:
            changes = self.engine.add_silence(silence, now)
            self.store.alerts.save(silences=[silence])
            self._save(changes)
        logger.info("silence created", id=silence.id, by=created_by, ends_ms=ends_ms)
        return silence

    def expire_silence(self, silence_id: str) -> Silence | None:
        now = self.store.now_ms()
        with self._lock:
            s = self.engine.expire_silence(silence_id, now)
            if s is None:
                stored = {x.id: x for x in self.store.alerts.silences()}.get(silence_id)
                return stored
            self.store.alerts.save(silences=[s])
            self._save(self.engine.changes)
        return s

    def acknowledge(self, incident_id: str, by: str, comment: str = "") -> Incident:
        return self._act(self.engine.acknowledge, incident_id, by, comment)

    def resolve(self, incident_id: str, by: str, comment: str = "") -> Incident:
        return self._act(self.engine.resolve_incident, incident_id, by, comment)

    def _act(
        self, action: Callable[[str, str, int, str], Incident], incident_id: str, by: str,
        comment: str,
    ) -> Incident:  # fmt: skip
        now = self.store.now_ms()
        with self._lock:
            if incident_id not in self.engine.incidents:
                stored = self.store.alerts.incident(incident_id)
                if stored is None:
                    raise KeyError(incident_id)
                self.engine.incidents[incident_id] = stored
            inc = action(incident_id, by, now, comment)
            self._save(self.engine.changes)
        return inc
