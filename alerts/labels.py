"""What an alert says: its name, labels, annotations and runbook hint, from its finding.

One table (``ALERT_NAMES``) names every alert a finding can raise and carries its runbook
hint; the Prometheus rules file, the docs and the tests read it from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from hbmwatch.records import Finding
from hbmwatch.taxonomy import Cause, FindingKind

#: Entity labels an alert carries (what a finding's entity may name).
ENTITY_LABELS = (
    "cluster", "rack", "host", "gpu", "sku", "partition", "service", "model", "phase",
    "target", "reason", "link", "check", "series",
)  # fmt: skip

#: alertname -> runbook hint (what on-call checks first).
ALERT_NAMES: dict[str, str] = {
    "HBMThermalExcursion": "Compare the GPU's memory temperature with its peers and its own "
    "baseline on the incident page; one hot GPU: inspect its cold plate and airflow, drain "
    "it if it is past its limit.",
    "HBMRackThermalExcursion": "The whole rack warms: check the rack's coolant flow, inlet "
    "temperature and CDU alarms before touching GPUs.",
    "GPUThrottling": "Clocks are held down; the reason label says thermal, HBM or power. "
    "See the incident's ranked causes.",
    "P99LatencyRegression": "Read the ranked causes: heat or throttling points at cooling, "
    "co_tenant at a noisy neighbour to move, 'none' at the workload itself.",
    "StepTimeRegression": "Training steps slowed: check the ranked causes, then the job's "
    "own logs for data or checkpoint stalls.",
    "GPUFabricErrors": "Errors on one fabric link: check that link's cable or retimer; "
    "drain the GPU if its link bandwidth dropped.",
    "GPUPCIeErrors": "PCIe replays or recoveries: check the riser and seating, and AER "
    "messages in the host's kernel log.",
    "GPUErrors": "The GPU reported an error code (NVIDIA XID, AMD AFID), a failed row remap or "
    "a failed health check; the summary names the code, its meaning and action. Fatal or "
    "failed remap: drain the node and have the GPU serviced; needs reset: drain the GPU and "
    "reset it; a storm of benign codes: look at the workloads on the GPU first.",
    "GPUFleetOutlier": "This GPU is hotter or slower than its peers under the same load: "
    "schedule an inspection.",
    "HbmwatchTargetDown": "The exporter stopped answering: check its process and the host. "
    "The host's GPU alerts are inhibited meanwhile.",
    "SeriesAnomaly": "A series you mapped in left its learned level, trend or daily shape: "
    "look at what feeds it; hbmwatch knows nothing of what it means.",
    "HbmwatchDataQuality": "The telemetry is suspect (stuck sensor, gaps, sentinels): fix "
    "the exporter before trusting this GPU's other alerts.",
}

_BY_KIND: dict[str, str] = {
    FindingKind.THERMAL_EXCURSION: "HBMThermalExcursion",
    FindingKind.THROTTLE: "GPUThrottling",
    FindingKind.P99_REGRESSION: "P99LatencyRegression",
    FindingKind.STEP_TIME_REGRESSION: "StepTimeRegression",
    FindingKind.FABRIC_ERRORS: "GPUFabricErrors",
    FindingKind.PCIE_ERRORS: "GPUPCIeErrors",
    FindingKind.GPU_ERRORS: "GPUErrors",
    FindingKind.FLEET_OUTLIER: "GPUFleetOutlier",
    FindingKind.DATA_QUALITY: "HbmwatchDataQuality",
    FindingKind.SERIES_ANOMALY: "SeriesAnomaly",
}


def scope_of(entity: Mapping[str, str]) -> str:
    """What the finding is about: workload, gpu, host, rack or target."""
    if entity.get("service"):
        return "workload"
    if entity.get("target"):
        return "target"
    if entity.get("gpu"):
        return "gpu"
    if entity.get("host"):
        return "host"
    return "rack" if entity.get("rack") else "fleet"


def alertname(finding: Finding) -> str:
    scope = scope_of(finding.entity)
    if finding.kind == FindingKind.THERMAL_EXCURSION and scope == "rack":
        return "HBMRackThermalExcursion"
    if finding.kind == FindingKind.DATA_QUALITY and finding.top_cause == Cause.TARGET_DOWN:
        return "HbmwatchTargetDown"
    return _BY_KIND.get(finding.kind, "Hbmwatch" + finding.kind.title().replace("_", ""))


def alert_labels(finding: Finding) -> dict[str, str]:
    """The labels Alertmanager sees: name, severity, kind, scope and the entity."""
    labels = {k: str(v) for k, v in finding.entity.items() if k in ENTITY_LABELS and v}
    labels.update(
        alertname=alertname(finding),
        severity=finding.severity.value,
        kind=str(finding.kind),
        scope=scope_of(finding.entity),
    )
    return labels


def annotations(finding: Finding, incident_url: str = "") -> dict[str, str]:
    """Summary, the evidence in words, the top cause and the runbook hint."""
    lines = []
    for e in finding.evidence[:4]:
        limit = f" (threshold {e.threshold:g})" if e.threshold is not None else ""
        lines.append(f"{e.statistic} = {e.value:.4g}{limit} on {e.series}")
    out = {
        "summary": finding.summary,
        "description": "; ".join(lines),
        "runbook": ALERT_NAMES.get(alertname(finding), ""),
    }
    if finding.causes:
        top = finding.causes[0]
        out["top_cause"] = f"{top.cause} ({top.confidence:.0%})" + (
            f": {top.summary}" if top.summary else ""
        )
    if incident_url:
        out["incident_url"] = incident_url
    return out


def label_fingerprint(labels: Mapping[str, str]) -> str:
    """Stable across restarts and processes: a hash of the sorted labels."""
    text = "\x1f".join(f"{k}\x1e{labels[k]}" for k in sorted(labels))
    return hashlib.sha1(text.encode()).hexdigest()[:16]
