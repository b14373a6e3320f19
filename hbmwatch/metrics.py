"""The canonical metric model: every metric hbmwatch stores, defined once.

Collectors map vendor spellings into these names; the store accepts nothing else;
``docs/metrics.md``, the dashboards and the simulator are generated from or tested against
this table.  Units are SI with Prometheus suffixes; counters stay counters (AMD's
gauge-typed accumulators become counters here).

``EXPORTED`` is a second, separate table: what hbmwatch's own ``/metrics`` serves (its
health and derived signals for Grafana and Prometheus alerting).  Those are never stored,
so they stay out of ``METRICS`` and the store keeps rejecting them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from hbmwatch.records import Severity
from hbmwatch.taxonomy import FindingKind
from hbmwatch.validation import check_label_name, check_metric_name


class MetricType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Scope(StrEnum):
    """Which identity labels a metric carries."""

    DEVICE = "device"
    WORKLOAD = "workload"
    COLLECTOR = "collector"
    #: What runs on a GPU or partition (pod, Slurm job): an info series, value 1.
    ATTRIBUTION = "attribution"
    #: A user's own series (the ``mapped`` source, ``score-file``): named by ``series``,
    #: optionally placed; the generic detector scores it.
    SERIES = "series"
    #: Exported by hbmwatch's /metrics, not stored; carries no identity labels of its own.
    EXPORT = "export"


#: Identity of a physical GPU or one of its logical partitions.
DEVICE_LABELS: tuple[str, ...] = (
    "cluster",
    "rack",
    "host",
    "gpu",
    "uuid",
    "serial",
    "sku",
    "vendor",
    "partition",
    "compute_partition",
    "memory_partition",
)
#: Where a workload runs (a subset of the device identity) ...
WORKLOAD_PLACEMENT_LABELS: tuple[str, ...] = ("cluster", "rack", "host", "gpu", "partition")
#: ... and what it is.  These are attributes with a cardinality cap (store settings).
WORKLOAD_LABELS: tuple[str, ...] = ("service", "model", "phase", "job", "pod", "namespace")
COLLECTOR_LABELS: tuple[str, ...] = ("cluster", "rack", "host", "target", "source")
#: What an attribution series names; device series never carry these (a cap per label).
ATTRIBUTION_LABELS: tuple[str, ...] = ("namespace", "pod", "container", "job")

SCOPE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.DEVICE: DEVICE_LABELS,
    Scope.WORKLOAD: WORKLOAD_PLACEMENT_LABELS + WORKLOAD_LABELS,
    Scope.COLLECTOR: COLLECTOR_LABELS,
    Scope.ATTRIBUTION: WORKLOAD_PLACEMENT_LABELS + ATTRIBUTION_LABELS,
    Scope.SERIES: (*WORKLOAD_PLACEMENT_LABELS, "series"),
    Scope.EXPORT: (),
}
SCOPE_REQUIRED: dict[Scope, tuple[str, ...]] = {
    Scope.DEVICE: ("host", "gpu"),
    Scope.WORKLOAD: ("service", "phase"),
    Scope.COLLECTOR: ("target",),
    Scope.ATTRIBUTION: ("host", "gpu"),
    Scope.SERIES: ("series",),
    Scope.EXPORT: (),
}

THROTTLE_REASONS: tuple[str, ...] = (
    "hbm_thermal",
    "socket_thermal",
    "vr_thermal",
    "sw_thermal",
    "hw_thermal",
    "hw_slowdown",
    "power",
    "power_brake",
    "prochot",
    "board_limit",
    "sync_boost",
    "reliability",
    "low_utilization",
)
THERMAL_THROTTLE_REASONS: tuple[str, ...] = (
    "hbm_thermal",
    "socket_thermal",
    "vr_thermal",
    "sw_thermal",
    "hw_thermal",
)
CLOCK_DOMAINS: tuple[str, ...] = ("compute", "memory", "soc", "fabric", "video", "data")
FABRICS: tuple[str, ...] = ("xgmi", "nvlink", "ualink")
DIRECTIONS: tuple[str, ...] = ("rx", "tx", "both")
PCIE_DIRECTIONS: tuple[str, ...] = ("rx", "tx")
FABRIC_ERRORS: tuple[str, ...] = ("crc", "crc_flit", "crc_data", "replay", "recovery")
ECC_SEVERITIES: tuple[str, ...] = ("correctable", "uncorrectable", "deferred")
#: Vendor numbering schemes of GPU error events (hbmwatch/gpu_errors.py has the codes).
ERROR_SCHEMES: tuple[str, ...] = ("xid", "afid")
#: What an exporter's health verdict covers: the whole GPU, or one DCGM health watch.
HEALTH_CHECKS: tuple[str, ...] = (
    "overall",
    "pcie",
    "nvlink",
    "xgmi",
    "memory",
    "sm",
    "thermal",
    "power",
    "driver",
    "inforom",
    "pmu",
    "mcu",
    "nvswitch",
)
PHASES: tuple[str, ...] = ("ttft", "inter_token", "e2e", "step")
QUANTILES: tuple[str, ...] = ("0.5", "0.95", "0.99")
DROP_REASONS: tuple[str, ...] = (
    "malformed",
    "no_device",
    "unsupported",
    "sentinel",
    "non_finite",
    "unmapped",
    "series_cap",
    "label_too_long",
    "label_cap",
    "rejected_by_store",
)


@dataclass(frozen=True)
class MetricDef:
    """One canonical metric: name, unit, type, labels and help."""

    name: str
    type: MetricType
    unit: str
    help: str
    scope: Scope
    labels: tuple[str, ...] = ()
    label_values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: For counters read from fixed-width hardware registers: the widths they may wrap at.
    wrap_bits: tuple[int, ...] = ()

    @property
    def allowed_labels(self) -> frozenset[str]:
        return frozenset(SCOPE_LABELS[self.scope] + self.labels)

    @property
    def required_labels(self) -> tuple[str, ...]:
        return SCOPE_REQUIRED[self.scope] + self.labels

    @property
    def is_counter(self) -> bool:
        return self.type is MetricType.COUNTER


def _g(name: str, unit: str, help: str, scope: Scope = Scope.DEVICE, **kw: object) -> MetricDef:
    return MetricDef(name, MetricType.GAUGE, unit, help, scope, **kw)  # type: ignore[arg-type]


def _c(name: str, unit: str, help: str, scope: Scope = Scope.DEVICE, **kw: object) -> MetricDef:
    return MetricDef(name, MetricType.COUNTER, unit, help, scope, **kw)  # type: ignore[arg-type]


_DEFINITIONS: tuple[MetricDef, ...] = (
    # -- temperatures ---------------------------------------------------------------------
    _g(
        "gpu_hotspot_temperature_celsius",
        "celsius",
        "Hottest on-die sensor: AMD junction/hotspot, NVIDIA core GPU temperature.",
    ),
    _g(
        "gpu_memory_temperature_celsius",
        "celsius",
        "The one HBM temperature current parts report (AMD temperature.mem, NVML field 82).",
    ),
    _g(
        "gpu_hbm_stack_temperature_celsius",
        "celsius",
        "Per-stack HBM temperature, where a source has it (MI2xx layout, the simulator).",
        labels=("stack",),
    ),
    # -- memory -----------------------------------------------------------------------------
    _g(
        "gpu_memory_bandwidth_utilization_ratio",
        "ratio",
        "Fraction of time or cycles the HBM interface is busy (DRAM active, UMC activity).",
    ),
    _g("gpu_memory_used_bytes", "bytes", "Device memory in use."),
    _g("gpu_memory_total_bytes", "bytes", "Device memory size."),
    _g("gpu_utilization_ratio", "ratio", "Fraction of time the compute engine is busy."),
    # -- power and clocks -------------------------------------------------------------------
    _g("gpu_power_watts", "watts", "Board or socket power draw."),
    _g("gpu_power_limit_watts", "watts", "Enforced power cap."),
    _c(
        "gpu_energy_joules_total",
        "joules",
        "Energy used since the driver loaded.",
        wrap_bits=(32, 64),
    ),
    _g(
        "gpu_clock_hertz",
        "hertz",
        "Current clock by domain (compute = NVIDIA SM / AMD GFX).",
        labels=("domain",),
        label_values={"domain": CLOCK_DOMAINS},
    ),
    # -- throttling -------------------------------------------------------------------------
    _c(
        "gpu_throttle_seconds_total",
        "seconds",
        "Time clocks were held down, by reason (AMD violation residency, NVML/DCGM violation "
        "counters).",
        labels=("reason",),
        label_values={"reason": THROTTLE_REASONS},
    ),
    _g(
        "gpu_throttle_active",
        "boolean",
        "1 while a throttle reason is active (AMD violation status, NVIDIA clocks-event bits).",
        labels=("reason",),
        label_values={"reason": THROTTLE_REASONS},
    ),
    # -- fabric -----------------------------------------------------------------------------
    _c(
        "gpu_fabric_bytes_total",
        "bytes",
        "Bytes over a scale-up fabric link, by fabric kind, link and direction (both = a "
        "counter of the two together, as NVLink's; link all = every link).",
        labels=("fabric", "link", "direction"),
        label_values={"fabric": FABRICS, "direction": DIRECTIONS},
        wrap_bits=(32, 64),
    ),
    _c(
        "gpu_fabric_errors_total",
        "errors",
        "Fabric link errors by kind (CRC, replay, recovery); link all = every link.",
        labels=("fabric", "link", "error"),
        label_values={"fabric": FABRICS, "error": FABRIC_ERRORS},
        wrap_bits=(32, 64),
    ),
    _g(
        "gpu_fabric_link_bandwidth_bytes_per_second",
        "bytes_per_second",
        "Negotiated bandwidth of a fabric link; a drop means a degraded or retrained link.",
        labels=("fabric", "link"),
        label_values={"fabric": FABRICS},
    ),
    _c(
        "gpu_pcie_bytes_total",
        "bytes",
        "PCIe bytes by direction (NVML counters wrap at 2^32).",
        labels=("direction",),
        label_values={"direction": PCIE_DIRECTIONS},
        wrap_bits=(32, 64),
    ),
    _c("gpu_pcie_replays_total", "events", "PCIe replays.", wrap_bits=(32, 64)),
    _c("gpu_pcie_recoveries_total", "events", "PCIe link recoveries.", wrap_bits=(32, 64)),
    _c(
        "gpu_pcie_naks_total",
        "events",
        "PCIe NAKs by direction (rx = received, tx = sent).",
        labels=("direction",),
        label_values={"direction": PCIE_DIRECTIONS},
        wrap_bits=(32, 64),
    ),
    _g("gpu_pcie_link_width_lanes", "lanes", "Negotiated PCIe link width."),
    _g(
        "gpu_pcie_link_speed_transfers_per_second",
        "transfers_per_second",
        "Negotiated PCIe link speed per lane.",
    ),
    _c(
        "gpu_ecc_errors_total",
        "errors",
        "ECC errors by severity.",
        labels=("severity",),
        label_values={"severity": ECC_SEVERITIES},
    ),
    # -- errors and health ------------------------------------------------------------------
    _c(
        "gpu_error_events_total",
        "events",
        "GPU error events by vendor scheme and code (NVIDIA XID, AMD AFID); each code's "
        "meaning, severity and action are in docs/gpu-errors.md.",
        labels=("scheme", "code"),
        label_values={"scheme": ERROR_SCHEMES},
    ),
    _c(
        "gpu_row_remaps_total",
        "rows",
        "HBM rows remapped to spares, by the severity of the error that caused the remap.",
        labels=("severity",),
        label_values={"severity": ("correctable", "uncorrectable")},
    ),
    _g(
        "gpu_row_remap_pending",
        "boolean",
        "1 while a row remap waits for a GPU reset to take effect.",
    ),
    _g(
        "gpu_row_remap_failed",
        "boolean",
        "1 once a row remap failed (no spare row left): the GPU needs service.",
    ),
    _g(
        "gpu_retired_pages",
        "pages",
        "Memory pages retired (NVIDIA page retirement, AMD bad pages), by error severity.",
        labels=("severity",),
        label_values={"severity": ("correctable", "uncorrectable")},
    ),
    _g(
        "gpu_retired_pages_pending",
        "boolean",
        "1 while a page retirement waits for a GPU reset to take effect.",
    ),
    _g(
        "gpu_health_status",
        "status",
        "The exporter's own health verdict by check: 0 pass, 1 warn, 2 fail (DCGM health "
        "watches, DME gpu_health).",
        labels=("check",),
        label_values={"check": HEALTH_CHECKS},
    ),
    # -- what runs where ------------------------------------------------------------------
    _g(
        "gpu_workload_info",
        "info",
        "1 while the workload it names (namespace, pod, container, Slurm job) runs on the GPU "
        "or partition; absent otherwise. Device series never carry these labels.",
        scope=Scope.ATTRIBUTION,
    ),
    # -- a user's own series -----------------------------------------------------------------
    _g(
        "user_series_value",
        "value",
        "Any series a user maps in (the mapped source) or scores from a file (score-file), "
        "named by its series label; the generic detector scores it.",
        scope=Scope.SERIES,
    ),
    # -- workloads --------------------------------------------------------------------------
    _g(
        "workload_latency_seconds",
        "seconds",
        "Latency quantile per window, by service, model and phase (from histogram bucket "
        "deltas, raw pushed latencies or training step times).",
        scope=Scope.WORKLOAD,
        labels=("quantile",),
        label_values={"quantile": QUANTILES, "phase": PHASES},
    ),
    _g(
        "workload_latency_resolution_seconds",
        "seconds",
        "Width of the histogram bucket the quantile fell in: how precise it is (0 = exact).",
        scope=Scope.WORKLOAD,
        labels=("quantile",),
        label_values={"quantile": QUANTILES, "phase": PHASES},
    ),
    _g(
        "workload_window_requests",
        "requests",
        "Observations behind the window's quantiles; a p99 of three requests is no evidence.",
        scope=Scope.WORKLOAD,
        label_values={"phase": PHASES},
    ),
    _c(
        "workload_requests_total",
        "requests",
        "Requests (or training steps) completed.",
        scope=Scope.WORKLOAD,
        label_values={"phase": PHASES},
    ),
    # -- the collector itself ---------------------------------------------------------------
    _g(
        "hbmwatch_target_up",
        "boolean",
        "1 if the last scrape of the target succeeded, 0 if it failed.",
        scope=Scope.COLLECTOR,
    ),
    _g(
        "hbmwatch_scrape_duration_seconds",
        "seconds",
        "How long the last scrape of the target took.",
        scope=Scope.COLLECTOR,
    ),
    _g(
        "hbmwatch_scrape_samples",
        "samples",
        "Canonical samples the last scrape of the target produced.",
        scope=Scope.COLLECTOR,
    ),
    _g(
        "hbmwatch_target_refresh_seconds",
        "seconds",
        "How often the target's page changes (its exporter's refresh): the interval between "
        "its last two changes, or the current page's age once longer. Written once a scrape "
        "found the page unchanged; unchanged pages are not stored again.",
        scope=Scope.COLLECTOR,
    ),
    _c(
        "hbmwatch_scrape_dropped_total",
        "samples",
        "Lines or samples dropped while scraping the target, by reason.",
        scope=Scope.COLLECTOR,
        labels=("reason",),
        label_values={"reason": DROP_REASONS},
    ),
    _c(
        "hbmwatch_scrape_skipped_ticks_total",
        "scrapes",
        "Scheduled scrapes of the target skipped because its loop fell behind.",
        scope=Scope.COLLECTOR,
    ),
    _c(
        "hbmwatch_scrape_late_total",
        "scrapes",
        "Scrapes of the target that started more than 50 ms after their tick.",
        scope=Scope.COLLECTOR,
    ),
)

METRICS: dict[str, MetricDef] = {}
for _m in _DEFINITIONS:
    check_metric_name(_m.name)
    for _label in _m.labels:
        check_label_name(_label)
    if _m.is_counter != _m.name.endswith("_total"):
        raise AssertionError(f"{_m.name}: counters and only counters end in _total")
    METRICS[_m.name] = _m


#: Label values of the exported metrics, taken from the enums they report so one spelling wins.
THERMAL_SENSORS: tuple[str, ...] = ("memory", "hotspot")
FINDING_KINDS: tuple[str, ...] = tuple(k.value for k in FindingKind)
SEVERITIES: tuple[str, ...] = tuple(s.value for s in Severity)
ALERT_STATES: tuple[str, ...] = ("pending", "firing")
INCIDENT_STATES: tuple[str, ...] = ("open", "acknowledged")
BOOLEAN_VALUES: tuple[str, ...] = ("true", "false")
NOTIFICATION_OUTCOMES: tuple[str, ...] = ("sent", "failed", "rate_limited")
EXPORT_PREFIX = "hbmwatch_"

_EXPORT_DEVICE = ("cluster", "rack", "host", "gpu")

_EXPORTED_DEFINITIONS: tuple[MetricDef, ...] = (
    # -- derived signals --------------------------------------------------------------------
    _g(
        "hbmwatch_gpu_thermal_margin_celsius",
        "celsius",
        "Headroom of the sensor below its SKU's limit; negative = past it.",
        scope=Scope.EXPORT,
        labels=(*_EXPORT_DEVICE, "sku", "sensor"),
        label_values={"sensor": THERMAL_SENSORS},
    ),
    _g(
        "hbmwatch_gpu_anomaly_score",
        "score",
        "The detector's latest score for the GPU; 1.0 = at its threshold.",
        scope=Scope.EXPORT,
        labels=(*_EXPORT_DEVICE, "detector"),
    ),
    _g(
        "hbmwatch_workload_latency_p99_seconds",
        "seconds",
        "Latest p99 latency per workload.",
        scope=Scope.EXPORT,
        labels=("cluster", "service", "model", "phase"),
        label_values={"phase": PHASES},
    ),
    # -- findings, alerts, incidents --------------------------------------------------------
    _g(
        "hbmwatch_findings_open",
        "findings",
        "Open findings by kind and severity.",
        scope=Scope.EXPORT,
        labels=("kind", "severity"),
        label_values={"kind": FINDING_KINDS, "severity": SEVERITIES},
    ),
    _g(
        "hbmwatch_alerts",
        "alerts",
        "hbmwatch's own alerts by name, state and severity; muted = silenced or inhibited.",
        scope=Scope.EXPORT,
        labels=("alertname", "state", "severity", "muted"),
        label_values={"state": ALERT_STATES, "severity": SEVERITIES, "muted": BOOLEAN_VALUES},
    ),
    _g(
        "hbmwatch_incidents_open",
        "incidents",
        "Incidents not yet resolved, by severity, kind and state.",
        scope=Scope.EXPORT,
        labels=("severity", "kind", "state"),
        label_values={"severity": SEVERITIES, "kind": FINDING_KINDS, "state": INCIDENT_STATES},
    ),
    _c(
        "hbmwatch_alert_notifications_total",
        "notifications",
        "Alert notifications attempted, by receiver and outcome.",
        scope=Scope.EXPORT,
        labels=("receiver", "outcome"),
        label_values={"outcome": NOTIFICATION_OUTCOMES},
    ),
    # -- detection health -------------------------------------------------------------------
    _g(
        "hbmwatch_detection_lag_seconds",
        "seconds",
        "How far the last detection cycle's frame end trails now; growth = detection behind.",
        scope=Scope.EXPORT,
    ),
    _g(
        "hbmwatch_detection_cycle_seconds",
        "seconds",
        "Wall time of the last detection cycle.",
        scope=Scope.EXPORT,
    ),
)

EXPORTED: dict[str, MetricDef] = {}
for _m in _EXPORTED_DEFINITIONS:
    check_metric_name(_m.name)
    for _label in _m.labels:
        check_label_name(_label)
    if _m.is_counter != _m.name.endswith("_total"):
        raise AssertionError(f"{_m.name}: counters and only counters end in _total")
    if not _m.name.startswith(EXPORT_PREFIX) or _m.scope is not Scope.EXPORT:
        raise AssertionError(f"{_m.name}: exported metrics start with {EXPORT_PREFIX}")
    if _m.name in METRICS or _m.name in EXPORTED:
        raise AssertionError(f"{_m.name}: defined twice")
    EXPORTED[_m.name] = _m


def get(name: str) -> MetricDef | None:
    return METRICS.get(name)


def by_scope(scope: Scope) -> Iterable[MetricDef]:
    return (m for m in METRICS.values() if m.scope is scope)


def render_markdown() -> str:
    """``docs/metrics.md``; a test fails when the checked-in file differs."""
    lines = [
        "# Canonical metrics",
        "",
        "Generated from `hbmwatch/metrics.py` by `hbmwatch docs metrics`; do not edit by hand.",
        "",
        "Every source maps into these names; the store accepts nothing else.",
        "",
        "## Identity labels",
        "",
        "| scope | labels | required |",
        "|---|---|---|",
    ]
    for scope in Scope:
        lines.append(
            f"| {scope.value} | {', '.join(f'`{x}`' for x in SCOPE_LABELS[scope]) or '-'} | "
            f"{', '.join(f'`{x}`' for x in SCOPE_REQUIRED[scope]) or '-'} |"
        )
    lines += [
        "",
        "## Metrics",
        "",
        "| name | type | unit | scope | labels | help |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_markdown_row(m) for m in METRICS.values()]
    lines += [
        "",
        "## Exported by hbmwatch (/metrics)",
        "",
        "Served by hbmwatch's own `/metrics` for Grafana and Prometheus alerting "
        "(`alerts/promrules.py` generates rules over them); never stored, so the store "
        "rejects these names.",
        "",
        "| name | type | unit | scope | labels | help |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_markdown_row(m) for m in EXPORTED.values()]
    enums = {
        "throttle reasons": THROTTLE_REASONS,
        "phases": PHASES,
        "quantiles": QUANTILES,
    }
    lines += ["", "## Label values", ""]
    lines += [
        f"- {title}: {', '.join(f'`{v}`' for v in values)}" for title, values in enums.items()
    ]
    return "\n".join(lines) + "\n"


def _markdown_row(m: MetricDef) -> str:
    """One table row; shared so both tables spell labels and wrap widths alike."""
    labels = []
    for label in m.labels:
        values = m.label_values.get(label)
        labels.append(f"`{label}`" + (f" ({', '.join(values)})" if values else ""))
    extra = f" Wraps at 2^{' or 2^'.join(map(str, m.wrap_bits))}." if m.wrap_bits else ""
    return (
        f"| `{m.name}` | {m.type.value} | {m.unit} | {m.scope.value} | "
        f"{', '.join(labels) or '-'} | {m.help}{extra} |"
    )
