"""The words findings and ground truth share: what was found, and what caused it.

The simulator labels its faults with these; the detectors report with them; the evaluation
compares the two.  One list, so a cause cannot be spelled two ways.
"""

from __future__ import annotations

from enum import StrEnum


class FindingKind(StrEnum):
    THERMAL_EXCURSION = "thermal_excursion"
    THROTTLE = "throttle"
    P99_REGRESSION = "p99_regression"
    STEP_TIME_REGRESSION = "step_time_regression"
    FABRIC_ERRORS = "fabric_errors"
    PCIE_ERRORS = "pcie_errors"
    FLEET_OUTLIER = "fleet_outlier"
    DATA_QUALITY = "data_quality"
    GPU_ERRORS = "gpu_errors"  # fatal XID/AFID codes, benign storms, failed row remaps
    SERIES_ANOMALY = "series_anomaly"  # a user's own series (user_series_value) left its baseline


class Cause(StrEnum):
    """Root causes a detector can name for a regression (and the ground truth uses)."""

    THERMAL = "thermal"  # a thermal excursion (hot memory or die)
    HBM_THERMAL_THROTTLE = "hbm_thermal_throttle"  # clocks/bandwidth held down by HBM heat
    COOLING = "cooling"  # rack-level coolant or airflow loss
    AMBIENT = "ambient"  # room / diurnal heat across many racks
    POWER_CAP = "power_cap"
    CLOCK_DROP = "clock_drop"
    FABRIC = "fabric"  # fabric link errors or lost link bandwidth
    PCIE = "pcie"  # PCIe replays, recoveries, NAKs
    MEMORY_BANDWIDTH = "memory_bandwidth"  # the GPU's own HBM saturated
    CO_TENANT = "co_tenant"  # another workload on the same GPU (noisy neighbour)
    GPU_ERROR = "gpu_error"  # the GPU reported a fatal or reset-needing error (XID, AFID)
    SENSOR = "sensor"  # stuck sensor, dropout, sentinel
    TARGET_DOWN = "target_down"
    NONE = "none"  # no cause found on the same GPU, node or rack

    @property
    def is_thermal(self) -> bool:
        return self in (Cause.THERMAL, Cause.HBM_THERMAL_THROTTLE, Cause.COOLING, Cause.AMBIENT)
