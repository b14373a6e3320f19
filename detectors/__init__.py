"""Detectors: computations over windows of canonical data plus persisted state, no I/O.

``default_detectors`` is the one explicit list the runner, the evaluation and
``score-file`` share; the order matters (thermal state feeds correlation).
"""

from __future__ import annotations

from typing import Any


def default_detectors(settings: Any = None) -> list[Any]:
    """``settings``: a ``DetectionSettings`` whose detector options apply (None: defaults)."""
    from hbmwatch.detectors.devices import LinkErrors, Throttling
    from hbmwatch.detectors.generic import SeriesAnomalies
    from hbmwatch.detectors.gpu_errors import GpuErrors
    from hbmwatch.detectors.latency import LatencyRegressions
    from hbmwatch.detectors.outliers import FleetOutliers
    from hbmwatch.detectors.quality import DataQuality
    from hbmwatch.detectors.rootcause import RootCause
    from hbmwatch.detectors.thermal import ThermalExcursions

    throttle: dict[str, float] = {}
    quality: dict[str, float] = {}
    if settings is not None:
        throttle["page_after_s"] = settings.throttle_page_after_seconds
        quality["first_up_grace_s"] = settings.target_first_up_grace_seconds
    return [
        ThermalExcursions(),
        Throttling(**throttle),
        LinkErrors(),
        GpuErrors(),  # before quality: a GPU off the bus explains its telemetry's gaps
        DataQuality(**quality),
        LatencyRegressions(),
        FleetOutliers(),
        SeriesAnomalies(),  # a user's own series (user_series_value); never a cause
        RootCause(),
    ]
