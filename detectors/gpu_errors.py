"""GPU errors: fatal and reset-needing XID/AFID codes, benign storms, failed remaps, health.

A GPU that fell off the bus (XID 79) or lost a row remap (XID 64) slows or kills every
workload on it without heating anything, so it must be a finding of its own that pages and
that root cause can name.  The exporters say so in three ways, each a frame signal
(``detectors/signals.py``): error events by the action their code asks for
(``hbmwatch/gpu_errors.py``: ``err_fatal``, ``err_reset``, ``err_benign``, the code itself in
``frame.gpu_errors``), ``gpu_row_remap_failed`` (``remap_failed``) and the exporter's own
health verdict (``health``: the worst check, 0 pass, 1 warn, 2 fail).  The words a finding
uses are in ``detectors/gpu_error_words.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.gpu_error_words import Condition, entity_of, finding
from hbmwatch.gpu_errors import Action, lookup
from hbmwatch.records import Finding

#: Per GPU: when each class of event last came, the last remap and health verdicts, and
#: since when health has read pass after the last fatal event (NaN: not so).
FIELDS = {
    "fatal_ms_": np.nan, "reset_ms_": np.nan, "benign_ms_": np.nan,
    "remap_failed_": np.nan, "health_": np.nan, "ok_since_ms_": np.nan, "seen_ms_": np.nan,
}  # fmt: skip
#: A GPU's own gauges: while none arrives after a fatal code, the GPU is still off the bus.
ALIVE_SIGNALS = ("power", "hot_temp", "mem_temp")
CLASSES = (("fatal", "err_fatal"), ("reset", "err_reset"), ("benign", "err_benign"))


class GpuErrors:
    """A ``gpu_errors`` finding per GPU while it reports a fatal or reset-needing error code,
    a failed row remap, a failed health verdict, or a storm of benign codes.

    * **critical**: a ``fatal`` code (held ``fatal_hold_s`` after its last event, since a GPU
      off the bus reports nothing more, and beyond that for as long as the GPU, once seen,
      has sent none of its own gauges for ``silent_s``; closed early once health has read
      pass for ``recover_s`` after it), a ``needs_reset`` code (held ``hold_s`` after its
      last event), a failed row remap or a health verdict of fail (each while it reads so);
    * **warning**: ``storm_events`` or more ``benign`` (or unknown) events within
      ``storm_window_s`` (default 10 in 5 min); held until none came for ``hold_s``.  One
      crash-looping pod gives about 5 application XIDs in its first 5 minutes under
      Kubernetes' restart back-off (10 s doubling) and one every 5 min after: twice that is
      more than one bad job, and worth a look at the GPU.

    Every cycle costs a few array passes over the fleet; only GPUs with an event, a verdict
    or an open finding are visited one by one.

    >>> from hbmwatch.detectors.frame import Entities
    >>> gpus = Entities()
    >>> gpus.add("c/n1/3", {"cluster": "c", "rack": "r0", "host": "n1", "gpu": "3"})
    0
    >>> f = Frame(0, 1000, 10, gpus, Entities(), Entities(), {}, np.zeros((1, 8, 10)),
    ...           {}, {}, {}, {}, {})
    >>> f.gpu["err_fatal"] = np.array([[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]], dtype=float)
    >>> f.gpu_errors = {"c/n1/3": {"xid:79": 1.0}}
    >>> [(x.severity.value, x.summary) for x in GpuErrors().update(f)]
    [('critical', 'XID 79 on n1 GPU 3: GPU has fallen off the bus (fatal)')]
    """

    name = "gpu_errors"

    def __init__(
        self,
        *,
        storm_events: int = 10,
        storm_window_s: float = 300.0,
        hold_s: float = 600.0,
        fatal_hold_s: float = 1800.0,
        recover_s: float = 300.0,
        silent_s: float = 60.0,
    ) -> None:
        self.storm_events = storm_events
        self.storm_window_s = storm_window_s
        self.hold_s = hold_s
        self.fatal_hold_s = fatal_hold_s
        self.recover_s = recover_s
        self.silent_s = silent_s
        self._init_state()

    def _init_state(self) -> None:
        self.gpus_ = EntityTable(FIELDS)
        #: GPU key -> [[step ms, benign events], ...] within the storm window.
        self.benign_: dict[str, list[list[float]]] = {}
        #: GPU key -> code (``xid:79``) -> events, of the GPUs with an open finding or a code
        #: seen within the longest hold (the words name the code).
        self.codes_: dict[str, dict[str, float]] = {}
        self.last_code_: dict[str, dict[str, str]] = {}  # GPU key -> class -> last code
        self.open_: dict[str, Episode] = {}

    def _check(self) -> None:
        if self.storm_events < 1:
            raise ValueError("storm_events must be at least 1")
        if min(self.storm_window_s, self.hold_s, self.fatal_hold_s, self.recover_s,
               self.silent_s) <= 0:  # fmt: skip
            raise ValueError("durations must be positive")

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        self._check()
        if frame.steps == 0 or len(frame.gpus) == 0:
            return []
        keys = frame.gpus.keys
        rows = self.gpus_.rows(keys)
        times = frame.times_ms.astype(float)
        self._seen(frame, rows, times)
        busy = self._events(frame, rows, times)
        busy |= self._verdicts(frame, rows, times)
        self._learn_codes(frame)
        t_ms = int(times[-1])
        visit = {keys[i] for i in np.flatnonzero(busy)} | set(self.open_)
        out = [f for key in sorted(visit) if (f := self._decide(frame, key, t_ms)) is not None]
        self._forget(t_ms)
        return out

    def _seen(self, frame: Frame, rows: np.ndarray, times: np.ndarray) -> None:
        """When each GPU last sent one of its own gauges (a GPU off the bus sends none)."""
        for signal in ALIVE_SIGNALS:
            if signal in frame.gpu:
                got = ~np.isnan(frame.gpu[signal])
                last = np.where(got, times, -np.inf).max(axis=1)
                has = got.any(axis=1)
                col = self.gpus_["seen_ms_"]
                col[rows[has]] = np.fmax(col[rows[has]], last[has])

    def _events(self, frame: Frame, rows: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Last event time per class; benign events into the storm window. Busy GPUs."""
        busy = np.zeros(len(rows), bool)
        for name, signal in CLASSES:
            if signal not in frame.gpu:
                continue
            x = frame.gpu[signal]
            hit = np.nan_to_num(x) > 0
            has = hit.any(axis=1)
            if not has.any():
                continue
            busy |= has
            last = np.where(hit, times, -np.inf).max(axis=1)
            col = self.gpus_[f"{name}_ms_"]
            col[rows[has]] = np.fmax(col[rows[has]], last[has])
            if name == "fatal":  # health must read pass again after the event
                self.gpus_["ok_since_ms_"][rows[has]] = np.nan
            if name == "benign":
                for i in np.flatnonzero(has).tolist():
                    at = np.flatnonzero(hit[i])
                    self.benign_.setdefault(frame.gpus.keys[i], []).extend(
                        [float(times[j]), float(x[i, j])] for j in at.tolist()
                    )
        return busy

    def _verdicts(self, frame: Frame, rows: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Remap failure and health: the last known value per GPU, and since when health has
        read pass (a run of pass samples that started after the last fatal event)."""
        busy = np.zeros(len(rows), bool)
        if "remap_failed" in frame.gpu:
            last = _last_known(frame.gpu["remap_failed"])
            known = ~np.isnan(last)
            self.gpus_["remap_failed_"][rows[known]] = last[known]
            busy |= known & (last >= 1)
        if "health" in frame.gpu:
            h = frame.gpu["health"]
            last = _last_known(h)
            known = ~np.isnan(last)
            self.gpus_["health_"][rows[known]] = last[known]
            busy |= known & (last >= 2)
            ok = self.gpus_["ok_since_ms_"][rows]
            fatal = self.gpus_["fatal_ms_"][rows]
            for j in range(h.shape[1]):
                v = h[:, j]
                after = np.isnan(fatal) | (times[j] > fatal)
                ok = np.where(np.isnan(v), ok, np.where((v == 0) & after, np.fmin(ok, times[j]),
                                                        np.nan))  # fmt: skip
            self.gpus_["ok_since_ms_"][rows] = ok
        return busy

    def _learn_codes(self, frame: Frame) -> None:
        for gkey, codes in frame.gpu_errors.items():
            mine = self.codes_.setdefault(gkey, {})
            last = self.last_code_.setdefault(gkey, {})
            for code, n in codes.items():
                mine[code] = mine.get(code, 0.0) + float(n)
                last[_class_of(code)] = code

    # -- deciding ---------------------------------------------------------------------------
    def condition(self, key: str, t_ms: int) -> Condition:
        """What holds on a GPU now, from its state."""
        row = self.gpus_.index[key]
        g = {f: float(self.gpus_[f][row]) for f in FIELDS}
        silent = t_ms - g["seen_ms_"] >= self.silent_s * 1000  # NaN (never seen): False
        fatal = not np.isnan(g["fatal_ms_"]) and (
            t_ms - g["fatal_ms_"] < self.fatal_hold_s * 1e3 or silent
        )
        if fatal and t_ms - g["ok_since_ms_"] >= self.recover_s * 1000:  # NaN compares false
            fatal = False
        reset = not np.isnan(g["reset_ms_"]) and t_ms - g["reset_ms_"] < self.hold_s * 1000
        since = t_ms - self.storm_window_s * 1000
        recent = sum(n for at, n in self.benign_.get(key, []) if at > since)
        was_storm = bool(self.open_.get(key) and self.open_[key].extra.get("storm"))
        quiet = np.isnan(g["benign_ms_"]) or t_ms - g["benign_ms_"] >= self.hold_s * 1000
        storm = recent >= self.storm_events or (was_storm and not quiet)
        return Condition(
            fatal=fatal, reset=reset, storm=storm, storm_events=recent,
            remap_failed=g["remap_failed_"] >= 1, health_failed=g["health_"] >= 2,
            health=g["health_"], codes=dict(self.codes_.get(key, {})),
            last_code=dict(self.last_code_.get(key, {})),
        )  # fmt: skip

    def _decide(self, frame: Frame, key: str, t_ms: int) -> Finding | None:
        cond = self.condition(key, t_ms)
        ep = self.open_.get(key)
        if ep is None:
            if not cond.active:
                return None
            started = self._onset(key, cond, t_ms)
            ep = self.open_[key] = Episode(started_ms=started, raised_ms=t_ms)
            ep.extra["entity"] = entity_of(frame, key)
        elif key in frame.gpus.index:
            ep.extra["entity"] = entity_of(frame, key)
        ep.extra["storm"] = cond.storm
        ep.peak = max(ep.peak, cond.storm_events)
        cond = dataclasses.replace(cond, storm_events=ep.peak)  # a storm is told by its peak
        if cond.active:
            return finding(self, frame, key, ep, cond, t_ms)
        self.open_.pop(key)
        self.codes_.pop(key, None)  # the next episode names its own codes
        return finding(self, frame, key, ep, cond, t_ms, end=t_ms)

    def _onset(self, key: str, cond: Condition, t_ms: int) -> int:
        """When the condition began: its first event within the windows, else now."""
        row = self.gpus_.index[key]
        times = [self.gpus_[f][row] for f, on in (("fatal_ms_", cond.fatal),
                                                  ("reset_ms_", cond.reset)) if on]  # fmt: skip
        if cond.storm:
            since = t_ms - self.storm_window_s * 1000
            times += [at for at, _ in self.benign_.get(key, []) if at > since][:1]
        return int(min(times)) if times else t_ms

    def _forget(self, t_ms: int) -> None:
        since = t_ms - self.storm_window_s * 1000
        self.benign_ = {
            g: kept for g, ev in self.benign_.items() if (kept := [e for e in ev if e[0] > since])
        }
        horizon = t_ms - max(self.fatal_hold_s, self.hold_s) * 1000
        for gkey in [g for g in self.codes_ if g not in self.open_]:
            row = self.gpus_.index.get(gkey)
            times = [] if row is None else [
                float(self.gpus_[f][row]) for f in ("fatal_ms_", "reset_ms_", "benign_ms_")
            ]  # fmt: skip
            if max((t for t in times if not np.isnan(t)), default=-np.inf) < horizon:
                self.codes_.pop(gkey)
                self.last_code_.pop(gkey, None)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus_.state_dict(),
            "benign": {g: [list(e) for e in ev] for g, ev in self.benign_.items()},
            "codes": {g: dict(c) for g, c in self.codes_.items()},
            "last_code": {g: dict(c) for g, c in self.last_code_.items()},
            "open": {
                k: {"started_ms": e.started_ms, "raised_ms": e.raised_ms, "peak": e.peak,
                    "extra": e.extra}
                for k, e in self.open_.items()
            },
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.gpus_.load_state_dict(state.get("gpus", {}))
        self.benign_ = {
            g: [[float(a), float(b)] for a, b in ev] for g, ev in state.get("benign", {}).items()
        }
        self.codes_ = {
            g: {str(k): float(v) for k, v in c.items()} for g, c in state.get("codes", {}).items()
        }
        self.last_code_ = {g: dict(c) for g, c in state.get("last_code", {}).items()}
        self.open_ = {
            k: Episode(int(e["started_ms"]), int(e["raised_ms"]), float(e["peak"]),
                       dict(e.get("extra", {})))
            for k, e in state.get("open", {}).items()
        }  # fmt: skip


def _class_of(code: str) -> str:
    scheme, _, number = code.partition(":")
    action = lookup(scheme, number).action if number.isdigit() else Action.UNKNOWN
    return {Action.FATAL: "fatal", Action.NEEDS_RESET: "reset"}.get(action, "benign")


def _last_known(x: np.ndarray) -> np.ndarray:
    """Each row's last non-NaN value (NaN where a row has none)."""
    known = ~np.isnan(x)
    idx = np.where(known, np.arange(x.shape[1]), -1).max(axis=1)
    out = x[np.arange(x.shape[0]), np.maximum(idx, 0)]
    return np.where(idx >= 0, out, np.nan)
