"""Randomised scenarios: ``hbmwatch eval --random N --seed S`` draws its fleets and faults here.

The bundled scenarios have fixed fault shapes, sizes and start times; these draw them from
stated distributions (``DISTRIBUTIONS``, one definition: docs/simulator.md's table is
tested against it) so that the detection figures say where detection stops working.  Each
draw is a plain ``Scenario`` built through the same pydantic model and target checks as a
TOML file (a draw the simulator refuses is drawn again, and counted), so its ground truth
is the scenario's faults, exactly as for a bundled one, and ``scenario_toml`` writes it out
for ``hbmwatch eval FILE`` to rerun.  Alongside goes a ``FaultDraw`` per fault: its kind,
relative magnitude, duration, ramp and shape, SKU and overlap, for the detection-limit
report (``hbmwatch.evaluation.limits``) to bin by.

*Relative magnitude* is the fault's size over its kind's default size (``FAULT_SPECS``),
where size is the magnitude itself except for ``degraded_stack`` (the resistance above 1x)
and ``power_cap`` (the board power taken away, 1 - cap): 1.0 is the default fault, 0.5 one
half as big.  Kinds whose magnitude is no size (sensor and target faults; ``xid_fatal``'s
is a delay) keep their default and have none.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hbmwatch.simulator.scenario import (
    FAULT_SPECS,
    RAMP_SHAPES,
    FaultKind,
    Scenario,
    scenario_from_dict,
)
from hbmwatch.skus import SKUS, Vendor
from hbmwatch.validation import ConfigError

K = FaultKind
#: Every distribution a draw comes from; docs/simulator.md's table shows (and a test checks)
#: these.  Ranges are (low, high); ``log`` ones are log-uniform, the rest uniform.
DISTRIBUTIONS: dict[str, tuple[Any, str]] = {
    "gpu_hours": (5.0, "healthy GPU-h a run holds: the fleet is sized, the run lengthened, so"),
    "nodes": ((1, 12), "... within these bounds (8 GPUs a node)"),
    "racks": ((1, 3), "integers, uniform (at most one per node); nodes spread at random"),
    "vendor_nvidia": (0.5, "probability a rack is NVIDIA (then its SKU uniform in vendor)"),
    "cooling_override": (0.25, "probability a rack has the other cooling than its SKU's"),
    "cpx": (0.1, "probability an AMD rack runs CPX/NPS4 partitions (MI300-class)"),
    "clusters": (0.3, "probability the racks spread over two clusters"),
    "onset_hour": ((0.0, 24.0), "hour of the simulated day the run starts, to the minute"),
    "lead_s": ((180.0, 360.0), "fault onset after the run starts (detectors warm up)"),
    "duration_s_log": ((10.0, 1200.0), "fault duration, log-uniform ..."),
    "long": (0.05, "... or with this probability long:"),
    "duration_s_long": ((1200.0, 7200.0), "log-uniform"),
    "ramp_fraction": ((0.0, 0.5), "ramp as a fraction of the duration"),
    "ramp_none": (0.3, "probability of no ramp at all (a step at onset)"),
    "shapes": (RAMP_SHAPES, "ramp shape, uniform"),
    "tail_s": (180.0, "the run goes on this long after the last fault ends"),
    "overlap": (0.2, "probability of a second fault, other kind, same rack, overlapping"),
    "rps_log": ((2.0, 20.0), "requests per second per service, log-uniform"),
    "diurnal_amplitude": ((0.0, 0.4), "of the daily load pattern, uniform"),
    "training": (0.4, "probability a training job runs on one rack"),
    "noise": ((1.0, 2.0), "traffic jitter and sensor read noise, x the calibrated (not below)"),
}

_D = {key: value for key, (value, _) in DISTRIBUTIONS.items()}

#: Fault kinds, weighted: each kind often enough for its own row in 200 draws (the two
#: that AMD GPUs cannot show weigh double: on AMD racks they are drawn again).
KIND_WEIGHTS: dict[FaultKind, float] = {
    K.COOLANT_DEGRADATION: 1.0, K.DEGRADED_STACK: 1.0, K.AMBIENT_HEAT: 1.0,
    K.NOISY_NEIGHBOUR: 1.0, K.FABRIC_LINK_DEGRADATION: 1.0, K.PCIE_REPLAY_STORM: 1.0,
    K.POWER_CAP: 1.0, K.STUCK_SENSOR: 0.6, K.SENSOR_DROPOUT: 0.6, K.TARGET_DOWN: 0.6,
    K.XID_FATAL: 0.6, K.XID_STORM: 1.2, K.ROW_REMAP_FAILURE: 1.2,
}  # fmt: skip

#: Relative magnitude per kind, log-uniform over (low, high); None: no magnitude drawn.
RELATIVE_MAGNITUDE: dict[FaultKind, tuple[float, float] | None] = {
    K.COOLANT_DEGRADATION: (0.2, 1.5), K.DEGRADED_STACK: (0.2, 2.0), K.AMBIENT_HEAT: (0.2, 2.0),
    K.NOISY_NEIGHBOUR: (0.2, 3.0), K.FABRIC_LINK_DEGRADATION: (0.2, 1.3),
    K.PCIE_REPLAY_STORM: (0.1, 3.0), K.POWER_CAP: (0.2, 1.6), K.STUCK_SENSOR: None,
    K.SENSOR_DROPOUT: None, K.TARGET_DOWN: None, K.XID_FATAL: None, K.XID_STORM: (0.1, 3.0),
    K.ROW_REMAP_FAILURE: (0.25, 3.0),
}  # fmt: skip

#: The stated limits: a fault at least this big (relative magnitude; None: any) and this
#: long (s) is "above the limits", where the issue asks recall >= 0.9.  From the
#: development runs (seeds 100-199, 58 draws, 19 of them picked at or above a limit): 33 of
#: the 35 faults above these were found (one incident, paged, top cause right), every kind
#: at least once; the two others, a coolant fault and a fabric fault overlapping it on
#: its rack, were merged into one incident (docs/eval-misses/random-120-007.toml: grouping).  Below
#: them a power cap of 0.34-0.55x (its cut only bites under heavy load) and 16-74 s noisy
#: neighbours were missed, while many 20-45 s faults of other kinds were found: the limits
#: are conservative, the 0.5 crossings say where detection really stops.  Durations leave
#: room for the slowest pages seen: a slowly ramping power cap paged 456 s after onset, a
#: noisy neighbour 174 s, a stuck sensor 122 s.
DETECTABLE: dict[FaultKind, tuple[float | None, float]] = {
    K.COOLANT_DEGRADATION: (0.5, 300.0), K.DEGRADED_STACK: (0.7, 300.0),
    K.AMBIENT_HEAT: (0.7, 600.0), K.NOISY_NEIGHBOUR: (0.7, 600.0),
    K.FABRIC_LINK_DEGRADATION: (0.5, 300.0), K.PCIE_REPLAY_STORM: (0.3, 300.0),
    K.POWER_CAP: (1.0, 600.0), K.STUCK_SENSOR: (None, 600.0), K.SENSOR_DROPOUT: (None, 300.0),
    K.TARGET_DOWN: (None, 300.0), K.XID_FATAL: (None, 60.0), K.XID_STORM: (0.3, 300.0),
    K.ROW_REMAP_FAILURE: (0.25, 120.0),
}  # fmt: skip

_NVIDIA = [s for s, sku in SKUS.items() if sku.vendor is Vendor.NVIDIA]
_AMD = [s for s, sku in SKUS.items() if sku.vendor is Vendor.AMD]
_CPX = {"MI300X", "MI325X"}  # AMD SKUs the bundled scenarios run in CPX/NPS4
MIDNIGHT = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)  # EVAL_START's day
MAX_REDRAWS = 1000


@dataclass(frozen=True)
class FaultDraw:
    """One fault's drawn parameters, what the limits report bins by."""

    scenario: str
    fault_id: str
    kind: str
    rel_magnitude: float | None
    duration_s: float
    ramp_s: float
    shape: str
    sku: str
    overlap: bool  # shares its rack and time with another fault of another kind


