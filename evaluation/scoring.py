"""Detector findings scored against a scenario's ground truth: what ``hbmwatch eval`` reports.

The definitions, exactly (times in Unix seconds, a finding's ``started_ms`` / ``raised_ms``
divided by 1,000):

* **Entity match.** A finding is about a fault's entity when, checked in this order:
  its ``service`` is one of the fault's ``affected_jobs`` (a training job runs on all its
  GPUs, across hosts: its ``host`` label is only where its step time is exported);
  its entity has ``host`` and ``gpu`` and that GPU is among the fault's ``affected_gpus``;
  it has ``host`` but no ``gpu`` (a node or target) and the host is an affected GPU's;
  it has ``rack`` but no ``host`` (rack level) and the rack is an affected GPU's;
  it has ``service`` (a workload without placement) among ``affected_services``, or ``job``
  among ``affected_jobs``; or it has only ``cluster`` and that is an affected GPU's.
  ``cluster`` is compared wherever the finding carries it.  Workload findings that carry
  ``host``/``gpu`` match by placement.
* **Detected.** A fault is detected when some finding whose ``kind`` is in the fault's
  ``expected_findings`` matches its entity and started in ``[onset - 30 s, end + 60 s]``.
  **Delay** = ``max(0, earliest raised of those findings - onset)``.
* **Recall** per fault kind = detected / total faults of that kind, over all runs.
* **False incidents.** A finding is explained by a fault when it matches its entity and
  started or was raised in ``[onset - 120 s, end + 300 s]`` (a fleet outlier's start is the
  start of the window it was judged on) with any kind (the consequences of a fault,
  such as a throttle or a fleet outlier on a faulty GPU, are not false), except that
  ``data_quality`` findings are explained only by ``stuck_sensor`` / ``sensor_dropout`` /
  ``target_down`` faults and by ``xid_fatal`` (a GPU off the bus reads blank).
  Unexplained findings of one run form one incident when they share a host or a rack
  (``cluster/rack``; cluster or service where they have neither) and their spans
  ``[started, ended or updated]`` come within 5 minutes of each other (transitively).
  **Rate** = incidents / healthy GPU-hours * 1,000, where healthy
  GPU-hours = sum over runs of ``gpus * evaluated_s / 3600`` minus each affected GPU's
  faulty time (the union of its faults' ``[onset, end]`` within the run).
* **Delay percentiles**: median and p95 (linear interpolation) of the delays of detected
  faults per kind, and over the thermal kinds together (coolant_degradation,
  degraded_stack, ambient_heat).
* **Root cause.** For each detected fault, the matching findings (as for detection) are
  ranked regression first (p99 / step-time regression), then thermal excursion or
  throttle, then any other, earliest raised first; the first is judged.  **Top-1** is
  right when its first cause is the expected root cause, **top-3** when one of its first
  three is; ``hbm_thermal_throttle`` counts as ``thermal`` where ``thermal`` is expected,
  otherwise the match is exact.  Rates are over detected faults.
* **Noisy-neighbour control**: the fraction of noisy_neighbour faults for which no
  matching regression finding names a thermal cause (``Cause.is_thermal``) first.

``EvalReport.checks`` compares with the targets: recall >= 0.95 per kind, false incidents
<= 1 per 1,000 GPU-h, thermal median delay <= 30 s, top-1 >= 0.9, noisy control >= 0.95.
A check without data (no thermal fault in the runs, say) is ``None`` and does not fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from hbmwatch.records import Finding
from hbmwatch.taxonomy import Cause, FindingKind

BEFORE_S, AFTER_S = 30.0, 60.0  # detection window around a fault
SLACK_BEFORE_S, SLACK_AFTER_S = 120.0, 300.0  # what a fault explains, for false incidents
INCIDENT_GAP_S = 300.0
THERMAL_FAULTS = ("coolant_degradation", "degraded_stack", "ambient_heat")
SENSOR_FAULTS = ("stuck_sensor", "sensor_dropout", "target_down")
#: Faults whose data-quality findings are consequences: sensor faults, and a GPU that fell
#: off the bus (its fields read DCGM's not-supported sentinel, or vanish from DME's page).
DATA_QUALITY_FAULTS = (*SENSOR_FAULTS, "xid_fatal")
REGRESSIONS = (FindingKind.P99_REGRESSION, FindingKind.STEP_TIME_REGRESSION)
HEAT_FINDINGS = (FindingKind.THERMAL_EXCURSION, FindingKind.THROTTLE)
TARGETS = {"recall": 0.95, "false_per_1000_gpu_h": 1.0, "thermal_median_delay_s": 30.0,
           "top1": 0.9, "noisy_control": 0.95}  # fmt: skip


class RunLike(Protocol):
    """What scoring reads of ``hbmwatch.evaluation.RunResult`` (no import: no cycle)."""

    scenario: str
    seed: int
    truth: Mapping[str, Any]
    findings: Sequence[Finding]
    simulated_seconds: float


# -- ground truth ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """One ground-truth fault, with its places as sets for quick matching."""

    id: str
    kind: str
    onset: float
    end: float
    expected_findings: frozenset[str]
    expected_root_cause: str
    gpus: frozenset[tuple[str, str, str]]  # (cluster, host, gpu)
    services: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    pods: frozenset[str] = frozenset()  # on its GPUs during it (racks with pods only)
    #: How wide its target is (``PLACE_WIDTH``): a GPU, a host, a rack, a cluster.
    width: int = 3

    @classmethod
    def from_truth(cls, t: Mapping[str, Any]) -> Fault:
        gpus = frozenset(
            (str(g.get("cluster", "")), str(g.get("host", "")), str(g.get("gpu", "")))
            for g in t.get("affected_gpus", [])
        )
        return cls(
            id=str(t["id"]),
            kind=str(t["kind"]),
            onset=float(t["onset_unix"]),
            end=float(t["end_unix"]),
            expected_findings=frozenset(str(k) for k in t.get("expected_findings", [])),
            expected_root_cause=str(t.get("expected_root_cause", "")),
            gpus=gpus,
            services=frozenset(t.get("affected_services", [])),
            jobs=frozenset(t.get("affected_jobs", [])),
            pods=frozenset(t.get("affected_pods", [])),
            width=place_width(t.get("target") or {}),
        )


#: A place's width, narrowest first; a target or labels naming none is a cluster's.
PLACE_WIDTH = (("gpu", 0), ("host", 1), ("rack", 2))


def place_width(labels: Mapping[str, Any]) -> int:
    """0 for a GPU, 1 a host, 2 a rack, 3 anything wider (labels or a fault's target)."""
    return next((w for key, w in PLACE_WIDTH if labels.get(key) not in (None, "")), 3)


def _affected_places(t: Mapping[str, Any]) -> dict[str, set[tuple[str, ...]]]:
    """Hosts, racks and clusters of a fault's GPUs (with and without the cluster)."""
    places: dict[str, set[tuple[str, ...]]] = {"host": set(), "rack": set(), "cluster": set()}
    for g in t.get("affected_gpus", []):
        c = str(g.get("cluster", ""))
        places["host"] |= {(c, str(g.get("host", ""))), ("", str(g.get("host", "")))}
        places["rack"] |= {(c, str(g.get("rack", ""))), ("", str(g.get("rack", "")))}
        places["cluster"].add((c,))
    return places


@dataclass(frozen=True)
class FaultTruth:
    fault: Fault
    places: Mapping[str, set[tuple[str, ...]]]
    gpu_keys: frozenset[tuple[str, str, str]]  # cluster may be "" for findings without one


def fault_truth(t: Mapping[str, Any]) -> FaultTruth:
    fault = Fault.from_truth(t)
    keys = set(fault.gpus) | {("", h, g) for _, h, g in fault.gpus}
    return FaultTruth(fault, _affected_places(t), frozenset(keys))


# -- matching -------------------------------------------------------------------------------
def entity_matches(entity: Mapping[str, str], truth: FaultTruth) -> bool:
    """Whether a finding's entity is what the fault affected (rules in the module doc)."""
    c = str(entity.get("cluster", ""))
    if str(entity.get("service", "")) in truth.fault.jobs:
        return True  # a job spans hosts: its host label is where it reports, not where it runs
    host, gpu, rack = entity.get("host"), entity.get("gpu"), entity.get("rack")
    if host:
        if gpu not in (None, ""):
            return (c, str(host), str(gpu)) in truth.gpu_keys
        return (c, str(host)) in truth.places["host"]
    if rack:
        return (c, str(rack)) in truth.places["rack"]
    if entity.get("service"):
        return str(entity["service"]) in truth.fault.services
    if entity.get("job"):
        return str(entity["job"]) in truth.fault.jobs
    return bool(c) and (c,) in truth.places["cluster"]


def _started_within(f: Finding, fault: Fault, before_s: float, after_s: float) -> bool:
    return fault.onset - before_s <= f.started_ms / 1000.0 <= fault.end + after_s


def matches(f: Finding, truth: FaultTruth) -> bool:
    """Counts toward detection: an expected kind, the right entity, in the window."""
    return (
        str(f.kind) in truth.fault.expected_findings
        and _started_within(f, truth.fault, BEFORE_S, AFTER_S)
        and entity_matches(f.entity, truth)
    )


def kind_explained(kind: str, fault_kind: str) -> bool:
    """A fault explains any kind of finding but data quality, which only sensor faults and
    a GPU that fell off the bus do."""
    return kind != FindingKind.DATA_QUALITY or fault_kind in DATA_QUALITY_FAULTS


def explains(f: Finding, truth: FaultTruth) -> bool:
    """Not a false alarm: a consequence of the fault (any kind but data quality), with slack."""
    if not kind_explained(str(f.kind), truth.fault.kind):
        return False
    lo, hi = truth.fault.onset - SLACK_BEFORE_S, truth.fault.end + SLACK_AFTER_S
    when = (f.started_ms / 1000.0, f.raised_ms / 1000.0)
    return any(lo <= t <= hi for t in when) and entity_matches(f.entity, truth)


def same_cause(named: str, expected: str) -> bool:
    """Exact, except that an HBM-thermal throttle is a thermal cause."""
    return named == expected or (expected == Cause.THERMAL and named == Cause.HBM_THERMAL_THROTTLE)


def is_thermal_cause(cause: str | None) -> bool:
    try:
        return cause is not None and Cause(cause).is_thermal
    except ValueError:
        return False


# -- per fault ------------------------------------------------------------------------------
@dataclass
class FaultOutcome:
    """How one fault of one run was scored."""

    scenario: str
    seed: int
    fault_id: str
    kind: str
    detected: bool
    delay_s: float | None = None
    finding_id: str | None = None  # the finding judged for root cause
    expected_cause: str = ""
    named_causes: list[str] = field(default_factory=list)
    top1: bool | None = None
    top3: bool | None = None
    blamed_heat: bool | None = None  # noisy_neighbour only


def _judged(found: Sequence[Finding]) -> Finding:
    """Regression first, then the thermal / throttle finding, then any; earliest raised."""

    def rank(f: Finding) -> tuple[int, int]:
        cls = 0 if f.kind in REGRESSIONS else 1 if f.kind in HEAT_FINDINGS else 2
        return cls, f.raised_ms

    return min(found, key=rank)


def score_fault(run: RunLike, truth: FaultTruth) -> FaultOutcome:
    fault = truth.fault
    found = [f for f in run.findings if matches(f, truth)]
    out = FaultOutcome(run.scenario, run.seed, fault.id, fault.kind, bool(found))
    out.expected_cause = fault.expected_root_cause
    if fault.kind == "noisy_neighbour":
        heat = [f for f in found if f.kind in REGRESSIONS and is_thermal_cause(f.top_cause)]
        out.blamed_heat = bool(heat)
    if not found:
        return out
    out.delay_s = max(0.0, min(f.raised_ms for f in found) / 1000.0 - fault.onset)
    judged = _judged(found)
    named = [str(c.cause) for c in judged.causes]
    out.finding_id, out.named_causes = judged.id, named
    out.top1 = bool(named) and same_cause(named[0], fault.expected_root_cause)
    out.top3 = any(same_cause(c, fault.expected_root_cause) for c in named[:3])
    return out


# -- false incidents ------------------------------------------------------------------------
def _places(f: Finding) -> set[tuple[str, ...]]:
    e = f.entity
    c = str(e.get("cluster", ""))
    out: set[tuple[str, ...]] = set()
    if e.get("host"):
        out.add(("host", c, str(e["host"])))
    if e.get("rack"):
        out.add(("rack", c, str(e["rack"])))
    if not out:
        who = e.get("service") or e.get("job") or e.get("target") or ""
        out.add(("other", c, str(who)))
    return out


def group_incidents(findings: Sequence[Finding]) -> list[list[Finding]]:
    """Findings sharing a host or rack within ``INCIDENT_GAP_S`` of each other, transitively."""
    parent = list(range(len(findings)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    spans = [(f.started_ms / 1000.0, (f.ended_ms or f.updated_ms) / 1000.0) for f in findings]
    places = [_places(f) for f in findings]
    for i in range(len(findings)):
        for j in range(i + 1, len(findings)):
            near = spans[i][0] <= spans[j][1] + INCIDENT_GAP_S and (
                spans[j][0] <= spans[i][1] + INCIDENT_GAP_S
            )
            if near and places[i] & places[j]:
                parent[root(i)] = root(j)
    groups: dict[int, list[Finding]] = {}
    for i, f in enumerate(findings):
        groups.setdefault(root(i), []).append(f)
    return list(groups.values())


def healthy_gpu_hours(truth: Mapping[str, Any], evaluated_s: float) -> float:
    """GPU-hours of the run less each affected GPU's faulty time (overlaps counted once)."""
    start = float(truth.get("start_unix", 0.0))
    stop = start + evaluated_s
    spans: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for t in truth.get("faults", []):
        a, b = max(start, float(t["onset_unix"])), min(stop, float(t["end_unix"]))
        if b <= a:
            continue
        for g in t.get("affected_gpus", []):
            key = (str(g.get("cluster", "")), str(g.get("host", "")), str(g.get("gpu", "")))
            spans.setdefault(key, []).append((a, b))
    faulty_s = sum(_union_length(s) for s in spans.values())
    return max(0.0, (int(truth.get("gpus", 0)) * evaluated_s - faulty_s) / 3600.0)


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


# -- the report -----------------------------------------------------------------------------
@dataclass
class KindStats:
    kind: str
    n: int
    detected: int
    recall: float
    delay_median_s: float | None
    delay_p95_s: float | None
    top1: float | None
    top3: float | None


class CheckedReport:
    """A report judged by its checks: passed unless one failed (None is "not measured")."""

    checks: dict[str, bool | None]

    @property
    def passed(self) -> bool:
        return all(v is not False for v in self.checks.values())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)  # type: ignore[call-overload]
        out["passed"] = self.passed
        return finite(out)  # type: ignore[no-any-return]


@dataclass
class EvalReport(CheckedReport):
    """Everything ``hbmwatch eval`` prints and writes, with the checks against the targets."""

    runs: int
    kinds: dict[str, KindStats]
    false_incidents: int
    healthy_gpu_hours: float
    false_per_1000_gpu_h: float | None
    thermal_delay_median_s: float | None
    thermal_delay_p95_s: float | None
    top1: float | None
    top3: float | None
    noisy_control: float | None
    checks: dict[str, bool | None]
    faults: list[FaultOutcome]
    incidents: list[list[str]]  # finding ids per false incident

    def rows(self) -> list[tuple[str, ...]]:
        """The table as text: per fault kind, then the overall lines."""
        rows = [
            (k.kind, str(k.n), pct(k.recall), sec(k.delay_median_s), sec(k.delay_p95_s),
             pct(k.top1), pct(k.top3), ok_text(self.checks.get(f"recall:{k.kind}")))
            for k in self.kinds.values()
        ]  # fmt: skip
        fp = "n/a" if self.false_per_1000_gpu_h is None else f"{self.false_per_1000_gpu_h:.2f}"
        return [
            *rows,
            ("thermal faults", "", "", sec(self.thermal_delay_median_s),
             sec(self.thermal_delay_p95_s), "", "", ok_text(self.checks["thermal_median_delay"])),
            ("all detected faults", "", "", "", "", pct(self.top1), pct(self.top3),
             ok_text(self.checks["top1"])),
            (f"false incidents per 1,000 GPU-h ({self.false_incidents} in "
             f"{self.healthy_gpu_hours:.0f} GPU-h)", fp, "", "", "", "", "",
             ok_text(self.checks["false_incidents"])),
            ("noisy neighbour not blamed on heat", pct(self.noisy_control), "", "", "", "", "",
             ok_text(self.checks["noisy_control"])),
            ("passed", "yes" if self.passed else "NO", "", "", "", "", "", ""),
        ]  # fmt: skip

    def table(self) -> Any:
        """A ``rich.table.Table`` of ``rows()`` (rich imported here: only the CLI needs it)."""
        from rich.table import Table

        table = Table(title="detector evaluation")
        for name in ("fault kind", "n", "recall", "delay p50", "delay p95", "top-1", "top-3"):
            table.add_column(name, justify="left" if name == "fault kind" else "right")
        table.add_column("check")
        rows = self.rows()
        for row in rows[: len(self.kinds)]:
            table.add_row(*row)
        table.add_section()
        for row in rows[len(self.kinds) :]:
            table.add_row(*row)
        return table


def score(results: Sequence[RunLike]) -> EvalReport:
    """Score every run's findings against its ground truth; definitions in the module doc."""
    outcomes: list[FaultOutcome] = []
    incidents: list[list[str]] = []
    hours = 0.0
    for run in results:
        truths = [fault_truth(t) for t in run.truth.get("faults", [])]
        outcomes += [score_fault(run, t) for t in truths]
        false = [f for f in run.findings if not any(explains(f, t) for t in truths)]
        incidents += [[f.id for f in group] for group in group_incidents(false)]
        evaluated = float(run.truth.get("evaluated_s") or run.simulated_seconds)
        hours += healthy_gpu_hours(run.truth, evaluated)
    return _report(len(results), outcomes, incidents, hours)


def _report(
    runs: int, outcomes: list[FaultOutcome], incidents: list[list[str]], hours: float
) -> EvalReport:
    kinds = {k: _kind_stats(k, [o for o in outcomes if o.kind == k])
             for k in sorted({o.kind for o in outcomes})}  # fmt: skip
    thermal = [o.delay_s for o in outcomes if o.kind in THERMAL_FAULTS and o.delay_s is not None]
    detected = [o for o in outcomes if o.detected]
    noisy = [o for o in outcomes if o.kind == "noisy_neighbour"]
    rate = None if hours <= 0 else len(incidents) / hours * 1000.0
    if hours <= 0 and incidents:
        rate = float("inf")
    report = EvalReport(
        runs=runs, kinds=kinds, false_incidents=len(incidents), healthy_gpu_hours=hours,
        false_per_1000_gpu_h=rate, thermal_delay_median_s=quantile(thermal, 50),
        thermal_delay_p95_s=quantile(thermal, 95), top1=mean([bool(o.top1) for o in detected]),
        top3=mean([bool(o.top3) for o in detected]),
        noisy_control=mean([not o.blamed_heat for o in noisy]), checks={}, faults=outcomes,
        incidents=incidents,
    )  # fmt: skip
    report.checks = _checks(report)
    return report


def _kind_stats(kind: str, outs: list[FaultOutcome]) -> KindStats:
    delays = [o.delay_s for o in outs if o.delay_s is not None]
    found = [o for o in outs if o.detected]
    return KindStats(
        kind=kind, n=len(outs), detected=len(found), recall=len(found) / len(outs),
        delay_median_s=quantile(delays, 50), delay_p95_s=quantile(delays, 95),
        top1=mean([bool(o.top1) for o in found]), top3=mean([bool(o.top3) for o in found]),
    )  # fmt: skip


def _checks(r: EvalReport) -> dict[str, bool | None]:
    checks: dict[str, bool | None] = {
        f"recall:{k}": s.recall >= TARGETS["recall"] for k, s in r.kinds.items()
    }
    checks["false_incidents"] = (
        None if r.false_per_1000_gpu_h is None
        else r.false_per_1000_gpu_h <= TARGETS["false_per_1000_gpu_h"]
    )  # fmt: skip
    checks["thermal_median_delay"] = _at_most(
        r.thermal_delay_median_s, TARGETS["thermal_median_delay_s"]
    )
    checks["top1"] = None if r.top1 is None else r.top1 >= TARGETS["top1"]
    checks["noisy_control"] = (
        None if r.noisy_control is None else r.noisy_control >= TARGETS["noisy_control"]
    )
    return checks


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def quantile(values: Sequence[float], pct: float) -> float | None:
    return float(np.percentile(values, pct)) if len(values) else None


def mean(values: Sequence[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def sec(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} s"


def ok_text(value: bool | None) -> str:
    return "n/a" if value is None else "pass" if value else "FAIL"


def finite(value: Any) -> Any:
    """JSON has no infinity or NaN: they travel as None."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
