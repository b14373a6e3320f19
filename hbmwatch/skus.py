"""SKU facts, in one table: stacks, capacity, bandwidth, power and temperature limits.

Detectors take their limits from here, the simulator its physics, the dashboards their
thresholds.  Rows marked ``estimate`` are announced or inferred figures, with the source.
Temperature limits are where the vendor throttles (``*_slowdown_c``) and shuts down
(``*_shutdown_c``); a device's own reading (``amd-smi static --limit``, NVML thresholds)
overrides them in the inventory.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

GB = 10**9
TB = 10**12


class Vendor(StrEnum):
    AMD = "amd"
    NVIDIA = "nvidia"


@dataclass(frozen=True)
class Sku:
    name: str
    vendor: Vendor
    memory_bytes: int
    memory_type: str
    hbm_stacks: int
    memory_bandwidth_bytes_per_second: float
    board_power_watts: float
    cooling: str
    fabric: str
    fabric_links: int
    fabric_link_bytes_per_second: float
    compute_clock_mhz: float
    memory_clock_mhz: float
    hotspot_slowdown_c: float
    hotspot_shutdown_c: float
    memory_slowdown_c: float
    memory_shutdown_c: float
    estimate: bool
    source: str

    @property
    def stack_bandwidth_bytes_per_second(self) -> float:
        return self.memory_bandwidth_bytes_per_second / self.hbm_stacks


_AMD_CDNA3_LIMITS = dict(
    hotspot_slowdown_c=100.0,
    hotspot_shutdown_c=110.0,
    memory_slowdown_c=105.0,
    memory_shutdown_c=115.0,
)
_CDNA3_LIMITS_SOURCE = (
    "limits: amd-smi static --limit (AMD-SMI CLI doc, MI300A, same HBM3 generation); "
    "read per device from amd-smi where available"
)
_HOPPER_LIMITS = dict(
    hotspot_slowdown_c=89.0,
    hotspot_shutdown_c=95.0,
    memory_slowdown_c=95.0,
    memory_shutdown_c=105.0,
)
_HOPPER_LIMITS_SOURCE = (
    "limits: nvidia-smi -q T.Limit 87 C (current 37 C + margin 50 C on the real H200 "
    "capture; 41 + 46 on H100), slowdown -2 C and shutdown -8 C offsets; memory max "
    "operating 95 C from H100 nvidia-smi -q on older drivers (estimate)"
)

SKUS: dict[str, Sku] = {
    s.name: s
    for s in (
        Sku(
            "MI300X",
            Vendor.AMD,
            192 * GB,
            "HBM3",
            8,
            5.3 * TB,
            750,
            "air",
            "xgmi",
            7,
            128 * GB,
            2100,
            1300,
            **_AMD_CDNA3_LIMITS,
            estimate=False,
            source="AMD MI300X datasheet; " + _CDNA3_LIMITS_SOURCE,
        ),
        Sku(
            "MI325X",
            Vendor.AMD,
            256 * GB,
            "HBM3E",
            8,
            6.0 * TB,
            1000,
            "air",
            "xgmi",
            7,
            128 * GB,
            2100,
            1300,
            **_AMD_CDNA3_LIMITS,
            estimate=False,
            source="AMD MI325X datasheet; " + _CDNA3_LIMITS_SOURCE,
        ),
        Sku(
            "MI350X",
            Vendor.AMD,
            288 * GB,
            "HBM3E",
            8,
            8.0 * TB,
            1000,
            "air",
            "xgmi",
            7,
            76.8 * GB,
            2200,
            1600,
            **_AMD_CDNA3_LIMITS,
            estimate=False,
            source="AMD MI350 series launch; limits assumed as CDNA3 (estimate)",
        ),
        Sku(
            "MI355X",
            Vendor.AMD,
            288 * GB,
            "HBM3E",
            8,
            8.0 * TB,
            1400,
            "dlc",
            "xgmi",
            7,
            76.8 * GB,
            2400,
            1600,
            **_AMD_CDNA3_LIMITS,
            estimate=False,
            source="AMD MI350 series launch; limits assumed as CDNA3 (estimate)",
        ),
        Sku(
            "MI400X",
            Vendor.AMD,
            432 * GB,
            "HBM4",
            8,
            19.6 * TB,
            1500,
            "dlc",
            "ualink",
            1,
            1800 * GB,
            2400,
            2000,
            **_AMD_CDNA3_LIMITS,
            estimate=True,
            source="AMD MI400 announcements (432 GB HBM4, ~19.6 TB/s, UALink 1.8 TB/s); "
            "power and limits estimated",
        ),
        Sku(
            "MI430X",
            Vendor.AMD,
            432 * GB,
            "HBM4",
            8,
            19.6 * TB,
            1500,
            "dlc",
            "ualink",
            1,
            1800 * GB,
            2400,
            2000,
            **_AMD_CDNA3_LIMITS,
            estimate=True,
            source="AMD MI400 announcements; power and limits estimated",
        ),
        Sku(
            "MI440X",
            Vendor.AMD,
            432 * GB,
            "HBM4",
            8,
            19.6 * TB,
            1600,
            "dlc",
            "ualink",
            1,
            1800 * GB,
            2400,
            2000,
            **_AMD_CDNA3_LIMITS,
            estimate=True,
            source="AMD MI400 announcements; power and limits estimated",
        ),
        Sku(
            "MI455X",
            Vendor.AMD,
            432 * GB,
            "HBM4",
            8,
            19.6 * TB,
            1800,
            "dlc",
            "ualink",
            1,
            1800 * GB,
            2400,
            2000,
            **_AMD_CDNA3_LIMITS,
            estimate=True,
            source="AMD MI400 announcements (Helios 72-GPU rack); power and limits estimated",
        ),
        Sku(
            "H100",
            Vendor.NVIDIA,
            80 * GB,
            "HBM3",
            5,
            3.35 * TB,
            700,
            "air",
            "nvlink",
            18,
            50 * GB,
            1980,
            2619,
            **_HOPPER_LIMITS,
            estimate=False,
            source="NVIDIA H100 SXM datasheet; " + _HOPPER_LIMITS_SOURCE,
        ),
        Sku(
            "H200",
            Vendor.NVIDIA,
            141 * GB,
            "HBM3E",
            6,
            4.8 * TB,
            700,
            "air",
            "nvlink",
            18,
            50 * GB,
            1980,
            3201,
            **_HOPPER_LIMITS,
            estimate=False,
            source="NVIDIA H200 SXM datasheet; " + _HOPPER_LIMITS_SOURCE,
        ),
    )
}

#: Spellings seen in the wild (DME card_model, DCGM modelName, amd-smi MARKET_NAME).
_ALIASES = {
    "nvidia h100 80gb hbm3": "H100",
    "h100 80gb hbm3": "H100",
    "nvidia h100": "H100",
    "h100 sxm": "H100",
    "nvidia h200": "H200",
    "amd instinct mi300x": "MI300X",
    "amd instinct mi325x": "MI325X",
    "amd instinct mi350x": "MI350X",
    "amd instinct mi355x": "MI355X",
}


def lookup(name: str) -> Sku | None:
    """Find a SKU by its name or a vendor spelling of it.

    >>> lookup("NVIDIA H100 80GB HBM3").hbm_stacks
    5
    >>> lookup("mi355x").board_power_watts
    1400
    >>> lookup("Tesla T4") is None
    True
    """
    key = name.strip()
    if key.upper() in SKUS:
        return SKUS[key.upper()]
    alias = _ALIASES.get(key.lower())
    return SKUS[alias] if alias else None


def render_markdown() -> str:
    """``docs/skus.md``; a test fails when the checked-in file differs."""
    lines = [
        "# SKU facts",
        "",
        "Generated from `hbmwatch/skus.py` by `hbmwatch docs skus`; do not edit by hand.",
        "Limits are where the part slows down and shuts down; a device's own reading",
        "overrides them. Rows marked *estimate* are announced or inferred figures.",
        "",
        "| SKU | vendor | memory | stacks | bandwidth | board power | cooling | fabric "
        "| hotspot slowdown / shutdown | memory slowdown / shutdown | estimate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in SKUS.values():
        lines.append(
            f"| {s.name} | {s.vendor.value} | {s.memory_bytes / GB:.0f} GB {s.memory_type} "
            f"| {s.hbm_stacks} | {s.memory_bandwidth_bytes_per_second / TB:.2f} TB/s "
            f"| {s.board_power_watts:.0f} W | {s.cooling} "
            f"| {s.fabric} {s.fabric_links} x {s.fabric_link_bytes_per_second / GB:.1f} GB/s "
            f"| {s.hotspot_slowdown_c:.0f} / {s.hotspot_shutdown_c:.0f} C "
            f"| {s.memory_slowdown_c:.0f} / {s.memory_shutdown_c:.0f} C "
            f"| {'estimate' if s.estimate else ''} |"
        )
    lines += ["", "## Sources", ""]
    lines += [f"- **{s.name}**: {s.source}" for s in SKUS.values()]
    return "\n".join(lines) + "\n"
