"""AMD Device Metrics Exporter (``:5000/metrics``): families, units, labels.

Names and units from the exporter's docs (``docs/configuration/metricslist.md``) and its
support matrix (``tests/fixtures/upstream/amd-device-metrics-exporter``).  Every family
is typed ``gauge`` by the exporter, accumulators included; a config may prefix every name
(``CommonConfig.MetricsFieldPrefix``, e.g. ``amd_``).  Old builds spelled label names in
upper case (``GPU_UUID``, ``SERIAL_NUMBER``); current builds lower-case them and always add
the mandatory labels.
"""

from __future__ import annotations

from hbmwatch.collector.spellings import Family

DEFAULT_PORT = 5000
PREFIXES = ("", "amd_")

#: Labels a current exporter puts on every GPU series.
MANDATORY_LABELS = (
    "card_model",
    "gpu_compute_partition_type",
    "gpu_id",
    "gpu_memory_partition_type",
    "gpu_partition_id",
    "hostname",
    "serial_number",
)
#: Label spellings of old builds -> current ones.
LEGACY_LABELS = {
    "GPU_UUID": "gpu_uuid",
    "SERIAL_NUMBER": "serial_number",
    "GPU_ID": "gpu_id",
    "HOSTNAME": "hostname",
    "CARD_MODEL": "card_model",
    "GPU_PARTITION_ID": "gpu_partition_id",
    "GPU_COMPUTE_PARTITION_TYPE": "gpu_compute_partition_type",
    "GPU_MEMORY_PARTITION_TYPE": "gpu_memory_partition_type",
    "DRIVER_VERSION": "driver_version",
}

#: ``clock_type`` values -> canonical clock domains.
CLOCK_DOMAINS = {
    "system": "compute",
    "memory": "memory",
    "soc": "soc",
    "data": "data",
    "video": "video",
    "fclk": "fabric",
}

#: The violation accumulators count ticks of ``gpu_violation_current_accumulated_counter``.
ACCUMULATION_COUNTER = "gpu_violation_current_accumulated_counter"
VIOLATION_REASONS = {
    "ppt": "power",
    "socket_thermal": "socket_thermal",
    "vr_thermal": "vr_thermal",
    "hbm_thermal": "hbm_thermal",
    "processor_hot": "prochot",
}

_MB = 2.0**20  # the exporter's "MB" is MiB: 192 GB MI300X shows 196,300 MB

