"""Vendor spellings, in one room: what each exporter calls a thing, in which unit.

Every entry maps one vendor family onto one canonical metric (``hbmwatch/metrics.py``)
with the factor that converts the vendor's unit into the canonical SI unit.  The collector
reads pages with these tables; the simulator writes its pages with the same tables, so a
spelling lives in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """One vendor metric family and how it becomes canonical.

    ``scale`` multiplies the vendor value into the canonical unit.  ``index_label`` names
    the vendor label that carries an index (``hbm_index``, ``link_index``) and the canonical
    label it becomes.  ``value_labels`` maps a vendor label's values onto canonical label
    values (``clock_type="system"`` -> ``domain="compute"``).
    """

    name: str
    metric: str | None
    unit: str
    help: str
    scale: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    index_label: tuple[str, str] | None = None
    value_labels: tuple[str, str, dict[str, str]] | None = None
    #: A gauge-typed accumulator that is really a counter (AMD types every family gauge).
    accumulator: bool = False
    #: A physical sensor, reported only on partition 0 of a GPU split into partitions.
    physical: bool = False
    #: Lower wins when two families give the same canonical series (old and new names).
    priority: int = 0
