"""Incidents and pages scored against a scenario's ground truth: what on-call would have got.

``hbmwatch.evaluation.scoring`` judges findings; this module judges what the alert engine built from
them and what delivery sent (``hbmwatch.evaluation.pager`` records both).  The definitions,
exactly (times in Unix seconds; entity matching, causes and healthy GPU-hours are those of
``hbmwatch.evaluation.scoring``, an alert's labels read as a finding's entity):

* **Covers.** An alert covers a fault when its labels match the fault's entity, its
  ``kind`` label is one the fault is expected to raise (``expected_findings``, the rule a
  finding detects a fault by), its place is no wider than the fault's target (a rack-wide
  alert does not cover one GPU's fault), and it started firing in ``[onset - 30 s,
  end + 60 s]``.
  The incidents that cover a fault are those its covering alerts joined.  (Any kind on the
  fault's place once covered it: a rack's cooling alert "covered" a stuck sensor or a
  degraded stack on one of its GPUs, and a host's target-down alert an XID on one of its
  GPUs, so two right incidents scored as one merged wrong one.  Whether a page is
  *explained* still reads any kind, below.)
* **One incident.** A fault has exactly one incident when one incident covers it and that
  incident covers no fault whose expected cause differs (``same_cause`` neither way): an
  incident that merges faults of different causes counts against both.
* **Page.** A webhook notification that carries at least one firing alert of severity
  ``warning`` or ``critical`` that no earlier notification carried firing (same
  fingerprint and ``startsAt``); those alerts are the page's *new* alerts.  Repeats and
  resolutions are not pages.
* **Time to page** = ``max(0, first page with a new alert covering the fault - onset)``
  (the alert read from the page: labels, ``startsAt`` as its firing time).
* **Judged incident.** Of the covering incidents, the one the earliest-firing covering alert
  joined, as it stood (its last version at or before; its first if it opened later) at
  ``min(first page + 60 s, end, end of run)``, or ``min(end, end of run)`` if never paged:
  what on-call reads a minute after the page.
* **Top cause right** when the judged incident's first ranked cause is the fault's expected
  cause (``same_cause``); **top-3** when one of its first three is.  **Title right** when its
  title names the expected cause: lower-cased, with ``_`` and ``-`` read as spaces, the
  title contains the cause's name read the same way.  **Names entity** when the top cause's
  own ``entity`` (if the record has one), or the labels of one of its evidence series,
  match the fault's entity.  **Evidence** when the top cause carries at least one evidence
  series.  A noisy neighbour is **blamed on heat** when its judged incident's top cause is
  thermal (``Cause.is_thermal``) or its title names a thermal cause.
* **Pods named** (``xid_fatal`` and ``row_remap_failure`` faults whose ground truth lists
  ``affected_pods``): the judged incident's ``workloads`` name every one of those pods,
  and so does the first page about the fault (its alerts' ``workloads`` annotation, what
  on-call reads); not met when either names none or there is no judged incident.
* **Pod moves** (ground truth ``moves``: a pod rescheduled between two GPUs, no fault): a
  move is **quiet** unless an incident has an alert that matches one of its GPUs (as a
  fault's entity), fired at or after ``at - 120 s``, and that no fault explains.
* **Unexplained.** An alert is explained by a fault when its labels match the fault's
  entity, the fault explains its kind, and it started firing in ``[onset - 120 s,
  end + 300 s]``.  A page is unexplained when none of its new alerts is explained; an
  incident when none of its alerts is (one merged into another is judged there).
  **Rates** = count / healthy GPU-hours * 1,000,
  counted from the run's first second (start-up included).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hbmwatch.evaluation.pager import Notification, PagerRecord
from hbmwatch.evaluation.scoring import (
    AFTER_S,
    BEFORE_S,
    SLACK_AFTER_S,
    SLACK_BEFORE_S,
    FaultTruth,
    entity_matches,
    fault_truth,
    healthy_gpu_hours,
    is_thermal_cause,
    kind_explained,
    place_width,
    same_cause,
)
from hbmwatch.records import Alert, Incident, RankedCause
from hbmwatch.taxonomy import Cause

PAGING_SEVERITIES = ("warning", "critical")
#: Faults whose incident must name the pods on the affected GPUs.
PODS_NAMED_FAULTS = ("xid_fatal", "row_remap_failure")
READ_AFTER_S = 60.0  # the incident is judged as on-call reads it, this long after the page
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class PagedRunLike(Protocol):
    """What incident scoring reads of ``hbmwatch.evaluation.RunResult``."""

    scenario: str
    seed: int
    truth: Mapping[str, Any]
    simulated_seconds: float
    pager: PagerRecord | None


@dataclass(frozen=True)
class Fired:
    """An alert as scoring sees it, from the engine's record or from a page."""

    labels: Mapping[str, str]
    fired_s: float
    incident: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)  # as a page carries them