FAMILIES: tuple[Family, ...] = (
    Family(
        "gpu_junction_temperature",
        "gpu_hotspot_temperature_celsius",
        "C",
        "Hotspot (aka junction) temperature value in Celsius",
        physical=True,
    ),
    Family(
        "gpu_memory_temperature",
        "gpu_memory_temperature_celsius",
        "C",
        "Memory temperature value in Celsius",
        physical=True,
    ),
    Family(
        "gpu_hbm_temperature",
        "gpu_hbm_stack_temperature_celsius",
        "C",
        "List of hbm temperatures in Celsius",
        index_label=("hbm_index", "stack"),
        physical=True,
    ),
    Family(
        "gpu_package_power", "gpu_power_watts", "W", "Current socket power in Watts", physical=True
    ),
    Family(
        "gpu_average_package_power",
        "gpu_power_watts",
        "W",
        "Average socket power in Watts",
        physical=True,
        priority=1,
    ),
    Family(
        "gpu_power_usage",
        "gpu_power_watts",
        "W",
        "GPU power usage in Watts",
        physical=True,
        priority=2,
    ),
    Family(
        "gpu_energy_consumed",
        "gpu_energy_joules_total",
        "uJ",
        "Accumulated energy consumed by the GPU in Micro Jules (uJ)",
        scale=1e-6,
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_gfx_activity",
        "gpu_utilization_ratio",
        "%",
        "Graphics engine usage percentage (0 - 100)",
        scale=0.01,
    ),
    Family(
        "gpu_umc_activity",
        "gpu_memory_bandwidth_utilization_ratio",
        "%",
        "Memory engine usage percentage (0 - 100)",
        scale=0.01,
    ),
    Family(
        "gpu_clock",
        "gpu_clock_hertz",
        "MHz",
        "Clock measure of the GPU in Mhz",
        scale=1e6,
        value_labels=("clock_type", "domain", CLOCK_DOMAINS),
        physical=True,
    ),
    Family(
        "gpu_used_vram", "gpu_memory_used_bytes", "MB", "Total VRAM memory used in MB", scale=_MB
    ),
    Family(
        "gpu_total_vram", "gpu_memory_total_bytes", "MB", "Total VRAM available in MB", scale=_MB
    ),
    Family(
        "pcie_speed",
        "gpu_pcie_link_speed_transfers_per_second",
        "GT/s",
        "Current pcie speed capable in GT/s",
        scale=1e9,
        physical=True,
    ),
    Family(
        "pcie_replay_count",
        "gpu_pcie_replays_total",
        "count",
        "Total number of PCIe replays (NAKs)",
        accumulator=True,
        physical=True,
    ),
    Family(
        "pcie_recovery_count",
        "gpu_pcie_recoveries_total",
        "count",
        "Total number of PCIe recoveries",
        accumulator=True,
        physical=True,
    ),
    Family(
        "pcie_nack_sent_count",
        "gpu_pcie_naks_total",
        "count",
        "PCIe NACK sent accumulated count",
        labels={"direction": "tx"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "pcie_nack_received_count",
        "gpu_pcie_naks_total",
        "count",
        "PCIe NACK received accumulated count",
        labels={"direction": "rx"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_ecc_correct_total",
        "gpu_ecc_errors_total",
        "count",
        "Total Correctable ECC error count",
        labels={"severity": "correctable"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_ecc_uncorrect_total",
        "gpu_ecc_errors_total",
        "count",
        "Total Uncorrectable ECC error count",
        labels={"severity": "uncorrectable"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_ecc_deferred_total",
        "gpu_ecc_errors_total",
        "count",
        "Total Deferred ECC error count",
        labels={"severity": "deferred"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_ecc_correct_xgmi_wafl",
        "gpu_fabric_errors_total",
        "count",
        "Correctable ECC error in XGMI WAFL",
        labels={"fabric": "xgmi", "link": "all", "error": "crc"},
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_xgmi_link_rx",
        "gpu_fabric_bytes_total",
        "KB",
        "Accumulated XGMI Link Data Read in KB",
        scale=1024.0,
        labels={"fabric": "xgmi", "direction": "rx"},
        index_label=("link_index", "link"),
        accumulator=True,
        physical=True,
    ),
    Family(
        "gpu_xgmi_link_tx",
        "gpu_fabric_bytes_total",
        "KB",
        "Accumulated XGMI Link Data Write in KB",
        scale=1024.0,
        labels={"fabric": "xgmi", "direction": "tx"},
        index_label=("link_index", "link"),
        accumulator=True,
        physical=True,
    ),
    Family(
        ACCUMULATION_COUNTER,
        None,
        "ticks",
        "Current Accumulated Violation Counter",
        accumulator=True,
        physical=True,
    ),
    *(
        Family(
            f"gpu_violation_{vendor}_residency_accumulated",
            "gpu_throttle_seconds_total",
            "ticks",
            f"{vendor} accumulated violation counter",
            labels={"reason": reason},
            accumulator=True,
            physical=True,
        )
        for vendor, reason in VIOLATION_REASONS.items()
    ),
    *(
        Family(
            f"gpu_violation_{vendor}_residency_percentage",
            "gpu_throttle_active",
            "%",
            f"{vendor} percentage violation counter",
            labels={"reason": reason},
            physical=True,
        )
        for vendor, reason in VIOLATION_REASONS.items()
    ),
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}

#: Error and health families (docs/collector.md, "Errors and health"), read by the
#: translator's own code, not as plain families.  ``gpu_afid_errors{afid_index, severity}``
#: holds the AFIDs of the last RAS (CPER) event, one line per index; ``gpu_health`` is the
#: exporter's verdict, 1 healthy and 0 not.  DME has no bad-page, retired-page or row-remap
#: family (docs/configuration/metricslist.md at the fixture's commit).
AFID_ERRORS = "gpu_afid_errors"
HEALTH = "gpu_health"
HEALTH_STATUS = {1.0: 0.0, 0.0: 2.0}  # healthy -> pass, unhealthy -> fail
#: Names the exporter emits that hbmwatch deliberately does not keep.
IGNORED = frozenset(
    {
        "gpu_nodes_total",
        "gpu_edge_temperature",
        "gpu_usage",
        "gpu_total_memory",
        "pcie_max_speed",
        "pcie_bandwidth",
        "pcie_bidirectional_bandwidth",
        "pcie_replay_rollover_count",
        "gpu_free_vram",
    }
)