@dataclass(frozen=True)
class RandomScenario:
    scenario: Scenario
    faults: tuple[FaultDraw, ...]
    redraws: int  # draws the simulator refused before this one

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "redraws": self.redraws,
                "gpus": self.scenario.gpus, "duration_s": self.scenario.duration,
                "faults": [asdict(f) for f in self.faults]}  # fmt: skip


def magnitude_of(kind: FaultKind, relative: float) -> float:
    """The fault's magnitude for a relative size (see the module doc)."""
    default = float(FAULT_SPECS[kind]["magnitude"])
    if kind is K.DEGRADED_STACK:
        return 1.0 + relative * (default - 1.0)
    if kind is K.POWER_CAP:
        return 1.0 - relative * (1.0 - default)
    if kind is K.ROW_REMAP_FAILURE:
        return float(max(1, round(relative * default)))
    return relative * default


def relative_of(kind: FaultKind, magnitude: float) -> float:
    """The inverse of ``magnitude_of``."""
    default = float(FAULT_SPECS[kind]["magnitude"])
    if kind is K.DEGRADED_STACK:
        return (magnitude - 1.0) / (default - 1.0)
    if kind is K.POWER_CAP:
        return (1.0 - magnitude) / (1.0 - default)
    return magnitude / default


def draw_scenarios(n: int, seed: int) -> list[RandomScenario]:
    """``n`` scenarios drawn from ``seed``: the same seed gives the same scenarios."""
    return [draw_scenario(seed, i) for i in range(n)]