@dataclass(frozen=True)
class Page:
    at_s: float
    incident: str
    new: tuple[Fired, ...]


@dataclass
class IncidentOutcome:
    """How one fault of one run fared at the incident level."""

    scenario: str
    seed: int
    fault_id: str
    kind: str
    expected_cause: str
    incidents: list[str] = field(default_factory=list)
    merged_with: list[str] = field(default_factory=list)  # faults of other causes, same incident
    one_incident: bool = False
    page_delay_s: float | None = None
    judged: str | None = None
    title: str = ""
    causes: list[str] = field(default_factory=list)
    title_right: bool = False
    top1: bool = False
    top3: bool = False
    names_entity: bool = False
    has_evidence: bool = False
    blamed_heat: bool | None = None  # noisy_neighbour only
    pods_expected: list[str] = field(default_factory=list)
    pods_named: bool | None = None  # xid_fatal / row_remap_failure with pods only


@dataclass
class MoveOutcome:
    """A pod move of one run: quiet unless an incident opened on its GPUs."""

    scenario: str
    seed: int
    move_id: str
    incidents: list[str] = field(default_factory=list)
    quiet: bool = True


@dataclass
class RunIncidents:
    """One run scored: per fault, and what no fault explains."""

    outcomes: list[IncidentOutcome]
    pages: int
    unexplained_pages: list[float]  # their times
    incidents: int
    unexplained_incidents: list[str]  # their ids
    healthy_gpu_hours: float
    moves: list[MoveOutcome] = field(default_factory=list)
    #: Each unexplained page: the run, when, and its new alerts' labels (what to look at).
    unexplained_detail: list[dict[str, Any]] = field(default_factory=list)


# -- reading the record ---------------------------------------------------------------------
def _ms_s(ms: int | None) -> float:
    return (ms or 0) / 1000.0


def fired_alerts(alerts: Iterable[Alert]) -> list[Fired]:
    """Alerts that fired (pending ones that ended first never paged anyone)."""
    return [Fired(a.labels, _ms_s(a.firing_ms), a.incident_id)
            for a in alerts if a.firing_ms is not None]  # fmt: skip


