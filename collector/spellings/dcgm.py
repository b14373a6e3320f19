"""NVIDIA dcgm-exporter (``:9400/metrics``): fields, units, labels, both generations of names.

Field names from ``etc/default-counters.csv`` and DCGM's ``dcgm_fields`` (fixtures in
``tests/fixtures/upstream/nvidia-dcgm-exporter``).  DCGM 4.6 standardised the field
identifiers (``DCGM_FI_DEV_GPU_TEMP`` -> ``DCGM_FI_DEV_GPU_TEMP_CELSIUS``) and kept the old
ones as aliases, so both occur in the wild; so do the label spellings ``Hostname`` (before
dcgm-exporter #655) and ``hostname``.  A field DCGM cannot read on a device is exported as
the sentinel 9223372036854775794 (0x7ffffffffffffff2) and must be dropped.
"""

from __future__ import annotations

from hbmwatch.collector.spellings import Family

DEFAULT_PORT = 9400
#: What DCGM prints for a field it cannot read (DCGM_INT64_NOT_SUPPORTED, 0x7ffffffffffffff2).
NOT_SUPPORTED = 9223372036854775794
#: DCGM's "blank" ranges (blank, not found, not supported, not permissioned, ...): int64
#: 0x7ffffffffffffff0.., int32 0x7ffffff0.. and fp64 2**47 ... 2**47 + 16.
_INT64_BLANK = 9_223_372_036_854_775_792
_INT32_BLANK = (2_147_483_632, 2_147_483_647)
_FP64_BLANK = (140_737_488_355_328.0, 140_737_488_355_344.0)


def is_sentinel(value: float) -> bool:
    """True for DCGM's not-supported / blank markers, in any of its field types.

    >>> is_sentinel(9223372036854775794), is_sentinel(9.223372036854776e18), is_sentinel(41.0)
    (True, True, False)
    """
    return (
        value >= _INT64_BLANK - 4096  # parsed as float64 these all round to 2**63
        or _INT32_BLANK[0] <= value <= _INT32_BLANK[1]
        or _FP64_BLANK[0] <= value <= _FP64_BLANK[1]
    )


NVLINK_LINKS = 18

#: Labels on every series, by exporter generation.
LABELS_OLD = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)
LABELS_NEW = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "hostname",
    "DCGM_FI_DRIVER_VERSION",
)
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")

#: Bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS (the NVML clocks-event reasons) that hold
#: clocks down, -> canonical throttle reasons.  0x1 idle, 0x2 application clocks and
#: 0x100 display clocks are not throttles.
THROTTLE_BITS = {
    0x4: "power",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "power_brake",
}
REASONS_FIELDS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")

_MIB = 2.0**20


def _pair(
    old: str, new: str, metric: str | None, unit: str, help: str, **kw: object
) -> tuple[Family, Family]:
    return (
        Family(old, metric, unit, help, **kw),  # type: ignore[arg-type]
        Family(new, metric, unit, help, **kw),
    )  # type: ignore[arg-type]


