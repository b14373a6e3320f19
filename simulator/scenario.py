"""Scenario files: a fleet, a duration, a workload and faults with onset, ramp, end, target.

Scenarios are TOML (see ``docs/simulator.md`` and the bundled ``simulator/scenarios``).  A bad
file gets a ``ConfigError`` that names the field and the problem, e.g.
``faults[1].target.rack: unknown rack 'r9' (racks: r0, r1)``.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from hbmwatch.simulator.pods import PodMove, check_moves
from hbmwatch.skus import SKUS, Vendor
from hbmwatch.taxonomy import Cause, FindingKind
from hbmwatch.validation import ConfigError, parse_duration

BUNDLED = Path(__file__).resolve().parent / "scenarios"
Duration = Annotated[float, BeforeValidator(parse_duration)]
RampShape = Literal["linear", "exponential", "s_curve", "step"]
RAMP_SHAPES: tuple[str, ...] = RampShape.__args__  # type: ignore[attr-defined]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rack(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    cluster: str = Field("c0", pattern=r"^[a-z0-9][a-z0-9-]*$")
    nodes: int = Field(ge=1, le=256)
    sku: str
    cooling: Literal["air", "dlc"] | None = None
    inlet_c: float | None = Field(None, ge=5, le=60)
    compute_partition: Literal["spx", "cpx"] = "spx"
    memory_partition: Literal["nps1", "nps4"] = "nps1"
    dcgm_names: Literal["old", "4.6"] = "4.6"
    hbm_stack_sensors: bool = True
    #: How often the node's exporter refreshes its page (None: the scenario's).
    exporter_refresh: Duration | None = Field(None, ge=0, le=3600)
    #: Kubernetes: each service runs in a pod that the exporter names on its GPU's lines.
    pods: bool = False
    #: Services on the first N GPUs of each node (None: every GPU); the rest idle.
    services_per_node: int | None = Field(None, ge=0, le=8)

    @model_validator(mode="after")
    def _check(self) -> Rack:
        if self.sku not in SKUS:
            raise ValueError(f"unknown sku {self.sku!r} (known: {', '.join(SKUS)})")
        vendor = SKUS[self.sku].vendor
        if vendor is Vendor.NVIDIA and (self.compute_partition, self.memory_partition) != (
            "spx",
            "nps1",
        ):
            raise ValueError("compute/memory partition modes apply to AMD SKUs only")
        if self.memory_partition == "nps4" and self.compute_partition != "cpx":
            raise ValueError("memory_partition nps4 needs compute_partition cpx (as on MI300X)")
        return self

    @property
    def vendor(self) -> Vendor:
        return SKUS[self.sku].vendor

    @property
    def effective_cooling(self) -> str:
        return self.cooling or SKUS[self.sku].cooling

    @property
    def effective_inlet_c(self) -> float:
        if self.inlet_c is not None:
            return self.inlet_c
        return 32.0 if self.effective_cooling == "dlc" else 25.0

    @property
    def partitions(self) -> int:
        return 8 if self.compute_partition == "cpx" else 1

    def host(self, index: int) -> str:
        return f"{self.name}-node{index}"


class TrainingJob(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    racks: list[str] = Field(min_length=1)
    step_seconds: float = Field(2.0, gt=0, le=600)


class Workload(_Strict):
    requests_per_second: float = Field(6.0, gt=0, le=1000)
    diurnal_amplitude: float = Field(0.25, ge=0, lt=1)
    prompt_tokens: int = Field(1000, ge=1)
    output_tokens: int = Field(200, ge=1)
    training: list[TrainingJob] = []


class FaultKind(StrEnum):
    COOLANT_DEGRADATION = "coolant_degradation"
    DEGRADED_STACK = "degraded_stack"
    AMBIENT_HEAT = "ambient_heat"
    NOISY_NEIGHBOUR = "noisy_neighbour"
    FABRIC_LINK_DEGRADATION = "fabric_link_degradation"
    PCIE_REPLAY_STORM = "pcie_replay_storm"
    POWER_CAP = "power_cap"
    STUCK_SENSOR = "stuck_sensor"
    SENSOR_DROPOUT = "sensor_dropout"
    TARGET_DOWN = "target_down"
    XID_FATAL = "xid_fatal"
    XID_STORM = "xid_storm"
    ROW_REMAP_FAILURE = "row_remap_failure"


#: GPU error faults: their nodes' exporters write the error families (simulator/errors.py).
ERROR_FAULTS = (FaultKind.XID_FATAL, FaultKind.XID_STORM, FaultKind.ROW_REMAP_FAILURE)


#: What each fault needs as a target, its default magnitude (and what that means), the
#: findings it should produce and the root cause a detector should name.
FAULT_SPECS: dict[FaultKind, dict[str, Any]] = {
    FaultKind.COOLANT_DEGRADATION: dict(
        level="rack",
        magnitude=45.0,
        unit="C of inlet rise",
        findings=(FindingKind.THERMAL_EXCURSION, FindingKind.THROTTLE, FindingKind.P99_REGRESSION),
        cause=Cause.COOLING,
    ),
    FaultKind.DEGRADED_STACK: dict(
        level="gpu",
        magnitude=3.0,
        unit="x the stack's thermal resistance",
        findings=(FindingKind.THERMAL_EXCURSION,),
        cause=Cause.THERMAL,
    ),
    FaultKind.AMBIENT_HEAT: dict(
        level="cluster",
        magnitude=12.0,
        unit="C of inlet rise",
        findings=(FindingKind.THERMAL_EXCURSION,),
        cause=Cause.AMBIENT,
    ),
    FaultKind.NOISY_NEIGHBOUR: dict(
        level="gpu",
        magnitude=0.1,
        unit="duty of a co-tenant HBM copy",
        findings=(FindingKind.P99_REGRESSION,),
        cause=Cause.CO_TENANT,
    ),
    FaultKind.FABRIC_LINK_DEGRADATION: dict(
        level="gpu",
        magnitude=0.75,
        unit="fraction of link bandwidth lost",
        findings=(FindingKind.FABRIC_ERRORS, FindingKind.STEP_TIME_REGRESSION),
        cause=Cause.FABRIC,
    ),
    FaultKind.PCIE_REPLAY_STORM: dict(
        level="gpu",
        magnitude=400.0,
        unit="replays per second",
        findings=(FindingKind.PCIE_ERRORS, FindingKind.P99_REGRESSION),
        cause=Cause.PCIE,
    ),
    FaultKind.POWER_CAP: dict(
        level="gpu",
        magnitude=0.55,
        unit="cap as a fraction of board power",
        findings=(FindingKind.THROTTLE, FindingKind.P99_REGRESSION),
        cause=Cause.POWER_CAP,
    ),
    FaultKind.STUCK_SENSOR: dict(
        level="gpu",
        magnitude=0.0,
        unit="(none)",
        findings=(FindingKind.DATA_QUALITY,),
        cause=Cause.SENSOR,
    ),
    FaultKind.SENSOR_DROPOUT: dict(
        level="gpu",
        magnitude=0.0,
        unit="(none)",
        findings=(FindingKind.DATA_QUALITY,),
        cause=Cause.SENSOR,
    ),
    FaultKind.TARGET_DOWN: dict(
        level="node",
        magnitude=0.0,
        unit="(none)",
        findings=(FindingKind.DATA_QUALITY,),
        cause=Cause.TARGET_DOWN,
    ),
    FaultKind.XID_FATAL: dict(
        level="gpu",
        magnitude=10.0,
        unit="s from the error until the GPU's fields read blank",
        findings=(FindingKind.GPU_ERRORS, FindingKind.P99_REGRESSION),
        cause=Cause.GPU_ERROR,
    ),
    FaultKind.XID_STORM: dict(
        level="gpu",
        magnitude=30.0,
        unit="benign error events per minute",
        findings=(FindingKind.GPU_ERRORS,),
        cause=Cause.GPU_ERROR,
    ),
    FaultKind.ROW_REMAP_FAILURE: dict(
        level="gpu",
        magnitude=4.0,
        unit="uncorrectable rows remapped (over the ramp) before the remap fails",
        findings=(FindingKind.GPU_ERRORS,),
        cause=Cause.GPU_ERROR,
    ),
}


class Target(_Strict):
    cluster: str | None = None
    rack: str | None = None
    host: str | None = None
    gpu: int | None = Field(None, ge=0, le=7)
    stack: int | None = Field(None, ge=0, le=7)
    link: int | None = Field(None, ge=0, le=17)
    sensor: Literal["memory", "hotspot"] = "memory"


class Fault(_Strict):
    kind: FaultKind
    target: Target
    onset: Duration
    ramp: Duration = 0.0
    #: How the intensity rises over the ramp (``faults.intensity``): ``linear`` (the
    #: default), ``exponential`` (slow, then fast), ``s_curve`` (smoothstep) or ``step``
    #: (four equal jumps, the first at onset).
    shape: RampShape = "linear"
    end: Duration | None = None
    magnitude: float | None = None
    #: The findings this fault must raise, instead of its kind's (``FAULT_SPECS``).  A
    #: regression scenario lists only the workload's regression, so that the fault counts
    #: as detected, and its cause as right, only through the regression's own ranking.
    expect: tuple[FindingKind, ...] | None = Field(None, min_length=1)
    #: GPU error faults: the codes reported (XID or AFID; ``errors.DEFAULT_CODES`` if absent).
    codes: tuple[int, ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Fault:
        if self.end is not None and self.end <= self.onset + self.ramp:
            raise ValueError(
                f"end ({self.end:g} s) must come after onset + ramp ({self.onset + self.ramp:g} s)"
            )
        return self

    @property
    def expected_findings(self) -> tuple[FindingKind, ...]:
        return self.expect if self.expect is not None else FAULT_SPECS[self.kind]["findings"]

    @property
    def effective_magnitude(self) -> float:
        return self.magnitude if self.magnitude is not None else FAULT_SPECS[self.kind]["magnitude"]


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    duration: Duration
    seed: int = 0
    step: Duration = 1.0
    start: dt.datetime | None = None
    racks: list[Rack] = Field(min_length=1)
    workload: Workload = Workload()
    faults: list[Fault] = []
    #: Pods rescheduled between GPUs (``simulator/pods.py``); no fault, no incident expected.
    moves: list[PodMove] = []
    #: How often every node's exporter refreshes its page; between refreshes it serves the
    #: same bytes, as dcgm-exporter (``-c 30000`` by default) and DME's cache do.  0: every
    #: step.  A rack's ``exporter_refresh`` overrides it.
    exporter_refresh: Duration = Field(0.0, ge=0, le=3600)
    #: Scales the GPUs' traffic jitter and the sensors' read noise (1: as calibrated).
    noise: float = Field(1.0, ge=0, le=5)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if not 0.05 <= self.step <= 60:
            raise ValueError("step must be between 0.05 and 60 seconds")
        names = [r.name for r in self.racks]
        if len(set(names)) != len(names):
            raise ValueError(f"rack names must be unique: {names}")
        for job in self.workload.training:
            for rack in job.racks:
                if rack not in names:
                    raise ValueError(f"training job {job.name}: unknown rack {rack!r}")
        return self

    def rack(self, name: str) -> Rack:
        return next(r for r in self.racks if r.name == name)

    def refresh_of(self, rack: Rack) -> float:
        """Seconds between a rack's exporter page refreshes (0: a fresh page every step)."""
        return self.exporter_refresh if rack.exporter_refresh is None else rack.exporter_refresh

    def with_exporter_refresh(self, seconds: float) -> Scenario:
        """This scenario with every exporter refreshing every ``seconds`` (``sim`` and
        ``eval`` flags: the racks' own settings give way)."""
        racks = [r.model_copy(update={"exporter_refresh": None}) for r in self.racks]
        data = {**self.model_dump(), "exporter_refresh": seconds,
                "racks": [r.model_dump() for r in racks]}  # fmt: skip
        return Scenario.model_validate(data)

    @property
    def gpus(self) -> int:
        return sum(r.nodes * 8 for r in self.racks)