def draw_scenario(seed: int, index: int) -> RandomScenario:
    """Scenario ``index`` of ``seed`` (independent of the others: its own stream)."""
    rng = np.random.default_rng([seed, index, 19])
    name = f"random-{seed}-{index:03d}"
    for redraws in range(MAX_REDRAWS):
        data, draws = _draw(rng, name, seed * 1000 + index)
        try:
            scenario = scenario_from_dict(data, origin=name)
        except ConfigError:
            continue
        return RandomScenario(scenario, draws, redraws)
    raise RuntimeError(f"{name}: no valid draw in {MAX_REDRAWS} tries")  # pragma: no cover


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _racks(rng: np.random.Generator, nodes: int, ambient: bool) -> list[dict[str, Any]]:
    """``nodes`` nodes split over 1-3 racks, each of one SKU; for an ambient fault at least
    two racks in one cluster (with one, ambient heat and a coolant fault are the same)."""
    d = _D
    count = min(nodes, int(rng.integers(d["racks"][0], d["racks"][1] + 1)))
    count = max(count, 2) if ambient else count
    sizes = rng.multinomial(nodes - count, [1.0 / count] * count) + 1
    two_clusters = rng.random() < d["clusters"] and not ambient
    racks = []
    for i, size in enumerate(sizes.tolist()):
        nvidia = rng.random() < d["vendor_nvidia"]
        sku = str(rng.choice(_NVIDIA if nvidia else _AMD))
        rack: dict[str, Any] = {"name": f"r{i}", "nodes": int(size), "sku": sku}
        if two_clusters:
            rack["cluster"] = f"c{i % 2}"
        if rng.random() < d["cooling_override"]:
            rack["cooling"] = "air" if SKUS[sku].cooling == "dlc" else "dlc"
        if sku in _CPX and rng.random() < d["cpx"]:
            rack |= {"compute_partition": "cpx", "memory_partition": "nps4"}
        racks.append(rack)
    return racks


def _target(rng: np.random.Generator, kind: FaultKind, rack: dict[str, Any]) -> dict[str, Any]:
    """A target of the kind's level inside ``rack``."""
    level = FAULT_SPECS[kind]["level"]
    host = f"{rack['name']}-node{int(rng.integers(rack['nodes']))}"
    sku = SKUS[rack["sku"]]
    if level == "cluster":
        return {"cluster": rack.get("cluster", "c0")}
    if level == "rack":
        return {"rack": rack["name"]}
    if level == "node":
        return {"host": host}
    target: dict[str, Any] = {"host": host, "gpu": int(rng.integers(8))}
    if kind is K.DEGRADED_STACK:
        target["stack"] = int(rng.integers(sku.hbm_stacks))
    if kind is K.FABRIC_LINK_DEGRADATION:
        target["link"] = int(rng.integers(sku.fabric_links))
    if kind in (K.STUCK_SENSOR, K.SENSOR_DROPOUT):
        target["sensor"] = str(rng.choice(["memory", "hotspot"]))
    return target