FAMILIES: tuple[Family, ...] = (
    *_pair(
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        "gpu_hotspot_temperature_celsius",
        "C",
        "GPU temperature (in C).",
    ),
    *_pair(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
        "gpu_memory_temperature_celsius",
        "C",
        "Memory temperature (in C).",
    ),
    *_pair(
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_BOARD_POWER_WATTS",
        "gpu_power_watts",
        "W",
        "Power draw (in W).",
    ),
    *_pair(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
        "gpu_power_limit_watts",
        "W",
        "Effective power limit (in W).",
    ),
    *_pair(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",
        "gpu_power_limit_watts",
        "W",
        "Requested power limit (in W).",
        priority=1,
    ),
    Family(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "gpu_energy_joules_total",
        "mJ",
        "Total energy consumption since boot (in mJ).",
        scale=1e-3,
    ),
    Family(
        "DCGM_FI_DEV_SM_CLOCK",
        "gpu_clock_hertz",
        "MHz",
        "SM clock frequency (in MHz).",
        scale=1e6,
        labels={"domain": "compute"},
    ),
    Family(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gpu_clock_hertz",
        "MHz",
        "Memory clock frequency (in MHz).",
        scale=1e6,
        labels={"domain": "memory"},
    ),
    *_pair(
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        "gpu_utilization_ratio",
        "%",
        "GPU utilization (in %).",
        scale=0.01,
    ),
    *_pair(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_DRAM_UTIL_RATIO",
        "gpu_memory_bandwidth_utilization_ratio",
        "ratio",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    Family(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gpu_memory_bandwidth_utilization_ratio",
        "%",
        "Memory utilization (in %).",
        scale=0.01,
        priority=1,
    ),
    Family(
        "DCGM_FI_DEV_FB_USED",
        "gpu_memory_used_bytes",
        "MiB",
        "Framebuffer memory used (in MiB).",
        scale=_MIB,
    ),
    Family(
        "DCGM_FI_DEV_FB_TOTAL",
        "gpu_memory_total_bytes",
        "MiB",
        "Framebuffer memory total (in MiB).",
        scale=_MIB,
    ),
    *_pair(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
        "gpu_pcie_replays_total",
        "count",
        "Total number of PCIe retries.",
    ),
    Family(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gpu_pcie_link_width_lanes",
        "lanes",
        "PCIe current link width.",
    ),
    Family(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to power constraints (in ns).",
        scale=1e-9,
        labels={"reason": "power"},
    ),
    Family(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to thermal constraints (in ns).",
        scale=1e-9,
        labels={"reason": "sw_thermal"},
    ),
    Family(
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to sync-boost constraints (in ns).",
        scale=1e-9,
        labels={"reason": "sync_boost"},
    ),
    Family(
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to board limit constraints (in ns).",
        scale=1e-9,
        labels={"reason": "board_limit"},
    ),
    Family(
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to low utilization (in ns).",
        scale=1e-9,
        labels={"reason": "low_utilization"},
    ),
    Family(
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "gpu_throttle_seconds_total",
        "ns",
        "Throttling duration due to reliability constraints (in ns).",
        scale=1e-9,
        labels={"reason": "reliability"},
    ),
    Family(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "gpu_ecc_errors_total",
        "count",
        "Total number of single-bit volatile ECC errors.",
        labels={"severity": "correctable"},
    ),
    Family(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "gpu_ecc_errors_total",
        "count",
        "Total number of double-bit volatile ECC errors.",
        labels={"severity": "uncorrectable"},
    ),
    *_pair(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
        "gpu_fabric_bytes_total",
        "bytes",
        "Total number of NVLink bandwidth counters for all lanes.",
        labels={"fabric": "nvlink", "link": "all", "direction": "both"},
    ),
)


def _nvlink_families() -> tuple[Family, ...]:
    """Per-link NVLink counters: ``_COUNT_L<n>`` before DCGM 4.6, ``_L<n>_TOTAL`` after."""
    out: list[Family] = []
    for kind, error in (
        ("CRC_FLIT", "crc_flit"),
        ("CRC_DATA", "crc_data"),
        ("REPLAY", "replay"),
        ("RECOVERY", "recovery"),
    ):
        for link in range(NVLINK_LINKS):
            labels = {"fabric": "nvlink", "link": str(link), "error": error}
            help = f"NVLink {error} errors on link {link}."
            out.append(
                Family(
                    f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}",
                    "gpu_fabric_errors_total",
                    "count",
                    help,
                    labels=labels,
                )
            )
            out.append(
                Family(
                    f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_L{link}_TOTAL",
                    "gpu_fabric_errors_total",
                    "count",
                    help,
                    labels=labels,
                )
            )
    for link in range(NVLINK_LINKS):
        labels = {"fabric": "nvlink", "link": str(link), "direction": "both"}
        help = f"Bytes of active NVLink rx and tx data on link {link}."
        out.append(
            Family(
                f"DCGM_FI_DEV_NVLINK_BANDWIDTH_L{link}",
                "gpu_fabric_bytes_total",
                "bytes",
                help,
                labels=labels,
            )
        )
        out.append(
            Family(
                f"DCGM_FI_DEV_NVLINK_THROUGHPUT_L{link}",
                "gpu_fabric_bytes_total",
                "bytes",
                help,
                labels=labels,
            )
        )
    return tuple(out)


