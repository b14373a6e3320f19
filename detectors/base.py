"""The detector contract, and the per-entity state every detector keeps.

Two layers, one sign (higher is more anomalous, everywhere):

* **Scorers** (``detectors/scorers.py``) are river-style streaming models, vectorised over
  a fleet: ``learn_one(x)`` and ``score_one(x)`` take one time step for every entity at
  once (an array), because a Python call per GPU per second does not fit a 1,024-GPU cycle
  in a second.  Batch scorers follow scikit-learn (``fit(X)`` / ``score_samples(X)``).
  During warm-up a scorer returns 0.0, the same type as any other score.
* **Detectors** turn a ``Frame`` of new data into ``Finding``s: ``update(frame)``.  Deciding
  is separate from scoring: ``Hysteresis`` opens a finding when a score has stayed over
  its enter threshold for a minimum time and closes it when it has stayed under its exit
  threshold, so one noisy sample is never an alert.

State is plain arrays keyed by entity (``EntityTable``) and serialises to JSON, so the
detection runner can put it in the store and a restart keeps every baseline.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hbmwatch.records import Evidence, Finding, RankedCause, Severity


class Scorer(Protocol):
    """Streaming anomaly score over a vector of entities: higher is more anomalous."""

    def learn_one(self, x: np.ndarray, learn: np.ndarray | None = None) -> None: ...

    def score_one(self, x: np.ndarray) -> np.ndarray: ...


class Detector(Protocol):
    name: str

    def update(self, frame: Any) -> list[Finding]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class EntityTable:
    """Named per-entity arrays that survive entities coming and going between frames.

    >>> t = EntityTable({"level": np.nan, "n": 0.0})
    >>> rows = t.rows(["gpu-a", "gpu-b"])
    >>> t["n"][rows] += 1
    >>> t.rows(["gpu-b", "gpu-c"]).tolist(), t["n"].tolist()
    ([1, 2], [1.0, 1.0, 0.0])
    """

    def __init__(self, fields: Mapping[str, float], width: Mapping[str, int] | None = None):
        self.fields = dict(fields)
        self.width = dict(width or {})
        self.keys: list[str] = []
        self.index: dict[str, int] = {}
        self.arrays: dict[str, np.ndarray] = {
            name: np.full((0, *self._shape(name)), fill) for name, fill in self.fields.items()
        }

    def _shape(self, name: str) -> tuple[int, ...]:
        return (self.width[name],) if name in self.width else ()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        """Row of each key, adding rows (at their fill values) for keys never seen."""
        new = [k for k in dict.fromkeys(keys) if k not in self.index]
        if new:
            start = len(self.keys)
            for i, k in enumerate(new):
                self.index[k] = start + i
            self.keys.extend(new)
            for name, fill in self.fields.items():
                extra = np.full((len(new), *self._shape(name)), fill)
                self.arrays[name] = np.concatenate([self.arrays[name], extra])
        return np.array([self.index[k] for k in keys], dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "arrays": {n: _jsonable(a) for n, a in self.arrays.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        keys = list(state.get("keys", []))
        arrays = state.get("arrays", {})
        self.keys, self.index = [], {}
        self.arrays = {
            name: np.full((0, *self._shape(name)), fill) for name, fill in self.fields.items()
        }
        rows = self.rows(keys)
        for name in self.fields:
            if name in arrays and len(keys):
                loaded = np.array(arrays[name], dtype=np.float64)
                if loaded.shape == self.arrays[name][rows].shape:
                    self.arrays[name][rows] = loaded


def _jsonable(a: np.ndarray) -> list[Any]:
    """NaN is not JSON: it travels as None."""
    return np.where(np.isnan(a), None, a).tolist()  # type: ignore[no-any-return]


@dataclass
class Episode:
    """An open finding's bookkeeping while its condition holds."""

    started_ms: int
    raised_ms: int
    peak: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Hysteresis:
    """Opens after ``min_on_s`` over ``enter``, closes after ``min_off_s`` under ``exit``.

    ``step`` takes one time step for all entities (a score per entity, NaN = no data, which
    neither opens nor closes) and returns the rows that opened and closed.

    >>> h = Hysteresis(enter=3.0, exit=1.0, min_on_s=2, min_off_s=2)
    >>> keys = ["a"]
    >>> [h.step(keys, np.array([s]), t * 1000) for t, s in enumerate([5, 5, 5, 2, 0, 0, 0])]
    [([], []), ([], []), (['a'], []), ([], []), ([], []), ([], []), ([], ['a'])]
    """

    def __init__(self, *, enter: float, exit: float, min_on_s: float, min_off_s: float) -> None:
        self.enter, self.exit = enter, exit
        self.min_on_ms, self.min_off_ms = min_on_s * 1000, min_off_s * 1000
        self.table = EntityTable({"over_since": np.nan, "under_since": np.nan, "open": 0.0})
        self.episodes: dict[str, Episode] = {}

    def step(
        self, keys: Sequence[str], score: np.ndarray, t_ms: int
    ) -> tuple[list[str], list[str]]:
        rows = self.table.rows(keys)
        over_since = self.table["over_since"][rows]
        under_since = self.table["under_since"][rows]
        is_open = self.table["open"][rows] > 0
        known = ~np.isnan(score)
        over = known & (score >= self.enter)
        under = known & (score < self.exit)
        over_since = np.where(over, np.where(np.isnan(over_since), t_ms, over_since), np.nan)
        under_since = np.where(under, np.where(np.isnan(under_since), t_ms, under_since), np.nan)
        # Gaps in the data keep the clocks as they were.
        over_since = np.where(known, over_since, self.table["over_since"][rows])
        under_since = np.where(known, under_since, self.table["under_since"][rows])
        opening = ~is_open & over & (t_ms - over_since >= self.min_on_ms)
        closing = is_open & under & (t_ms - under_since >= self.min_off_ms)
        is_open = (is_open | opening) & ~closing
        self.table["over_since"][rows] = over_since
        self.table["under_since"][rows] = under_since
        self.table["open"][rows] = is_open.astype(float)
        opened = [keys[i] for i in np.flatnonzero(opening)]
        closed = [keys[i] for i in np.flatnonzero(closing)]
        return opened, closed

    def over_since(self, key: str) -> float:
        return float(self.table["over_since"][self.table.index[key]])

    def is_open(self, keys: Sequence[str]) -> np.ndarray:
        rows = self.table.rows(keys)  # first: it may grow the arrays
        return self.table["open"][rows] > 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "table": self.table.state_dict(),
            "episodes": {
                k: {"started_ms": e.started_ms, "raised_ms": e.raised_ms, "peak": e.peak,
                    "extra": e.extra}
                for k, e in self.episodes.items()
            },
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.table.load_state_dict(state.get("table", {}))
        self.episodes = {
            k: Episode(int(e["started_ms"]), int(e["raised_ms"]), float(e["peak"]), e["extra"])
            for k, e in state.get("episodes", {}).items()
        }


