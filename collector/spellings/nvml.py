"""NVML (nvidia-ml-py) field ids and what they become.

Field ids from ``nvml.h`` / pynvml (``NVML_FI_DEV_*``).  The PCIe byte counters (197, 198)
are 32-bit and wrap within minutes at 10 Hz on an H200 (DOMAIN.md); the store's rate
handles the wrap.  The clocks-event counters are nanoseconds of residency.
"""

from __future__ import annotations

#: field id -> (name for reports, canonical metric, labels, factor into the canonical unit)
FIELDS: dict[int, tuple[str, str, dict[str, str], float]] = {
    82: ("NVML_FI_DEV_MEMORY_TEMP", "gpu_memory_temperature_celsius", {}, 1.0),
    83: ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpu_energy_joules_total", {}, 1e-3),
    94: ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "gpu_pcie_replays_total", {}, 1.0),
    169: ("NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER", "gpu_pcie_recoveries_total", {}, 1.0),
    174: ("NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED", "gpu_pcie_naks_total", {"direction": "rx"}, 1.0),
    177: ("NVML_FI_DEV_PCIE_COUNT_NAKS_SENT", "gpu_pcie_naks_total", {"direction": "tx"}, 1.0),
    197: ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "gpu_pcie_bytes_total", {"direction": "tx"}, 1.0),
    198: ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "gpu_pcie_bytes_total", {"direction": "rx"}, 1.0),
    74: (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
        "gpu_throttle_seconds_total",
        {"reason": "power"},
        1e-9,
    ),
    76: (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
        "gpu_throttle_seconds_total",
        {"reason": "sync_boost"},
        1e-9,
    ),
    269: (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
        "gpu_throttle_seconds_total",
        {"reason": "sw_thermal"},
        1e-9,
    ),
    270: (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
        "gpu_throttle_seconds_total",
        {"reason": "hw_thermal"},
        1e-9,
    ),
    271: (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
        "gpu_throttle_seconds_total",
        {"reason": "power_brake"},
        1e-9,
    ),
}
#: Per-link NVLink data counters (KiB), read with the link as the field's scope id.
NVLINK_FIELDS = {
    138: ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "tx"),
    139: ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "rx"),
}
NVLINK_LINKS = 18
#: nvmlFieldValue_t.valueType -> the union member holding the value.
VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