def _check_targets(scenario: Scenario) -> None:
    racks = {r.name: r for r in scenario.racks}
    clusters = {r.cluster for r in scenario.racks}
    hosts = {r.host(i): r for r in scenario.racks for i in range(r.nodes)}
    for i, fault in enumerate(scenario.faults):
        where = f"faults[{i}].target"
        t = fault.target
        level = FAULT_SPECS[fault.kind]["level"]
        if t.cluster is not None and t.cluster not in clusters:
            raise ConfigError(
                f"{where}.cluster: unknown cluster {t.cluster!r} "
                f"(clusters: {', '.join(sorted(clusters))})",
                field=f"{where}.cluster",
            )
        if t.rack is not None and t.rack not in racks:
            raise ConfigError(
                f"{where}.rack: unknown rack {t.rack!r} (racks: {', '.join(racks)})",
                field=f"{where}.rack",
            )
        if t.host is not None and t.host not in hosts:
            raise ConfigError(
                f"{where}.host: unknown host {t.host!r} (hosts look like {next(iter(hosts))})",
                field=f"{where}.host",
            )
        needed = {"rack": ("rack",), "node": ("host",), "gpu": ("host", "gpu"), "cluster": ()}[
            level
        ]
        missing = [n for n in needed if getattr(t, n) is None]
        if missing:
            raise ConfigError(
                f"{where}: a {fault.kind.value} fault needs {' and '.join(missing)}",
                field=f"{where}.{missing[0]}",
            )
        if fault.kind is FaultKind.DEGRADED_STACK:
            sku = SKUS[hosts[t.host].sku]  # type: ignore[index]
            if t.stack is None or t.stack >= sku.hbm_stacks:
                raise ConfigError(
                    f"{where}.stack: {sku.name} has stacks 0-{sku.hbm_stacks - 1}",
                    field=f"{where}.stack",
                )
        if fault.kind is FaultKind.FABRIC_LINK_DEGRADATION:
            sku = SKUS[hosts[t.host].sku]  # type: ignore[index]
            if t.link is None or t.link >= sku.fabric_links:
                raise ConfigError(
                    f"{where}.link: {sku.name} has links 0-{sku.fabric_links - 1}",
                    field=f"{where}.link",
                )
        if fault.kind in ERROR_FAULTS:
            from hbmwatch.simulator.errors import check_error_fault  # it imports this module

            check_error_fault(fault, hosts[t.host].vendor, where)  # type: ignore[index]
        if fault.onset >= scenario.duration:
            raise ConfigError(
                f"faults[{i}].onset: {fault.onset:g} s is after the scenario ends "
                f"({scenario.duration:g} s)",
                field=f"faults[{i}].onset",
            )


def _format_error(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"]).lstrip(".")
        msg = item["msg"].removeprefix("Value error, ")
        problems.append(f"{loc or 'scenario'}: {msg}")
    return "; ".join(problems)


def load_scenario(source: str | Path) -> Scenario:
    """Read a scenario file, or a bundled scenario by name (``default``, ``coolant_loss``)."""
    path = Path(source)
    if not path.exists() and (BUNDLED / f"{source}.toml").exists():
        path = BUNDLED / f"{source}.toml"
    if not path.exists():
        bundled = ", ".join(sorted(p.stem for p in BUNDLED.glob("*.toml")))
        raise ConfigError(
            f"scenario {source!s} not found (a file, or one of: {bundled})", field="scenario"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", field="scenario") from None
    return scenario_from_dict(data, origin=str(path))


def scenario_from_dict(data: dict[str, Any], origin: str = "scenario") -> Scenario:
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {_format_error(exc)}", field="scenario") from None
    try:
        _check_targets(scenario)
        check_moves(scenario)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}", **exc.detail) from None
    return scenario


def bundled_scenarios() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.toml"))