def _duration(rng: np.random.Generator) -> float:
    d = _D
    span = d["duration_s_long"] if rng.random() < d["long"] else d["duration_s_log"]
    return float(round(_log_uniform(rng, *span)))


def _timing(rng: np.random.Generator, onset: float) -> dict[str, Any]:
    """Onset, end, ramp and shape of one fault."""
    d = _D
    duration = _duration(rng)
    timing: dict[str, Any] = {"onset": float(onset), "end": float(onset + duration)}
    if rng.random() >= d["ramp_none"]:
        ramp = float(round(rng.uniform(*d["ramp_fraction"]) * duration))
        if ramp > 0:
            timing |= {"ramp": ramp, "shape": str(rng.choice(d["shapes"]))}
    return timing


def _fault(rng: np.random.Generator, kind: FaultKind, rack: dict[str, Any],
           timing: dict[str, Any]) -> tuple[dict[str, Any], float | None]:  # fmt: skip
    """A fault of ``kind`` on ``rack``; its TOML dict and relative size."""
    fault: dict[str, Any] = {"kind": kind.value, "target": _target(rng, kind, rack), **timing}
    rel = None
    if (span := RELATIVE_MAGNITUDE[kind]) is not None:
        fault["magnitude"] = round(magnitude_of(kind, _log_uniform(rng, *span)), 4)
        rel = relative_of(kind, fault["magnitude"])
    return fault, rel


def _kind(rng: np.random.Generator, but: FaultKind | None = None) -> FaultKind:
    kinds = [k for k in KIND_WEIGHTS if k is not but]
    weights = np.array([KIND_WEIGHTS[k] for k in kinds])
    return kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]


def _draw(rng: np.random.Generator, name: str,
          run_seed: int) -> tuple[dict[str, Any], tuple[FaultDraw, ...]]:  # fmt: skip
    """Faults' kinds and times first; then a fleet sized so that the run holds about
    ``gpu_hours`` GPU-hours; then the faults' targets in one of its racks."""
    d = _D
    kinds = [_kind(rng)]
    timings = [_timing(rng, round(rng.uniform(*d["lead_s"])))]
    if rng.random() < d["overlap"]:
        kinds.append(_kind(rng, but=kinds[0]))
        first = timings[0]
        timings.append(_timing(rng, math.floor(rng.uniform(first["onset"], first["end"]))))
    duration = max(t["end"] for t in timings) + d["tail_s"]
    nodes = int(np.clip(round(d["gpu_hours"] * 3600 / duration / 8), *d["nodes"]))
    ambient = K.AMBIENT_HEAT in kinds
    racks = _racks(rng, max(nodes, 2) if ambient else nodes, ambient)
    rack = racks[int(rng.integers(len(racks)))]
    faults = [_fault(rng, k, rack, t) for k, t in zip(kinds, timings, strict=True)]
    duration = _healthy_enough(duration, racks, faults)
    hour = round(rng.uniform(*d["onset_hour"]) * 60) / 60
    workload: dict[str, Any] = {
        "requests_per_second": round(_log_uniform(rng, *d["rps_log"]), 2),
        "diurnal_amplitude": round(rng.uniform(*d["diurnal_amplitude"]), 3),
    }
    if rng.random() < d["training"]:
        job_rack = racks[int(rng.integers(len(racks)))]["name"]
        workload["training"] = [{"name": "train", "racks": [job_rack]}]
    data = {
        "name": name, "description": "drawn by hbmwatch eval --random",
        "duration": float(duration), "seed": run_seed,
        "start": (MIDNIGHT + dt.timedelta(hours=hour)).isoformat(),
        "racks": racks, "workload": workload, "faults": [f for f, _ in faults],
        "noise": round(rng.uniform(*d["noise"]), 3),
    }  # fmt: skip
    draws = tuple(
        FaultDraw(name, f"fault-{i}", f["kind"], rel, f["end"] - f["onset"], f.get("ramp", 0.0),
                  f.get("shape", "linear"), rack["sku"], len(faults) > 1)
        for i, (f, rel) in enumerate(faults)
    )  # fmt: skip
    return data, draws