class SparseGate:
    """Steps a ``Hysteresis`` with only the entities whose state can change.

    ``Hysteresis.step`` looks every key up, which for 10,000 sensors x 60 steps costs more
    than the detector's arithmetic.  An entity that is not open, not over ``enter`` now and
    was not over before (no clock running) cannot open or close, and what ``step`` would
    record for it is never read, so it is left out: the result is the same, at a cost that
    follows the number of anomalous entities.  Built once per frame for that frame's keys.

    >>> h = Hysteresis(enter=1.0, exit=0.5, min_on_s=2, min_off_s=0)
    >>> gate = SparseGate(h, ["a", "b"])
    >>> [gate.step(np.array([s, 0.0]), t * 1000) for t, s in enumerate([2, 2, 2, 0])]
    [([], []), ([], []), (['a'], []), ([], ['a'])]
    >>> h.table.keys
    ['a', 'b']
    """

    def __init__(
        self, hysteresis: Hysteresis, keys: list[str], rows: np.ndarray | None = None
    ) -> None:
        """``rows``: the keys' rows in the hysteresis table, when the caller kept them."""
        self.h = hysteresis
        self.keys = keys
        rows = hysteresis.table.rows(keys) if rows is None else rows
        self.open = hysteresis.table["open"][rows] > 0
        self.tracked = self.open | ~np.isnan(hysteresis.table["over_since"][rows])

    def step(self, score: np.ndarray, t_ms: int) -> tuple[list[str], list[str]]:
        known = ~np.isnan(score)
        over = known & (score >= self.h.enter)
        pick = np.flatnonzero(known & (over | self.tracked))
        if pick.size == 0:
            return [], []
        sub = [self.keys[j] for j in pick.tolist()]
        opened, closed = self.h.step(sub, score[pick], t_ms)
        if opened or closed:
            where = dict(zip(sub, pick.tolist(), strict=True))
            self.open[[where[k] for k in opened]] = True
            self.open[[where[k] for k in closed]] = False
        self.tracked[pick] = over[pick] | self.open[pick]
        return opened, closed


