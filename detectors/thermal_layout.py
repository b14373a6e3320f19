"""The thermal detector's fleet layout and per-frame inputs: sensors, limits, peers, drivers.

Why a module of its own: what the step loop of ``detectors/thermal.py`` reads (state rows
per GPU and sensor, peer groups, racks, SKU limits, each sensor's gap to its peers and the
load that drives it) is worked out once per fleet or once per frame, as whole arrays,
apart from the learning and scoring that runs step by step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hbmwatch.detectors.base import nanmedian
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import group_median_columns, group_padded
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.skus import Sku, lookup

if TYPE_CHECKING:
    from hbmwatch.detectors.thermal import ThermalExcursions

SENSORS = ("memory", "hotspot", *(f"stack{i}" for i in range(MAX_STACKS)))
N_SENSORS = len(SENSORS)
DEFAULT_LIMITS = (95.0, 89.0)  # memory, hotspot: the strictest SKU's when one is unknown
#: What a load the GPU was never seen at explains, until its own slope is learned: on the
#: real H200 capture (docs/detection.md) memory warmed 20 C at 0.88 of its bandwidth and the
#: hotspot 24 C at +0.75 of its power limit; the priors sit a little under both.
MEMORY_C_PER_BANDWIDTH = 20.0
HOTSPOT_C_PER_POWER = 30.0
UNSEEN_LOAD = 0.2  # a load this far over its baseline (bandwidth or power share) is "new"
#: The peers' load line leans on the prior slope until their loads spread this far (an
#: RMS, bandwidth or power share): a rack all at one load says nothing of the slope.
PEER_LOAD_SPREAD = 0.05

#: Which driver loads each sensor: bandwidth (0) for memory and stacks, power (1) for hotspot.
SENSOR_DRIVER = np.array([0, 1] + [0] * MAX_STACKS)
#: Each sensor's prior slope on its driver, C per unit (bandwidth or relative power).
PRIOR_SLOPE = np.array(
    [MEMORY_C_PER_BANDWIDTH, HOTSPOT_C_PER_POWER] + [MEMORY_C_PER_BANDWIDTH] * MAX_STACKS
)


@dataclass
class FleetLayout:
    """What the frames of an unchanged fleet share: state rows, peers, racks and limits.

    Built when the frame's GPUs or their labels change and kept otherwise (the builder
    hands the same fleet every cycle), which saves making and looking up 10,000 sensor
    keys and a Python pass over the GPUs' labels every step.
    """

    keys: list[str]
    labels: list[dict[str, str]]
    rows: np.ndarray  # temps_ rows, one per GPU and sensor
    srows: np.ndarray  # sensors_ rows, the same keys
    drows: np.ndarray  # drivers_ rows, bandwidth and power per GPU
    lrows: np.ndarray  # lag_ rows, the same keys
    frows: np.ndarray  # rate_ rows, one per GPU
    groups: np.ndarray  # peer group (cluster, rack, SKU) per GPU
    limits: np.ndarray  # (G, S): slowdown limit per sensor
    board: np.ndarray  # (G,): board power, the power scale when no limit is reported
    rack_keys: list[str]  # in order of first appearance, as racks step
    rack_rows: np.ndarray  # racks_ rows
    racks: dict[str, list[int]]  # rack key -> its GPUs' rows
    buckets: list[tuple[np.ndarray, np.ndarray]]  # racks of one size: (racks, (R, k) rows)

    @classmethod
    def of(cls, det: ThermalExcursions, frame: Frame) -> FleetLayout:
        keys, labels = list(frame.gpus.keys), [dict(lab) for lab in frame.gpus.labels]
        sensor_keys = [f"{g}#{s}" for g in keys for s in SENSORS]
        driver_keys = [f"{g}#{d}" for g in keys for d in ("bw", "pw")]
        racks: dict[str, list[int]] = {}
        for row, lab in enumerate(labels):
            racks.setdefault(f"{lab.get('cluster', '')}/{lab.get('rack', '')}", []).append(row)
        by_size: dict[int, list[int]] = {}
        for j, members in enumerate(racks.values()):
            by_size.setdefault(len(members), []).append(j)
        members = list(racks.values())
        skus = {lab.get("sku", "") for lab in labels}
        found = {sku: lookup(sku) if sku else None for sku in skus}
        return cls(
            keys=keys, labels=labels,
            rows=det.temps_.rows(sensor_keys), srows=det.sensors_.rows(sensor_keys),
            drows=det.drivers_.rows(driver_keys), lrows=det.lag_.rows(driver_keys),
            frows=det.rate_.rows(keys), groups=peer_groups(labels),
            limits=sensor_limits([found[lab.get("sku", "")] for lab in labels]),
            board=np.array([board_power(found[lab.get("sku", "")]) for lab in labels]),
            rack_keys=list(racks), rack_rows=det.racks_.rows(list(racks)), racks=racks,
            buckets=[(np.array(js), np.array([members[j] for j in js])) for js in by_size.values()],
        )  # fmt: skip

    def rack_means(self, gpu_rise: np.ndarray, min_gpus: int) -> tuple[np.ndarray, np.ndarray]:
        """Per rack the mean rise of its reporting GPUs and the fraction rising over 0.5 C;
        NaN for a rack with fewer than ``min_gpus`` reporting.

        Racks of one size are averaged as one matrix, row by row, which sums in the same
        order as averaging each rack on its own; a rack missing a GPU is done on its own.
        """
        mean = np.full(len(self.rack_keys), np.nan)
        frac = np.full(len(self.rack_keys), np.nan)
        for racks, members in self.buckets:
            r = gpu_rise[members]
            full = ~np.isnan(r).any(axis=1)
            if members.shape[1] >= min_gpus and full.any():
                mean[racks[full]] = r[full].mean(axis=1)
                frac[racks[full]] = (r[full] > 0.5).mean(axis=1)
            for j in np.flatnonzero(~full).tolist():
                part = r[j][~np.isnan(r[j])]
                if len(part) >= min_gpus:
                    mean[racks[j]], frac[racks[j]] = part.mean(), (part > 0.5).mean()
        return mean, frac


@dataclass
class FrameInputs:
    """A frame's inputs, time-major, so each step reads contiguous rows.

    Per-sensor inputs hold only the sensors with a value somewhere in the frame
    (``live``, indices into GPU x sensor): a GPU without HBM stack sensors has 8 of 10.
    """

    live: np.ndarray  # (L,) live sensors, index GPU * S + sensor
    gpu_of: np.ndarray  # (L,) each live sensor's GPU row
    load_at: np.ndarray  # (L,) its driver in the (G * 2) driver deviations
    x: np.ndarray  # (T, L) temperatures
    gaps: np.ndarray  # (T, L) gap to peers (memory, hotspot) or sibling stacks
    load_gaps: np.ndarray  # (T, L) gap to what same-SKU peers run at at its load
    load_abs: np.ndarray  # (T, L) its driver's load (bandwidth or relative power)
    limit_part: np.ndarray  # (T, G, S) closeness to the slowdown limit, 1 = within margin
    drivers: np.ndarray  # (T, G * 2) bandwidth and relative power

    @classmethod
    def of(cls, frame: Frame, lay: FleetLayout, x: np.ndarray, margin: float) -> FrameInputs:
        steps = frame.steps
        live = np.flatnonzero(~np.isnan(x).all(axis=2))
        gpu_of, sensor = np.divmod(live, N_SENSORS)
        xt = np.ascontiguousarray(x.transpose(2, 0, 1))
        with np.errstate(invalid="ignore"):
            limit_part = (xt - (lay.limits - margin)) / margin + 1.0
        gaps = peer_gaps(x, lay.groups).transpose(2, 0, 1).reshape(steps, -1)[:, live]
        by_load = sensor_drivers(frame, lay.board)
        # A stack is measured by its GPU's memory against peers at load, where it reads.
        load_gaps = peer_load_gaps(x, by_load, lay.groups)[:, SENSOR_DRIVER]
        load_gaps = np.where(np.isnan(x), np.nan, load_gaps)
        drivers = np.ascontiguousarray(by_load.transpose(2, 0, 1)).reshape(steps, -1)
        load_at = gpu_of * 2 + SENSOR_DRIVER[sensor]
        return cls(live, gpu_of, load_at,
                   xt.reshape(steps, -1)[:, live], np.ascontiguousarray(gaps),
                   np.ascontiguousarray(
                       load_gaps.transpose(2, 0, 1).reshape(steps, -1)[:, live]),
                   np.ascontiguousarray(drivers[:, load_at]), limit_part,
                   drivers)  # fmt: skip


class LocalRows:
    """Copies of the state rows the step loop learns, written back by ``store``.

    Gathering and scattering 10,000 rows of six fields every step cost more than the
    arithmetic; the copies are stored before any finding reads the tables and at the end.
    """

    def __init__(self, det: ThermalExcursions, lay: FleetLayout, live: np.ndarray) -> None:
        self.det, self.lay = det, lay
        self.rows, self.srows = lay.rows[live], lay.srows[live]  # live sensors only
        self.temps = det.temps_.local(self.rows)
        self.drivers = det.drivers_.local(lay.drows)
        self.rate = det.rate_.local(lay.frows)
        self.sensors = {name: det.sensors_[name][self.srows] for name in det.sensors_.fields}
        self.lag = det.lag_["load_"][lay.lrows]

    def store(self) -> None:
        det, lay = self.det, self.lay
        det.temps_.store(self.rows, self.temps)
        det.drivers_.store(lay.drows, self.drivers)
        det.rate_.store(lay.frows, self.rate)
        for name, values in self.sensors.items():
            det.sensors_[name][self.srows] = values
        det.lag_["load_"][lay.lrows] = self.lag


class Trace(NamedTuple):
    """What findings quote, (G, S, T) each: temperatures, rises, excesses; and limits."""

    x: np.ndarray
    rise: np.ndarray
    excess: np.ndarray
    limits: np.ndarray


def sensor_limits(skus: list[Sku | None]) -> np.ndarray:
    """(G, S): each sensor's slowdown limit; the stacks share the memory limit."""
    out = np.empty((len(skus), N_SENSORS))
    for row, sku in enumerate(skus):
        mem, hot = (sku.memory_slowdown_c, sku.hotspot_slowdown_c) if sku else DEFAULT_LIMITS
        out[row] = mem
        out[row, 1] = hot
    return out


