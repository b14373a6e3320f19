"""Data quality: stuck sensors, dropouts, targets down, counter-reset storms, sentinels.

A detector that trusts its input blames a GPU for a broken sensor (a stuck memory
temperature looks like perfect cooling; a missing one hides an excursion), so these are
findings of their own, with cause ``sensor`` or ``target_down``, that the alerting layer can
use to inhibit or qualify the others.  Every check is vectorised over its entities and
tracks durations across frames in its state, so a 120 s condition is seen over frames of a
few seconds.  The GPU sensor checks live in ``detectors/quality_sensors.py``, the target
checks in ``detectors/quality_targets.py``; this module steps them, gates them, counts
counter resets and owns the state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hbmwatch.detectors.base import (
    EntityTable,
    Episode,
    Hysteresis,
    SparseGate,
    latest,
    make_finding,
)
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.quality_explained import explained
from hbmwatch.detectors.quality_sensors import (
    GAPS,
    TEMPS,
    CheckReport,
    SensorChecks,
    gpu_entity,
    sensor_values,
)
from hbmwatch.detectors.quality_targets import TargetChecks
from hbmwatch.records import Evidence, Finding, RankedCause
from hbmwatch.settings import DetectionSettings
from hbmwatch.taxonomy import FindingKind

#: One definition: the setting's default.
FIRST_UP_GRACE_S: float = DetectionSettings.model_fields["target_first_up_grace_seconds"].default
#: Learned again from a sensor's next two samples: not saved with the state.
VOLATILE = ("every_ms_", "omin_", "omax_")


class DataQuality(SensorChecks, TargetChecks):
    """Stuck and missing sensors, targets down, counter-reset storms and sentinel values.

    Why: broken telemetry must be told apart from a healthy or a failing GPU.  Five checks,
    each a ``data_quality`` finding with a ``check`` label in its entity:

    * ``stuck``: a temperature (memory, hotspot, each HBM stack) has not changed at all for
      ``stuck_s`` while the same GPU's power moved by ``power_move_frac`` of its limit or its
      memory bandwidth by ``bw_move`` (an idle, steady GPU may hold a rounded temperature for
      minutes; a loaded one cannot).  Only watched time counts: a value seen again after
      ``gap_s`` without samples (a target down, a dropout) restarts the clock.  One finding per
      sensor.  A sensor whose exporter refreshes every 30 s (up to 60 s) is watched across
      its refreshes: a gap is longer than ``gap_s`` and 1.5x its last interval; with so few
      samples a steady whole degree repeats by chance, so such a sensor must hold over 24
      samples while its partner temperature (memory <-> hotspot, stacks -> hotspot) moved
      by 2 C too.  Cause ``sensor``.
    * ``gap``: signals the GPU reported before have been missing for ``gap_s`` while the
      GPU's other signals still arrive; one finding per GPU, evidence per missing signal (a
      dropped memory sensor takes its HBM stacks with it).  Cause ``sensor``.
    * ``target_down``: a scrape target's ``up`` was 0 on ``min_down_scrapes`` scrapes in a row,
      after it had answered once.  A target that has never answered is "not yet up" (a fleet
      still starting, an exporter still loading), not down, until ``first_up_grace_s`` after
      its first scrape; past that it is down since that first scrape.  Cause ``target_down``.
    * ``counter_resets``: more than ``max_reset_bursts`` cycles with counter resets on a GPU
      within ``reset_window_s`` (one exporter restart resets every counter at once, so a cycle
      counts once).  Cause ``sensor``.
    * ``sentinel``: a target's exporter sent "not supported" sentinels on
      ``sentinel_min_scrapes`` scrapes, each within ``sentinel_quiet_s`` of the last; severity
      info, warning once it has lasted ``sentinel_sustained_s``.  Cause ``sensor``.

    A finding closes when its condition clears (the value changes, the signal or the target
    is back, the window holds no more than the allowed resets, or no sentinel for
    ``sentinel_quiet_s``).

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
    >>> rng = np.random.default_rng(0)
    >>> gpus = Entities()
    >>> gpus.add("c/h/0", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0"})
    0
    >>> f = Frame(0, 1000, 180, gpus, Entities(), Entities(), {}, np.full((1, 8, 180), np.nan),
    ...           {}, {}, {}, {}, {})
    >>> f.gpu["power"] = rng.uniform(250, 700, (1, 180))  # a busy GPU ...
    >>> f.gpu["mem_temp"] = np.full((1, 180), 61.0)  # ... whose memory sensor never moves
    >>> [f"{x.entity['check']} {x.entity['signal']} {x.top_cause}" for x in DataQuality().update(f)]
    ['stuck mem_temp sensor']
    """

    name = "quality"

    def __init__(
        self,
        *,
        stuck_s: float = 120.0,
        power_move_frac: float = 0.1,
        bw_move: float = 0.1,
        gap_s: float = 15.0,
        min_down_scrapes: int = 2,
        first_up_grace_s: float = FIRST_UP_GRACE_S,
        reset_window_s: float = 600.0,
        max_reset_bursts: int = 3,
        sentinel_min_scrapes: int = 3,
        sentinel_quiet_s: float = 60.0,
        sentinel_sustained_s: float = 300.0,
    ) -> None:
        self.stuck_s = stuck_s
        self.power_move_frac = power_move_frac
        self.bw_move = bw_move
        self.gap_s = gap_s
        self.min_down_scrapes = min_down_scrapes
        self.first_up_grace_s = first_up_grace_s
        self.reset_window_s = reset_window_s
        self.max_reset_bursts = max_reset_bursts
        self.sentinel_min_scrapes = sentinel_min_scrapes
        self.sentinel_quiet_s = sentinel_quiet_s
        self.sentinel_sustained_s = sentinel_sustained_s
        self._init_state()

    def _init_state(self) -> None:
        self.stuck_ = EntityTable(
            {"value_": np.nan, "since_ms_": np.nan, "seen_ms_": np.nan, "every_ms_": np.nan,
             "pmin_": np.nan, "pmax_": np.nan, "bmin_": np.nan, "bmax_": np.nan,
             "omin_": np.nan, "omax_": np.nan}
        )  # fmt: skip
        self.seen_ = EntityTable({"last_ms_": np.nan})
        self.gpus_ = EntityTable({"power_scale_": np.nan})
        self.targets_ = EntityTable(
            {"down_run_": 0.0, "down_since_ms_": np.nan, "drops_": 0.0, "dropped_": 0.0,
             "drop_since_ms_": np.nan, "last_drop_ms_": np.nan, "first_ms_": np.nan,
             "ever_up_": 0.0}
        )  # fmt: skip
        #: GPU key -> [[cycle end ms, counter resets in that cycle], ...] within the window.
        self.resets_: dict[str, list[list[int]]] = {}
        # Every score is normalised so 1 is its threshold; durations live in the scores.
        self.open_ = Hysteresis(enter=1.0, exit=1.0, min_on_s=0.0, min_off_s=0.0)
        self._layout: _Layout | None = None  # rows into the tables above: reset with them

    def _check(self) -> None:
        if min(self.stuck_s, self.gap_s, self.reset_window_s, self.sentinel_quiet_s) <= 0:
            raise ValueError("durations must be positive")
        if self.first_up_grace_s < 0:
            raise ValueError("first_up_grace_s must not be negative")
        if self.min_down_scrapes < 1 or self.sentinel_min_scrapes < 1:
            raise ValueError("scrape counts must be at least 1")

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        self._check()
        if frame.steps == 0:
            return []
        findings: list[Finding] = []
        g_keys, t_keys = frame.gpus.keys, frame.targets.keys
        lay = self._layout_for(g_keys, t_keys)
        gates = [SparseGate(self.open_, keys, rows) for keys, rows in lay.gates]
        tables = tuple(zip((self.stuck_, self.seen_, self.targets_), lay.rows, strict=True))
        # Each check works on local copies of its rows, written back before a finding reads them.
        local = [{f: table[f][rows] for f in table.fields} for table, rows in tables]

        def flush() -> None:
            for (table, rows), arrays in zip(tables, local, strict=True):
                for f, values in arrays.items():
                    table[f][rows] = values

        prow = lay.prow
        temps, gaps = sensor_values(frame, TEMPS), sensor_values(frame, GAPS)
        power, bw = frame.g("power"), frame.g("bw")
        scale = np.fmax(
            self.gpus_["power_scale_"][prow],
            np.fmax(_rowmax(frame.g("power_limit")), _rowmax(power)),
        )
        self.gpus_["power_scale_"][prow] = scale
        scale = np.repeat(scale, len(TEMPS))
        up, sentinel = frame.t("up"), frame.t("sentinel")
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            scores = []
            if len(g_keys):
                scores.append(self._stuck_step(local[0], temps[:, :, i], power[:, i], bw[:, i],
                                               scale, t_ms))  # fmt: skip
                scores.append(self._gap_step(local[1], gaps[:, :, i], t_ms))
            else:
                scores += [np.zeros(0), np.zeros(0)]
            if len(t_keys):
                scores += self._target_step(local[2], up[:, i], sentinel[:, i], t_ms)
            else:
                scores += [np.zeros(0), np.zeros(0)]
            for gate, score in zip(gates, scores, strict=True):
                findings += self._step(frame, gate, score, t_ms, flush)
        flush()
        end_ms = int(frame.times_ms[-1])
        findings += self._resets(frame, end_ms)
        findings += [
            self._finding(frame, key, end_ms)
            for key in self.open_.episodes
            if self._present(frame, key)
        ]
        return latest(findings)

    def _layout_for(self, g_keys: list[str], t_keys: list[str]) -> _Layout:
        """Keys and rows for these GPUs and targets, kept while they stay the same: making
        and looking up 25,000 keys took a third of the update on a 1,024-GPU fleet."""
        lay = self._layout
        if lay is None or lay.g_keys != g_keys or lay.t_keys != t_keys:
            lay = self._layout = _Layout.of(self, list(g_keys), list(t_keys))
        return lay

    def _resets(self, frame: Frame, end_ms: int) -> list[Finding]:
        """Counter resets come per cycle: each cycle with any is one burst."""
        for gkey, n in frame.resets.items():
            if n > 0:
                self.resets_.setdefault(gkey, []).append([end_ms, int(n)])
        horizon = end_ms - self.reset_window_s * 1000
        self.resets_ = {
            g: kept for g, ev in self.resets_.items() if (kept := [e for e in ev if e[0] > horizon])
        }
        open_keys = [k for k in self.open_.episodes if k.startswith("counter_resets|")]
        keys = list(dict.fromkeys([f"counter_resets|{g}|" for g in self.resets_] + open_keys))
        if not keys:
            return []
        bursts = np.array([len(self.resets_.get(k.split("|")[1], [])) for k in keys], float)
        gate = SparseGate(self.open_, keys)
        return self._step(frame, gate, bursts / (self.max_reset_bursts + 1), end_ms, lambda: None)

    # -- findings ---------------------------------------------------------------------------
    def _step(
        self,
        frame: Frame,
        gate: SparseGate,
        score: np.ndarray,
        t_ms: int,
        flush: Callable[[], None],
    ) -> list[Finding]:
        opened, closed = gate.step(score, t_ms)
        if not (opened or closed):
            return []
        flush()
        out = []
        for key in opened:
            self.open_.episodes[key] = Episode(started_ms=self._started(key, t_ms), raised_ms=t_ms)
            out.append(self._finding(frame, key, t_ms))
        for key in closed:
            out.append(self._finding(frame, key, t_ms, end=t_ms))
            self.open_.episodes.pop(key, None)
        return out

    def _started(self, key: str, t_ms: int) -> int:
        """When the condition began (not when it crossed its threshold)."""
        check, ekey, sub = key.split("|")
        if check == "stuck":
            since = self.stuck_["since_ms_"][self.stuck_.index[f"{ekey}|{sub}"]]
        elif check == "gap":
            since = min((last for _, last in self._missing(ekey, t_ms)), default=np.nan)
        elif check == "target_down":
            since = self.targets_["down_since_ms_"][self.targets_.index[ekey]]
        elif check == "sentinel":
            since = self.targets_["drop_since_ms_"][self.targets_.index[ekey]]
        else:
            since = min((e[0] for e in self.resets_.get(ekey, [])), default=t_ms)
        return int(since) if not np.isnan(since) else t_ms

    @staticmethod
    def _present(frame: Frame, key: str) -> bool:
        check, ekey, _ = key.split("|")
        if check in ("target_down", "sentinel"):
            return ekey in frame.targets.index
        return check == "counter_resets" or ekey in frame.gpus.index

    def _finding(self, frame: Frame, key: str, t_ms: int, end: int | None = None) -> Finding:
        check, ekey, sub = key.split("|")
        ep = self.open_.episodes.get(key) or Episode(t_ms, t_ms)
        if check == "stuck":
            report = self._stuck_report(frame, ekey, sub, ep, t_ms, end)
        elif check == "gap":
            report = self._gap_report(frame, ekey, ep, t_ms, end)
        elif check == "target_down":
            report = self._target_down_report(frame, ekey, ep, t_ms)
        elif check == "sentinel":
            report = self._sentinel_report(frame, ekey, ep, t_ms)
        else:
            report = self._resets_report(frame, ekey, t_ms)
        entity = report.entity
        entity["check"] = check
        report = explained(report, check, frame.open_findings, ep.extra)
        return make_finding(
            kind=FindingKind.DATA_QUALITY, detector=self.name, entity=entity,
            severity=report.severity, summary=report.summary, started_ms=ep.started_ms,
            raised_ms=ep.raised_ms, updated_ms=t_ms, ended_ms=end, evidence=report.evidence,
            causes=[RankedCause(report.cause, 0.9, summary=report.summary)],
        )  # fmt: skip

    def _resets_report(self, frame: Frame, ekey: str, t_ms: int) -> CheckReport:
        events = self.resets_.get(ekey, [])
        total = sum(e[1] for e in events)
        window_start = int(t_ms - self.reset_window_s * 1000)
        evidence = [
            Evidence(f"counter resets on {ekey}", "cycles_with_counter_resets",
                     float(len(events)), float(self.max_reset_bursts), window_start, t_ms,
                     note=f"{total} counter series reset"),
        ]  # fmt: skip
        summary = (
            f"{len(events)} cycles with counter resets in {self.reset_window_s:.0f} s "
            f"({total} series): exporter or driver restarts"
        )
        return CheckReport(evidence, summary, gpu_entity(frame, ekey))

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "stuck": _without(self.stuck_.state_dict(), VOLATILE),
            "seen": self.seen_.state_dict(),
            "gpus": self.gpus_.state_dict(),
            "targets": self.targets_.state_dict(),
            "resets": {g: [list(e) for e in ev] for g, ev in self.resets_.items()},
            "open": self.open_.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.stuck_.load_state_dict(state.get("stuck", {}))
        self.seen_.load_state_dict(state.get("seen", {}))
        self.gpus_.load_state_dict(state.get("gpus", {}))
        self.targets_.load_state_dict(state.get("targets", {}))
        self.resets_ = {
            g: [[int(a), int(b)] for a, b in ev] for g, ev in state.get("resets", {}).items()
        }
        self.open_.load_state_dict(state.get("open", {}))


@dataclass
class _Layout:
    """The keys of a fleet's checks and their rows in the state tables."""

    g_keys: list[str]
    t_keys: list[str]
    gates: list[tuple[list[str], np.ndarray]]  # stuck, gap, target_down, sentinel
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]  # stuck_, seen_, targets_
    prow: np.ndarray  # gpus_

    @classmethod
    def of(cls, det: DataQuality, g_keys: list[str], t_keys: list[str]) -> _Layout:
        gate_keys = [
            [f"stuck|{g}|{s}" for g in g_keys for s in TEMPS],
            [f"gap|{g}|" for g in g_keys],
            *([f"{c}|{t}|" for t in t_keys] for c in ("target_down", "sentinel")),
        ]
        return cls(
            g_keys, t_keys,
            [(keys, det.open_.table.rows(keys)) for keys in gate_keys],
            (det.stuck_.rows([f"{g}|{s}" for g in g_keys for s in TEMPS]),
             det.seen_.rows([f"{g}|{s}" for g in g_keys for s in GAPS]),
             det.targets_.rows(t_keys)),
            det.gpus_.rows(g_keys),
        )  # fmt: skip


def _without(state: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A table's state less fields that are relearned in a few samples (and so not saved:
    state saved before they existed loads and saves back the same)."""
    arrays = {k: v for k, v in state["arrays"].items() if k not in fields}
    return {**state, "arrays": arrays}


def _rowmax(a: np.ndarray) -> np.ndarray:
    out = np.full(a.shape[0], np.nan)
    has = ~np.isnan(a).all(axis=1)
    out[has] = np.nanmax(a[has], axis=1)
    return out