def _starts_s(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pages(notifications: Sequence[Notification]) -> list[Page]:
    """Notifications with a firing alert of paging severity not sent firing before."""
    seen: set[tuple[str, str]] = set()
    out = []
    for n in sorted(notifications, key=lambda n: n.at_ms):
        new = []
        for a in n.alerts:
            key = (str(a.get("fingerprint", "")), str(a.get("startsAt", "")))
            labels = a.get("labels", {})
            if a.get("status") != "firing" or key in seen:
                continue
            seen.add(key)
            if labels.get("severity") in PAGING_SEVERITIES:
                new.append(Fired(labels, _starts_s(key[1]), labels.get("incident"),
                                 a.get("annotations") or {}))  # fmt: skip
        if new:
            out.append(Page(n.at_ms / 1000.0, n.group_key, tuple(new)))
    return out


# -- matching -------------------------------------------------------------------------------
def _about(a: Fired, truth: FaultTruth, before_s: float, after_s: float) -> bool:
    fault = truth.fault
    return (
        fault.onset - before_s <= a.fired_s <= fault.end + after_s
        and kind_explained(str(a.labels.get("kind", "")), fault.kind)
        and entity_matches(a.labels, truth)
    )


def covers(a: Fired, truth: FaultTruth) -> bool:
    """An alert of a kind the fault raises, about its place or within it, in its window."""
    kind = str(a.labels.get("kind", ""))
    return (
        kind in truth.fault.expected_findings
        and place_width(a.labels) <= truth.fault.width
        and _about(a, truth, BEFORE_S, AFTER_S)
    )


def explains(a: Fired, truth: FaultTruth) -> bool:
    return _about(a, truth, SLACK_BEFORE_S, SLACK_AFTER_S)


def _words(text: str) -> str:
    return " " + re.sub(r"[\s_\-]+", " ", text.lower()) + " "


def names_cause(title: str, cause: str) -> bool:
    """Whether a title names a cause (``power_cap`` as "power cap", "power-cap", ...)."""
    return _words(cause).strip() in _words(title)


def _series_labels(series: str) -> dict[str, str]:
    return dict(_LABEL.findall(series))


def cause_names_entity(cause: RankedCause, truth: FaultTruth) -> bool:
    """The cause's own entity if its record has one, else any of its evidence series."""
    own = getattr(cause, "entity", None)
    if isinstance(own, Mapping) and own:
        return entity_matches(own, truth)
    return any(entity_matches(_series_labels(e.series), truth) for e in cause.evidence)


def incident_pods(incident: Incident) -> set[str]:
    """The pods an incident names (``Incident.workloads``)."""
    return {w.pod for w in incident.workloads} - {""}


def paged_pods(page: Page, truth: FaultTruth) -> str:
    """What the first page about a fault says runs on its GPU (``workloads`` annotations)."""
    return " ".join(str(a.annotations.get("workloads", "")) for a in page.new if covers(a, truth))


def merged_away(incident: Incident) -> bool:
    """Merged into another incident: its alerts, and their explanation, went with it."""
    return any(e.kind == "merged" and e.text.startswith("merged into") for e in incident.timeline)


def version_at(versions: Sequence[tuple[int, Incident]], at_s: float) -> Incident:
    """An incident as it stood at ``at_s``: its last version then, else its first."""
    before = [inc for ms, inc in versions if ms / 1000.0 <= at_s]
    return before[-1] if before else versions[0][1]


# -- per fault ------------------------------------------------------------------------------
def _judge(out: IncidentOutcome, inc: Incident, truth: FaultTruth) -> None:
    expected = truth.fault.expected_root_cause
    out.title = inc.title
    out.causes = [str(c.cause) for c in inc.causes]
    out.title_right = names_cause(inc.title, expected) or (
        expected == Cause.THERMAL and names_cause(inc.title, Cause.HBM_THERMAL_THROTTLE)
    )
    out.top1 = bool(out.causes) and same_cause(out.causes[0], expected)
    out.top3 = any(same_cause(c, expected) for c in out.causes[:3])
    if inc.causes:
        top = inc.causes[0]
        out.names_entity = cause_names_entity(top, truth)
        out.has_evidence = any(e.series for e in top.evidence)
    if out.pods_expected:
        out.pods_named = set(out.pods_expected) <= incident_pods(inc)
    if truth.fault.kind == "noisy_neighbour":
        heat_title = any(names_cause(inc.title, c) for c in Cause if c.is_thermal)
        out.blamed_heat = heat_title or (bool(out.causes) and is_thermal_cause(out.causes[0]))


def score_run(run: PagedRunLike) -> RunIncidents:
    """Score one run's incidents and pages; definitions in the module doc."""
    record = run.pager or PagerRecord()
    truths = [fault_truth(t) for t in run.truth.get("faults", [])]
    evaluated = float(run.truth.get("evaluated_s") or run.simulated_seconds)
    run_end = float(run.truth.get("start_unix", 0.0)) + evaluated
    fired = sorted(fired_alerts(record.alerts.values()), key=lambda a: a.fired_s)
    paged = pages(record.notifications)
    covering = {t.fault.id: [a for a in fired if a.incident and covers(a, t)] for t in truths}
    by_incident: dict[str, list[FaultTruth]] = {}
    for t in truths:
        for inc in {a.incident for a in covering[t.fault.id]}:
            by_incident.setdefault(str(inc), []).append(t)
    outcomes = []
    for t in truths:
        f = t.fault
        out = IncidentOutcome(run.scenario, run.seed, f.id, f.kind, f.expected_root_cause)
        if f.kind in PODS_NAMED_FAULTS and f.pods:
            out.pods_expected, out.pods_named = sorted(f.pods), False
        out.incidents = sorted({str(a.incident) for a in covering[f.id]})
        out.merged_with = sorted({o.fault.id for i in out.incidents for o in by_incident[i]
                                  if not _alike(o, t)})  # fmt: skip
        out.one_incident = len(out.incidents) == 1 and not out.merged_with
        first = next((p for p in paged if any(covers(a, t) for a in p.new)), None)
        if first is not None:
            out.page_delay_s = max(0.0, first.at_s - f.onset)
        if out.incidents:
            out.judged = str(covering[f.id][0].incident)
            at = min(f.end, run_end)
            if first is not None:
                at = min(first.at_s + READ_AFTER_S, at)
            versions = record.incidents.get(out.judged)
            if versions:
                _judge(out, version_at(versions, at), t)
        if out.pods_named and first is not None:  # and the page itself names them
            text = paged_pods(first, t)
            out.pods_named = all(pod in text for pod in out.pods_expected)
        outcomes.append(out)
    unexplained = [p for p in paged if not any(explains(a, t) for a in p.new for t in truths)]
    return RunIncidents(
        outcomes=outcomes,
        pages=len(paged),
        unexplained_pages=[p.at_s for p in unexplained],
        unexplained_detail=[
            {"scenario": run.scenario, "seed": run.seed, "at_s": p.at_s,
             "alerts": [dict(a.labels) for a in p.new]}
            for p in unexplained
        ],
        incidents=len(record.incidents),
        unexplained_incidents=sorted(
            i for i, versions in record.incidents.items()
            if not merged_away(versions[-1][1])
            and not any(explains(a, t) for a in fired if a.incident == i for t in truths)
        ),
        healthy_gpu_hours=healthy_gpu_hours(run.truth, evaluated),
        moves=score_moves(run, fired, truths),
    )  # fmt: skip


def score_moves(run: PagedRunLike, fired: Sequence[Fired],
                truths: Sequence[FaultTruth]) -> list[MoveOutcome]:  # fmt: skip
    """Each pod move of the run, with the incidents that opened on its GPUs after it."""
    out = []
    for m in run.truth.get("moves", []):
        at = float(m["at_unix"])
        place = fault_truth({"id": m["id"], "kind": "pod_move", "onset_unix": at,
                             "end_unix": at, "affected_gpus": m["affected_gpus"]})  # fmt: skip
        opened = {
            str(a.incident) for a in fired
            if a.incident and a.fired_s >= at - SLACK_BEFORE_S
            and entity_matches(a.labels, place) and not any(explains(a, t) for t in truths)
        }  # fmt: skip
        out.append(MoveOutcome(run.scenario, run.seed, str(m["id"]), sorted(opened), not opened))
    return out


def _alike(a: FaultTruth, b: FaultTruth) -> bool:
    """Faults one incident may share: the same expected cause, read either way."""
    x, y = a.fault.expected_root_cause, b.fault.expected_root_cause
    return same_cause(x, y) or same_cause(y, x)