def peer_groups(labels: list[dict[str, str]]) -> np.ndarray:
    names = [
        f"{lab.get('cluster', '')}/{lab.get('rack', '')}/{lab.get('sku', '')}" for lab in labels
    ]
    _, groups = np.unique(np.array(names), return_inverse=True)
    return groups


def peer_gaps(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(G, S, T): memory and hotspot against the peers' median, stacks against the
    sibling stacks' median; NaN with fewer than three to compare with.  Every step at once:
    the medians are per step, as one step at a time would take them."""
    out = np.full(x.shape, np.nan)
    for col in (0, 1):
        med, count = group_median_columns(x[:, col], groups)
        out[:, col] = np.where(count >= 3, x[:, col] - med, np.nan)
    stacks = x[:, 2:]
    sib = nanmedian(stacks, axis=1)
    have = (~np.isnan(stacks)).sum(axis=1) >= 3
    out[:, 2:] = np.where(have[:, None], stacks - sib[:, None], np.nan)
    return out


def peer_load_gaps(x: np.ndarray, drivers: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(G, 2, T): memory and hotspot over what their peers run at at the GPU's own load.

    Per peer group and step a line through the peers' (load, temperature), fitted twice
    (the second time without peers over 3 MADs off it, so a hot GPU does not pull the line
    it is judged by) with the slope shrunk to the prior where loads hardly spread; NaN with
    fewer than three peers.  An idle GPU that gets a pod is measured against the busy GPUs
    beside it, not against the idle temperature its own baseline knows.
    """
    out = np.full((x.shape[0], 2, x.shape[2]), np.nan)
    for col in (0, 1):
        y, _ = group_padded(x[:, col], groups)
        load, inverse = group_padded(drivers[:, col], groups)
        keep = ~np.isnan(y) & ~np.isnan(load)
        count = keep.sum(axis=1)
        resid = _line_residual(y, load, keep, PRIOR_SLOPE[col])
        with np.errstate(all="ignore"):
            mad = 1.4826 * nanmedian(np.where(keep, np.abs(resid), np.nan), axis=1)
        keep &= np.abs(np.nan_to_num(resid)) <= np.fmax(3.0 * mad, 2.0)[:, None]
        resid = _line_residual(y, load, keep, PRIOR_SLOPE[col])
        out[:, col] = np.where(count[:, None] >= 3, resid, np.nan)[inverse, _position(inverse)]
    return out


def _line_residual(y: np.ndarray, load: np.ndarray, keep: np.ndarray, prior: float) -> np.ndarray:
    """``y`` less the line through the kept (groups, members, T) points, slope shrunk to
    ``prior`` by ``PEER_LOAD_SPREAD``."""
    n = np.fmax(keep.sum(axis=1), 1)
    my = np.where(keep, y, 0.0).sum(axis=1) / n
    ml = np.where(keep, load, 0.0).sum(axis=1) / n
    dl = np.where(keep, load - ml[:, None], 0.0)
    sxy = (dl * np.where(keep, y - my[:, None], 0.0)).sum(axis=1)
    shrink = n * PEER_LOAD_SPREAD**2
    slope = (dl * dl).sum(axis=1) + shrink
    slope = (sxy + shrink * prior) / slope
    return y - (my[:, None] + slope[:, None] * (load - ml[:, None]))  # type: ignore[no-any-return]


def _position(inverse: np.ndarray) -> np.ndarray:
    """Each entity's place within its group in ``group_padded``'s layout."""
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    pos = np.empty(len(inverse), dtype=np.int64)
    pos[order] = np.arange(len(order)) - np.repeat(starts, sizes)
    return pos


def sensor_drivers(frame: Frame, board: np.ndarray) -> np.ndarray:
    """What loads each sensor: memory bandwidth (memory, stacks) and relative power (hotspot).

    Power is relative to the GPU's power limit, else its SKU's board power, else 1 kW:
    never to anything seen later in the frame, so a step's score does not look ahead.
    """
    power = frame.g("power")
    limit = frame.g("power_limit")
    scale = np.where(np.isnan(limit), board[:, None], limit)
    rel = power / np.fmax(scale, 1.0)
    return np.stack([frame.g("bw"), rel], axis=1)


def board_power(sku: Sku | None) -> float:
    return float(sku.board_power_watts) if sku else 1000.0
