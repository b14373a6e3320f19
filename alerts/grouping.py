"""Which incident an alert belongs to: its problem, a cause family at a place.

Grouping by place alone put every fault of a rack into whatever incident the rack had open
(a target-down one at start-up, most often), and two faults on two hosts into one page.  An
alert's **problem** is the family of its finding's top cause (``hbmwatch.taxonomy.Cause``)
and the place that cause is about:

* ``cooling`` is about a rack, ``ambient`` about a cluster: one cause explains the heat of
  every GPU there, so a rack losing coolant stays one incident listing its GPUs;
* every other cause is about one host: two faults on two hosts are two incidents unless a
  rack's cooling or a room's heat explains both;
* a regression (p99, step time) is about the entity its top-ranked cause names (the host of
  that cause's evidence series), so it joins that hardware problem's incident; one with no
  cause found is about its service, and is its own incident;
* telemetry (``target_down``, ``sensor``) is a family of its own: it never absorbs, and is
  never absorbed by, a thermal or latency problem;
* a GPU's heat that its detector ranks over its rack's cooling (or the room's heat), as
  standing out beyond what warms with it, is its own problem: a stack degraded before its
  rack lost coolant stays one incident, and the rack's cooling another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from hbmwatch.records import Finding
from hbmwatch.taxonomy import Cause, FindingKind

#: Causes that are one problem when they meet on the same place (the family's first name).
FAMILIES: dict[str, str] = {
    Cause.THERMAL: Cause.THERMAL,
    Cause.HBM_THERMAL_THROTTLE: Cause.THERMAL,
    Cause.POWER_CAP: Cause.POWER_CAP,
    Cause.CLOCK_DROP: Cause.POWER_CAP,
    Cause.CO_TENANT: Cause.CO_TENANT,
    Cause.MEMORY_BANDWIDTH: Cause.CO_TENANT,
    Cause.TARGET_DOWN: Cause.TARGET_DOWN,
    Cause.SENSOR: Cause.TARGET_DOWN,
}

#: How wide a family's place is: a cause of a wider place explains the heat under it.
WIDTH: dict[str, int] = {Cause.AMBIENT: 2, Cause.COOLING: 1}

#: The families a wider heat cause explains (a rack's cooling explains its GPUs' heat).
HEAT = frozenset({Cause.THERMAL, Cause.COOLING, Cause.AMBIENT})
WIDER_HEAT = frozenset({Cause.COOLING, Cause.AMBIENT})

#: A finding with no ranked causes: the cause its kind stands for.
KIND_CAUSE: dict[str, str] = {
    FindingKind.THERMAL_EXCURSION: Cause.THERMAL,
    FindingKind.THROTTLE: Cause.CLOCK_DROP,
    FindingKind.FABRIC_ERRORS: Cause.FABRIC,
    FindingKind.PCIE_ERRORS: Cause.PCIE,
    FindingKind.GPU_ERRORS: Cause.GPU_ERROR,
    FindingKind.FLEET_OUTLIER: Cause.THERMAL,
    FindingKind.DATA_QUALITY: Cause.SENSOR,
    FindingKind.P99_REGRESSION: Cause.NONE,
    FindingKind.STEP_TIME_REGRESSION: Cause.NONE,
    FindingKind.SERIES_ANOMALY: Cause.NONE,
}

REGRESSIONS = frozenset({FindingKind.P99_REGRESSION, FindingKind.STEP_TIME_REGRESSION})

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Problem:
    """A cause family at a place: alerts with the same problem are one incident."""

    family: str
    place: tuple[tuple[str, str], ...]  # (label, value), narrowest last
    rack: str = field(default="", compare=False)  # where it sits, for wider causes
    cluster: str = field(default="", compare=False)
    own: bool = field(default=False, compare=False)  # heat ranked over a wider heat cause

    @property
    def scope(self) -> dict[str, str]:
        return dict(self.place)

    @property
    def width(self) -> int:
        return WIDTH.get(self.family, 0)

    def explains(self, other: Problem) -> bool:
        """Same problem, or a rack's cooling / a cluster's heat under which ``other`` sits."""
        if self == other:
            return True
        if self.width <= other.width or other.family not in HEAT or other.own:
            return False
        if self.cluster != other.cluster:
            return False
        return self.family == Cause.AMBIENT or (bool(self.rack) and self.rack == other.rack)


def cause_of(f: Finding) -> str:
    """The finding's top cause, or the cause its kind stands for (a rack warming: cooling)."""
    if f.causes:
        return str(f.causes[0].cause)
    rack_wide = f.entity.get("rack") and not (f.entity.get("host") or f.entity.get("gpu"))
    if f.kind == FindingKind.THERMAL_EXCURSION and rack_wide:
        return Cause.COOLING
    return KIND_CAUSE.get(f.kind, Cause.NONE)


def family_of(cause: str) -> str:
    return FAMILIES.get(cause, cause)


def problem_of(f: Finding) -> Problem:
    """Where the finding's top cause points: see the module docstring."""
    cause = cause_of(f)
    family = family_of(cause)
    entity: Mapping[str, str] = f.entity
    if f.kind in REGRESSIONS and family != Cause.NONE:
        entity = {**entity, **_named_entity(f)}
    cluster, rack = entity.get("cluster", ""), entity.get("rack", "")
    with_cluster = (("cluster", cluster),) if cluster else ()
    if family == Cause.AMBIENT:
        return Problem(family, with_cluster or (("fleet", "all"),), rack, cluster)
    if family == Cause.COOLING and rack:
        return Problem(family, (*with_cluster, ("rack", rack)), rack, cluster)
    own = family == Cause.THERMAL and any(c.cause in WIDER_HEAT for c in f.causes[1:])
    if f.kind in REGRESSIONS and family == Cause.NONE:
        keys = ("service", "host", "target")
    else:
        keys = ("host", "target", "service", "rack")
    for key in keys:
        if entity.get(key):
            return Problem(family, (*with_cluster, (key, entity[key])), rack, cluster, own)
    return Problem(family, with_cluster or (("fleet", "all"),), rack, cluster, own)


def _named_entity(f: Finding) -> dict[str, str]:
    """The place the top cause names: its own entity, else its first evidence series that
    names a host (its worst GPU)."""
    top = f.causes[0]
    named = [dict(top.entity)] if top.entity else []
    named += [dict(_LABEL.findall(e.series)) for e in top.evidence]
    for labels in named:
        if labels.get("host") or labels.get("rack"):
            return {k: labels[k] for k in ("cluster", "rack", "host", "gpu") if labels.get(k)}
    return {}


def widest(problems: list[Problem]) -> Problem:
    """The member problem that explains the most: the widest, else the first."""
    return max(enumerate(problems), key=lambda p: (p[1].width, -p[0]))[1]
