"""Detectors: computations over windows of canonical data plus persisted state, no I/O.

``default_detectors`` is the one explicit list the runner, the evaluation and
``score-file`` share; the order matters (thermal state feeds correlation).
"""

from __future__ import annotations

from typing import Any


def default_detectors() -> list[Any]:
    from detectors.devices import LinkErrors, Throttling
    from detectors.latency import LatencyRegressions
    from detectors.outliers import FleetOutliers
    from detectors.quality import DataQuality
    from detectors.rootcause import RootCause
    from detectors.thermal import ThermalExcursions

    return [
        ThermalExcursions(),
        Throttling(),
        LinkErrors(),
        DataQuality(),
        LatencyRegressions(),
        FleetOutliers(),
        RootCause(),
    ]
