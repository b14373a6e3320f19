"""nvidia-smi (``--query-gpu`` CSV and ``-q -x`` XML): field names, units, canonical targets.

From nvidia-smi's own ``--help-query-gpu`` and the captures in
``tests/fixtures/upstream/nvidia-smi-captures`` and ``tests/fixtures/real/h200``.
Drivers before 535 spell ``clocks_event_reasons`` as ``clocks_throttle_reasons``.
"""

from __future__ import annotations

#: Unit suffix -> factor into the canonical unit.
UNITS = {
    "": 1.0,
    "C": 1.0,
    "W": 1.0,
    "MHz": 1e6,
    "MiB": 2.0**20,
    "%": 0.01,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "x": 1.0,
    "KB/s": 1e3,
}

#: --query-gpu field -> (canonical metric, labels).
QUERY_FIELDS: dict[str, tuple[str, dict[str, str]]] = {
    "temperature.gpu": ("gpu_hotspot_temperature_celsius", {}),
    "temperature.memory": ("gpu_memory_temperature_celsius", {}),
    "power.draw": ("gpu_power_watts", {}),
    "power.draw.instant": ("gpu_power_watts", {}),
    "enforced.power.limit": ("gpu_power_limit_watts", {}),
    "clocks.current.sm": ("gpu_clock_hertz", {"domain": "compute"}),
    "clocks.sm": ("gpu_clock_hertz", {"domain": "compute"}),
    "clocks.current.memory": ("gpu_clock_hertz", {"domain": "memory"}),
    "clocks.mem": ("gpu_clock_hertz", {"domain": "memory"}),
    "utilization.gpu": ("gpu_utilization_ratio", {}),
    "utilization.memory": ("gpu_memory_bandwidth_utilization_ratio", {}),
    "memory.used": ("gpu_memory_used_bytes", {}),
    "memory.total": ("gpu_memory_total_bytes", {}),
    "pcie.link.width.current": ("gpu_pcie_link_width_lanes", {}),
    "ecc.errors.corrected.volatile.total": ("gpu_ecc_errors_total", {"severity": "correctable"}),
    "ecc.errors.uncorrected.volatile.total": (
        "gpu_ecc_errors_total",
        {"severity": "uncorrectable"},
    ),
    "clocks_event_reasons_counters.sw_power_cap": (
        "gpu_throttle_seconds_total",
        {"reason": "power"},
    ),
    "clocks_event_reasons_counters.sync_boost": (
        "gpu_throttle_seconds_total",
        {"reason": "sync_boost"},
    ),
    "clocks_event_reasons_counters.sw_thermal_slowdown": (
        "gpu_throttle_seconds_total",
        {"reason": "sw_thermal"},
    ),
    "clocks_event_reasons_counters.hw_thermal_slowdown": (
        "gpu_throttle_seconds_total",
        {"reason": "hw_thermal"},
    ),
    "clocks_event_reasons_counters.hw_power_brake_slowdown": (
        "gpu_throttle_seconds_total",
        {"reason": "power_brake"},
    ),
}
#: Later fields win over earlier ones for the same canonical series (instant over average).
PREFERRED = ("power.draw.instant", "clocks.current.sm", "clocks.current.memory")
BITMASK_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
IDENTITY_FIELDS = {
    "index": "gpu",
    "uuid": "uuid",
    "serial": "serial",
    "name": "model",
    "driver_version": "driver",
    "hostname": "host",
}

#: -q -x XML: element path under <gpu> -> (canonical metric, labels).
XML_PATHS: dict[str, tuple[str, dict[str, str]]] = {
    "temperature/gpu_temp": ("gpu_hotspot_temperature_celsius", {}),
    "temperature/memory_temp": ("gpu_memory_temperature_celsius", {}),
    "gpu_power_readings/instant_power_draw": ("gpu_power_watts", {}),
    "gpu_power_readings/current_power_limit": ("gpu_power_limit_watts", {}),
    "clocks/sm_clock": ("gpu_clock_hertz", {"domain": "compute"}),
    "clocks/mem_clock": ("gpu_clock_hertz", {"domain": "memory"}),
    "utilization/gpu_util": ("gpu_utilization_ratio", {}),
    "utilization/memory_util": ("gpu_memory_bandwidth_utilization_ratio", {}),
    "fb_memory_usage/used": ("gpu_memory_used_bytes", {}),
    "fb_memory_usage/total": ("gpu_memory_total_bytes", {}),
    "pci/pci_gpu_link_info/link_widths/current_link_width": ("gpu_pcie_link_width_lanes", {}),
    "pci/replay_counter": ("gpu_pcie_replays_total", {}),
    "ecc_errors/volatile/dram_correctable": ("gpu_ecc_errors_total", {"severity": "correctable"}),
    "ecc_errors/volatile/dram_uncorrectable": (
        "gpu_ecc_errors_total",
        {"severity": "uncorrectable"},
    ),
    "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap": (
        "gpu_throttle_seconds_total",
        {"reason": "power"},
    ),
    "clocks_event_reasons_counters/clocks_event_reasons_counters_sync_boost": (
        "gpu_throttle_seconds_total",
        {"reason": "sync_boost"},
    ),
    "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_therm_slowdown": (
        "gpu_throttle_seconds_total",
        {"reason": "sw_thermal"},
    ),
    "clocks_event_reasons_counters/clocks_event_reasons_counters_hw_therm_slowdown": (
        "gpu_throttle_seconds_total",
        {"reason": "hw_thermal"},
    ),
    "clocks_event_reasons_counters/clocks_event_reasons_counters_hw_power_brake": (
        "gpu_throttle_seconds_total",
        {"reason": "power_brake"},
    ),
}
#: -q -x active flags: <clocks_event_reasons>/<clocks_event_reason_X>Active</...>
XML_REASONS = {
    "sw_power_cap": "power",
    "hw_slowdown": "hw_slowdown",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "power_brake",
    "sw_thermal_slowdown": "sw_thermal",
    "sync_boost": "sync_boost",
}