#: Error and health fields (docs/collector.md, "Errors and health").  The XID field is a
#: gauge of the last XID a GPU raised (0: none), with ``err_code``/``err_msg`` labels on
#: newer builds; the collector counts its changes (collector/sources/gpu_events.py).
XID_FIELDS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR")
#: dcgm-exporter's optional XID collector: ``{xid="N", window_size_in_ms=...}``, the count
#: of each XID within a sliding window (``--xid-count-window-size``); preferred when present.
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
#: dcgm-exporter's optional health collector: one line per DCGM health watch
#: (``health_watch``, ``health_error_code``), valued as DCGM's dcgmHealthWatchResult_t.
HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_RESULTS = {0: 0.0, 10: 1.0, 20: 2.0}  # PASS, WARN, FAIL -> 0 pass, 1 warn, 2 fail
HEALTH_WATCHES = {
    "ALL": "overall",
    "MEM": "memory",
    "NVSWITCH_NONFATAL": "nvswitch",
    "NVSWITCH_FATAL": "nvswitch",
    **{w: w.lower() for w in ("PCIE", "NVLINK", "PMU", "MCU", "SM", "INFOROM", "THERMAL")},
    **{w: w.lower() for w in ("POWER", "DRIVER")},
}
ERROR_FAMILIES: tuple[Family, ...] = (
    Family(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "gpu_row_remaps_total",
        "rows",
        "Number of remapped rows for correctable errors",
        labels={"severity": "correctable"},
    ),
    Family(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "gpu_row_remaps_total",
        "rows",
        "Number of remapped rows for uncorrectable errors",
        labels={"severity": "uncorrectable"},
    ),
    Family(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gpu_row_remap_failed",
        "boolean",
        "Whether remapping of rows has failed",
    ),
    Family(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gpu_row_remap_pending",
        "boolean",
        "Whether remapping of rows is pending",
    ),
    Family(
        "DCGM_FI_DEV_RETIRED_SBE",
        "gpu_retired_pages",
        "pages",
        "Total number of retired pages due to single-bit errors.",
        labels={"severity": "correctable"},
    ),
    Family(
        "DCGM_FI_DEV_RETIRED_DBE",
        "gpu_retired_pages",
        "pages",
        "Total number of retired pages due to double-bit errors.",
        labels={"severity": "uncorrectable"},
    ),
    Family(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "gpu_retired_pages_pending",
        "boolean",
        "Total number of pages pending retirement.",
    ),
)
FAMILIES = FAMILIES + _nvlink_families() + ERROR_FAMILIES
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
#: Old name -> DCGM 4.6 name, for the families that were renamed.
RENAMED = {
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
    **{
        f"DCGM_FI_DEV_NVLINK_{k}_ERROR_COUNT_L{n}": f"DCGM_FI_DEV_NVLINK_{k}_ERROR_L{n}_TOTAL"
        for k in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
        for n in range(NVLINK_LINKS)
    },
    **{
        f"DCGM_FI_DEV_NVLINK_BANDWIDTH_L{n}": f"DCGM_FI_DEV_NVLINK_THROUGHPUT_L{n}"
        for n in range(NVLINK_LINKS)
    },
}
#: Fields read as something other than a value (a bitmask, labels) or not kept.
IGNORED = frozenset(
    {
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_COUNT",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "DCGM_FI_DEV_PSTATE",
        "DCGM_FI_DEV_FAN_SPEED",
        "DCGM_FI_DEV_FB_USED_PERCENT",
    }
)