def _affected(fault: dict[str, Any], racks: list[dict[str, Any]]) -> int:
    """GPUs a fault touches (as ``FaultPlan`` resolves its target)."""
    t = fault["target"]
    if "gpu" in t:
        return 1
    if "host" in t:
        return 8
    if "rack" in t:
        return 8 * next(r["nodes"] for r in racks if r["name"] == t["rack"])
    return 8 * sum(r["nodes"] for r in racks if r.get("cluster", "c0") == t["cluster"])


def _healthy_enough(duration: float, racks: list[dict[str, Any]],
                    faults: list[tuple[dict[str, Any], float | None]]) -> float:  # fmt: skip
    """The run's length, longer where its faults leave under ``gpu_hours`` healthy."""
    gpus = 8 * sum(r["nodes"] for r in racks)
    faulty = sum(_affected(f, racks) * (f["end"] - f["onset"]) for f, _ in faults)
    short = _D["gpu_hours"] * 3600 - (gpus * duration - faulty)
    return duration + max(0.0, math.ceil(short / gpus))


# -- TOML -----------------------------------------------------------------------------------
def scenario_toml(scenario: Scenario) -> str:
    """The scenario as a TOML file that ``load_scenario`` reads back to an equal Scenario."""
    data = scenario.model_dump(mode="json", exclude_defaults=True)
    lines = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, (dict, list))]
    for key, value in data.items():
        if isinstance(value, dict):
            plain = {k: v for k, v in value.items() if not isinstance(v, list)}
            lines += ["", f"[{key}]", *(f"{k} = {_value(v)}" for k, v in plain.items())]
            for sub, items in ((k, v) for k, v in value.items() if isinstance(v, list)):
                for item in items:
                    lines += ["", f"[[{key}.{sub}]]", *_table(item)]
        elif isinstance(value, list):
            for item in value:
                lines += ["", f"[[{key}]]", *_table(item)]
    return "\n".join(lines) + "\n"


def _table(item: dict[str, Any]) -> list[str]:
    return [f"{k} = {_value(v)}" for k, v in item.items()]


def _value(v: Any) -> str:
    """A TOML value: strings, numbers, booleans, arrays and inline tables (JSON spells the
    first four as TOML does; floats keep every digit)."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v)


# -- docs -----------------------------------------------------------------------------------
def distributions_markdown() -> str:
    """docs/simulator.md's tables of the distributions (a test checks the page has them)."""
    rows = ["| draw | value | meaning |", "|---|---|---|"]
    rows += [f"| `{k}` | {_md(v)} | {text} |" for k, (v, text) in DISTRIBUTIONS.items()]
    rows += ["", "| fault kind | weight | relative magnitude | magnitude | stated limit: "
             "relative magnitude, duration |", "|---|---|---|---|---|"]  # fmt: skip
    for kind, weight in KIND_WEIGHTS.items():
        span, (rel, dur) = RELATIVE_MAGNITUDE[kind], DETECTABLE[kind]
        unit = FAULT_SPECS[kind]["unit"]
        mags = "-" if span is None else " .. ".join(f"{magnitude_of(kind, x):g}" for x in span)
        rows.append(
            f"| {kind.value} | {weight:g} | {'-' if span is None else _md(span)} | "
            f"{mags}{'' if span is None else ' ' + unit} | "
            f"{'any' if rel is None else f'>= {rel:g}x'}, >= {dur:g} s |"
        )
    return "\n".join(rows) + "\n"


def _md(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(x, str) for x in value):
        return ", ".join(value)
    if isinstance(value, tuple):
        return f"{value[0]:g} .. {value[1]:g}"
    return f"{value:g}"
