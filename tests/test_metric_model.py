"""The canonical metric model: one definition, its generated doc, its naming rules."""

from __future__ import annotations

from hbmwatch import metrics
from hbmwatch.metrics import EXPORTED, METRICS, MetricType, Scope
from tests.conftest import REPO

UNIT_SUFFIXES = {
    "celsius": "_celsius",
    "watts": "_watts",
    "joules": "_joules_total",
    "hertz": "_hertz",
    "ratio": "_ratio",
    "bytes": "_bytes",
    "seconds": "_seconds",
    "bytes_per_second": "_bytes_per_second",
}


def test_docs_metrics_md_is_generated_from_the_model() -> None:
    checked_in = (REPO / "docs" / "metrics.md").read_text()
    assert checked_in == metrics.render_markdown(), "run: hbmwatch docs metrics"


def test_units_follow_prometheus_suffixes() -> None:
    for m in METRICS.values():
        suffix = UNIT_SUFFIXES.get(m.unit)
        if suffix:
            stem = m.name.removesuffix("_total") if m.unit != "joules" else m.name
            assert stem.endswith(suffix.removesuffix("_total")) or m.name.endswith(suffix), m.name


def test_counters_and_only_counters_end_in_total() -> None:
    for m in METRICS.values():
        assert (m.type is MetricType.COUNTER) == m.name.endswith("_total"), m.name


def test_model_covers_what_the_issue_names() -> None:
    names = set(METRICS)
    for required in (
        "gpu_hotspot_temperature_celsius",
        "gpu_memory_temperature_celsius",
        "gpu_hbm_stack_temperature_celsius",
        "gpu_memory_bandwidth_utilization_ratio",
        "gpu_power_watts",
        "gpu_energy_joules_total",
        "gpu_clock_hertz",
        "gpu_throttle_seconds_total",
        "gpu_throttle_active",
        "gpu_fabric_bytes_total",
        "gpu_fabric_errors_total",
        "gpu_pcie_bytes_total",
        "gpu_pcie_replays_total",
        "gpu_pcie_recoveries_total",
        "gpu_pcie_naks_total",
        "gpu_ecc_errors_total",
        "gpu_utilization_ratio",
        "gpu_memory_used_bytes",
        "workload_latency_seconds",
        "workload_requests_total",
        "hbmwatch_target_up",
        "hbmwatch_scrape_duration_seconds",
        "hbmwatch_scrape_samples",
        "hbmwatch_scrape_dropped_total",
    ):
        assert required in names
    assert METRICS["gpu_hbm_stack_temperature_celsius"].labels == ("stack",)
    reasons = METRICS["gpu_throttle_seconds_total"].label_values["reason"]
    for reason in ("hbm_thermal", "socket_thermal", "vr_thermal", "power", "hw_slowdown"):
        assert reason in reasons
    assert set(METRICS["gpu_fabric_bytes_total"].label_values["fabric"]) == {
        "xgmi",
        "nvlink",
        "ualink",
    }
    assert set(METRICS["workload_latency_seconds"].label_values["phase"]) == {
        "ttft",
        "inter_token",
        "e2e",
        "step",
    }


def test_identity_labels_are_those_of_the_design() -> None:
    device = metrics.SCOPE_LABELS[Scope.DEVICE]
    for label in (
        "cluster",
        "rack",
        "host",
        "gpu",
        "uuid",
        "serial",
        "sku",
        "partition",
        "compute_partition",
        "memory_partition",
    ):
        assert label in device
    assert {"job", "pod", "namespace", "service", "model"} <= set(metrics.WORKLOAD_LABELS)


def test_exported_metrics_are_separate_from_the_stored_ones() -> None:
    # The store looks names up in METRICS: an exported name there would become storable.
    assert EXPORTED
    assert not set(EXPORTED) & set(METRICS)
    for m in EXPORTED.values():
        assert m.name.startswith("hbmwatch_"), m.name
        assert m.scope is Scope.EXPORT, m.name
        assert (m.type is MetricType.COUNTER) == m.name.endswith("_total"), m.name
        suffix = UNIT_SUFFIXES.get(m.unit)
        if suffix:
            assert m.name.removesuffix("_total").endswith(suffix), m.name
    assert metrics.get("hbmwatch_findings_open") is None
    assert not list(metrics.by_scope(Scope.EXPORT))


def test_exported_metrics_cover_what_the_issue_names() -> None:
    expected = {
        "hbmwatch_gpu_thermal_margin_celsius": ("cluster", "rack", "host", "gpu", "sku", "sensor"),
        "hbmwatch_gpu_anomaly_score": ("cluster", "rack", "host", "gpu", "detector"),
        "hbmwatch_workload_latency_p99_seconds": ("cluster", "service", "model", "phase"),
        "hbmwatch_findings_open": ("kind", "severity"),
        "hbmwatch_alerts": ("alertname", "state", "severity", "muted"),
        "hbmwatch_incidents_open": ("severity", "kind", "state"),
        "hbmwatch_alert_notifications_total": ("receiver", "outcome"),
        "hbmwatch_detection_lag_seconds": (),
        "hbmwatch_detection_cycle_seconds": (),
    }
    assert {name: m.labels for name, m in EXPORTED.items()} == expected
    assert EXPORTED["hbmwatch_alert_notifications_total"].type is MetricType.COUNTER
    values = EXPORTED["hbmwatch_alert_notifications_total"].label_values["outcome"]
    assert set(values) == {"sent", "failed", "rate_limited"}
    assert set(EXPORTED["hbmwatch_gpu_thermal_margin_celsius"].label_values["sensor"]) == {
        "memory",
        "hotspot",
    }
    assert "## Exported by hbmwatch (/metrics)" in metrics.render_markdown()