def fingerprint(kind: str, entity: Mapping[str, str]) -> str:
    """Stable identity of "this kind of finding about this entity"."""
    text = kind + "|" + ",".join(f"{k}={entity[k]}" for k in sorted(entity))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def make_finding(
    *,
    kind: str,
    detector: str,
    entity: Mapping[str, str],
    severity: Severity,
    summary: str,
    started_ms: int,
    raised_ms: int,
    updated_ms: int,
    ended_ms: int | None = None,
    evidence: Iterable[Evidence] = (),
    causes: Iterable[RankedCause] = (),
) -> Finding:
    fp = fingerprint(kind, entity)
    return Finding(
        id=f"{fp}-{started_ms}",
        fingerprint=fp,
        kind=kind,
        severity=severity,
        detector=detector,
        entity=dict(entity),
        summary=summary,
        started_ms=int(started_ms),
        raised_ms=int(raised_ms),
        updated_ms=int(updated_ms),
        ended_ms=None if ended_ms is None else int(ended_ms),
        evidence=tuple(evidence),
        causes=tuple(causes),
    )


def quiet_nan(fn: Any, a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``np.nanmean``, ``nanmax``, ``nanmin``, ``nanmedian`` giving NaN for all-NaN slices.

    Without numpy's warning, and without ``warnings.catch_warnings``, which is not
    thread-safe (detectors run in two threads).
    """
    a = np.asarray(a, dtype=float)
    if fn is np.nanmedian:
        return nanmedian(a, axis=axis)
    if fn is np.nanmean:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nansum(a, axis=axis) / (~np.isnan(a)).sum(axis=axis)  # type: ignore[no-any-return]
    if fn in (np.nanmax, np.nanmin):
        if a.size == 0 or (axis is not None and a.shape[axis] == 0):
            shape = () if axis is None else a.shape[:axis] + a.shape[axis + 1 :]
            empty = np.full(shape, np.nan)
            return empty if empty.ndim else float(empty)  # type: ignore[return-value]
        reduce = np.fmax.reduce if fn is np.nanmax else np.fmin.reduce
        return reduce(a, axis=axis) if axis is not None else reduce(a.ravel())  # type: ignore[no-any-return]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(a, axis=axis)  # type: ignore[no-any-return]


def nanmedian(a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``np.nanmedian`` without its per-slice Python path or its all-NaN warnings.

    NaN sorts last, so each slice's median sits in the middle of its non-NaN head; an
    all-NaN slice gives NaN.  Several times faster than numpy's on fleet-sized frames.

    >>> nanmedian(np.array([[1.0, np.nan], [3.0, np.nan], [np.nan, np.nan]]), axis=0).tolist()
    [2.0, nan]
    """
    a = np.asarray(a, dtype=float)
    if axis is None:
        a, axis = a.reshape(-1), 0
    head = np.moveaxis(np.sort(a, axis=axis), axis, 0)
    if head.shape[0] == 0:
        empty = np.full(head.shape[1:], np.nan)
        return empty if empty.ndim else float(empty)  # type: ignore[return-value]
    n = (~np.isnan(head)).sum(axis=0)
    lo, hi = np.maximum((n - 1) // 2, 0)[None], np.maximum(n // 2, 0)[None]
    with np.errstate(invalid="ignore"):
        mid = (np.take_along_axis(head, lo, 0)[0] + np.take_along_axis(head, hi, 0)[0]) / 2.0
    out = np.where(n > 0, mid, np.nan)
    return out if out.ndim else float(out)  # type: ignore[return-value]


def latest(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per id, the last statement of each (a frame may open and update one)."""
    return list({f.id: f for f in findings}.values())
