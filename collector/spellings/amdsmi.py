"""amd-smi (CLI and the ``amdsmi`` library): key paths, units, and what they become.

``amd-smi metric --json`` prints a list of GPUs (newer CLIs wrap it as
``{"gpu_data": [...]}``); leaves are ``{"value": .., "unit": ..}`` or ``"N/A"``.  The text
output is the same tree with upper-case keys and ``VALUE UNIT`` strings.  Paths here are
lower case.  Examples: ``tests/fixtures/upstream/amdsmi``.
"""

from __future__ import annotations

#: Unit string -> factor into the canonical SI unit.
UNITS = {
    "": 1.0,
    "C": 1.0,
    "°C": 1.0,
    "W": 1.0,
    "mW": 1e-3,
    "uW": 1e-6,
    "J": 1.0,
    "mJ": 1e-3,
    "uJ": 1e-6,
    "MHz": 1e6,
    "GHz": 1e9,
    "kHz": 1e3,
    "%": 0.01,
    "B": 1.0,
    "KB": 2.0**10,
    "MB": 2.0**20,
    "GB": 2.0**30,
    "GT/s": 1e9,
    "mV": 1e-3,
}

#: (section, key) -> (canonical metric, fixed labels).  Units come with the values.
PATHS: dict[tuple[str, ...], tuple[str, dict[str, str]]] = {
    ("temperature", "hotspot"): ("gpu_hotspot_temperature_celsius", {}),
    ("temperature", "mem"): ("gpu_memory_temperature_celsius", {}),
    ("power", "socket_power"): ("gpu_power_watts", {}),
    ("power", "power_limit"): ("gpu_power_limit_watts", {}),
    ("usage", "gfx_activity"): ("gpu_utilization_ratio", {}),
    ("usage", "umc_activity"): ("gpu_memory_bandwidth_utilization_ratio", {}),
    ("clock", "gfx_0", "clk"): ("gpu_clock_hertz", {"domain": "compute"}),
    ("clock", "mem_0", "clk"): ("gpu_clock_hertz", {"domain": "memory"}),
    ("pcie", "width"): ("gpu_pcie_link_width_lanes", {}),
    ("pcie", "speed"): ("gpu_pcie_link_speed_transfers_per_second", {}),
    ("pcie", "replay_count"): ("gpu_pcie_replays_total", {}),
    ("pcie", "l0_to_recovery_count"): ("gpu_pcie_recoveries_total", {}),
    ("pcie", "nak_sent_count"): ("gpu_pcie_naks_total", {"direction": "tx"}),
    ("pcie", "nak_received_count"): ("gpu_pcie_naks_total", {"direction": "rx"}),
    ("ecc", "total_correctable_count"): ("gpu_ecc_errors_total", {"severity": "correctable"}),
    ("ecc", "total_uncorrectable_count"): ("gpu_ecc_errors_total", {"severity": "uncorrectable"}),
    ("ecc", "total_deferred_count"): ("gpu_ecc_errors_total", {"severity": "deferred"}),
    ("energy", "total_energy_consumption"): ("gpu_energy_joules_total", {}),
    ("mem_usage", "used_vram"): ("gpu_memory_used_bytes", {}),
    ("mem_usage", "total_vram"): ("gpu_memory_total_bytes", {}),
}
#: Per-stack HBM temperatures of the MI200 layout: temperature.hbm_0 .. hbm_3.
HBM_PREFIX = ("temperature", "hbm_")
#: Violation accumulators (ticks of accumulation_counter) and their status strings.
ACCUMULATION_COUNTER = ("throttle", "accumulation_counter")
VIOLATIONS = {
    "ppt": "power",
    "socket_thermal": "socket_thermal",
    "vr_thermal": "vr_thermal",
    "hbm_thermal": "hbm_thermal",
    "prochot": "prochot",
}
#: ``amd-smi monitor`` columns -> (canonical metric, labels).
MONITOR_COLUMNS = {
    "POWER": ("gpu_power_watts", {}),
    "GPU_T": ("gpu_hotspot_temperature_celsius", {}),
    "MEM_T": ("gpu_memory_temperature_celsius", {}),
    "GFX_CLK": ("gpu_clock_hertz", {"domain": "compute"}),
    "GFX%": ("gpu_utilization_ratio", {}),
    "MEM%": ("gpu_memory_bandwidth_utilization_ratio", {}),
    "GPU_TEMP": ("gpu_hotspot_temperature_celsius", {}),
    "MEM_TEMP": ("gpu_memory_temperature_celsius", {}),
    "VRAM_USED": ("gpu_memory_used_bytes", {}),
    "VRAM_TOTAL": ("gpu_memory_total_bytes", {}),
}
#: ``amdsmi_get_gpu_metrics_info()`` keys -> (canonical metric, labels, factor).
LIBRARY_METRICS = {
    "temperature_hotspot": ("gpu_hotspot_temperature_celsius", {}, 1.0),
    "temperature_mem": ("gpu_memory_temperature_celsius", {}, 1.0),
    "current_socket_power": ("gpu_power_watts", {}, 1.0),
    "average_gfx_activity": ("gpu_utilization_ratio", {}, 0.01),
    "average_umc_activity": ("gpu_memory_bandwidth_utilization_ratio", {}, 0.01),
    "current_gfxclk": ("gpu_clock_hertz", {"domain": "compute"}, 1e6),
    "current_uclk": ("gpu_clock_hertz", {"domain": "memory"}, 1e6),
    "pcie_link_width": ("gpu_pcie_link_width_lanes", {}, 1.0),
    "pcie_replay_count_acc": ("gpu_pcie_replays_total", {}, 1.0),
    "energy_accumulator": ("gpu_energy_joules_total", {}, 15.259e-6),  # 15.259 uJ a count
}
LIBRARY_VIOLATIONS = {
    "ppt_residency_acc": "power",
    "socket_thm_residency_acc": "socket_thermal",
    "vr_thm_residency_acc": "vr_thermal",
    "hbm_thm_residency_acc": "hbm_thermal",
    "prochot_residency_acc": "prochot",
}
