"""Any series: a user's own series scored by the generic model, its anomalies as findings.

For series hbmwatch knows nothing about (``user_series_value``, which the ``mapped`` source
writes, and the value columns ``score-file`` cannot name as canonical metrics).  The model
(``generic_model.SeriesModel``) scores each sample before learning it; this module feeds
it each series' own samples in time order at their own timestamps (a series sampled every
5 minutes is scored once per sample whatever the detection step, and no sample twice) and
turns the scores into findings by one rule, which the service and ``score-file`` share:

* a finding opens at the first sample scoring at or above the model's ``alert_score``;
* it closes once ``calm_samples`` samples in a row score under it (ended at the first).

A finding is a ``series_anomaly`` (warning) whose entity is the series' labels; it names
the series, its value and the level the series held while calm (the baseline it left).
It is never a cause of another finding: nothing is known of what the series means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from hbmwatch.detectors.base import EntityTable, latest, make_finding
from hbmwatch.detectors.frame import Frame, RawSeries
from hbmwatch.detectors.generic_model import SeriesModel
from hbmwatch.metrics import SCOPE_LABELS, Scope
from hbmwatch.records import Evidence, Finding, Severity
from hbmwatch.taxonomy import FindingKind

#: The labels a series finding's entity keeps.
ENTITY_LABELS = SCOPE_LABELS[Scope.SERIES]
#: Per series: the last sample time learned (no sample twice), the rule's state, the open
#: episode, and the calm level (an EWMA of values scored under the alert score) for evidence.
FIELDS = {
    "last_ms": np.nan, "open": 0.0, "calm": 0.0, "calm_since": np.nan, "level": np.nan,
    "started_ms": np.nan, "updated_ms": np.nan, "peak": np.nan, "peak_value": np.nan,
    "peak_level": np.nan,
}  # fmt: skip
LEVEL_ALPHA = 0.1  # the calm level's weight on each new calm sample


class Series(NamedTuple):
    """One series' new samples, ascending in time: its identity, labels and samples."""

    key: str
    labels: Mapping[str, str]
    t_ms: np.ndarray
    values: np.ndarray


class SeriesAnomalies:
    """A ``series_anomaly`` finding per user series while its score holds at the alert score.

    >>> det = SeriesAnomalies()
    >>> t = 1_800_000_000_000 + 60_000 * np.arange(200)
    >>> x = np.r_[np.full(150, 10.0), np.full(50, 90.0)]
    >>> found, scores = det.feed([Series('q{series="q"}', {"series": "q"}, t, x)])
    >>> [(str(f.kind), f.entity, bool(f.started_ms == t[150])) for f in found]
    [('series_anomaly', {'series': 'q'}, True)]
    """

    name = "series"

    def __init__(self, *, calm_samples: int = 3, model: SeriesModel | None = None) -> None:
        if calm_samples < 1:
            raise ValueError("calm_samples must be at least 1")
        self.calm_samples = calm_samples
        self.model = model or SeriesModel()
        self.table = EntityTable(FIELDS)

    @property
    def alert_score(self) -> float:
        """The score at or above which a sample is anomalous (the model's, else 1.0)."""
        return float(getattr(self.model, "alert_score", 1.0))

    # -- the service: a frame's raw series ---------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        """Score the frame's user series; nothing to do (and no cost) when it has none."""
        if not frame.raw:
            return []
        raw = [s for s in frame.raw if s.labels.get("series")]
        found, scores = self.feed([Series(s.key, s.labels, s.t_ms, s.values) for s in raw])
        if raw and frame.steps:
            frame.scores[self.name] = _grid(frame, raw, scores)
        return found

    # -- the one path both the service and score-file take -----------------------------------
    def feed(self, series: Sequence[Series]) -> tuple[list[Finding], list[np.ndarray]]:
        """Score and learn every series' samples in time order; findings opened, closed or
        updated, and each sample's score (NaN: not scored, at or before one already seen)."""
        if not series:
            return [], []
        keys = [s.key for s in series]
        rows, mrows = self.table.rows(keys), self.model.rows(keys)
        lengths = np.array([len(s.t_ms) for s in series])
        width = int(lengths.max(initial=0))
        t = np.full((len(series), width), np.nan)
        x = np.full((len(series), width), np.nan)
        scored = np.full((len(series), width), np.nan)
        for i, s in enumerate(series):
            t[i, : lengths[i]], x[i, : lengths[i]] = s.t_ms, s.values
        closed: list[Finding] = []
        touched = np.zeros(len(series), bool)
        for k in range(width):
            sel = np.flatnonzero(lengths > k)
            last = self.table["last_ms"][rows[sel]]
            sel = sel[np.isnan(last) | (t[sel, k] > last)]
            if sel.size == 0:
                continue
            score = scored[sel, k] = self.model.update(mrows[sel], t[sel, k], x[sel, k])
            touched[sel] = True
            for i in self._decide(rows[sel], t[sel, k], x[sel, k], score):
                closed.append(self._finding(series[sel[i]], int(rows[sel[i]]), closed=True))
                self._reset(int(rows[sel[i]]))
        still = [i for i in np.flatnonzero(touched).tolist() if self.table["open"][rows[i]] > 0]
        found = closed + [self._finding(series[i], int(rows[i]), closed=False) for i in still]
        return latest(found), [scored[i, :n] for i, n in enumerate(lengths.tolist())]

    def _decide(
        self, rows: np.ndarray, t: np.ndarray, x: np.ndarray, score: np.ndarray
    ) -> list[int]:
        """One sample per row through the rule; the positions (in ``rows``) that closed."""
        tb = self.table
        known = ~np.isnan(score)
        over = known & (score >= self.alert_score)
        is_open = tb["open"][rows] > 0
        level = tb["level"][rows]
        opening = ~is_open & over
        tb["started_ms"][rows[opening]] = t[opening]
        tb["peak"][rows[opening]] = -np.inf
        is_open |= opening
        higher = is_open & known & (score > tb["peak"][rows])
        tb["peak"][rows[higher]] = score[higher]
        tb["peak_value"][rows[higher]] = x[higher]
        tb["peak_level"][rows[higher]] = level[higher]
        calm = np.where(is_open & known & ~over, tb["calm"][rows] + 1, 0.0)
        first_calm = calm == 1
        tb["calm_since"][rows[first_calm]] = t[first_calm]
        tb["calm"][rows] = calm
        tb["open"][rows] = is_open.astype(float)
        tb["updated_ms"][rows[is_open]] = t[is_open]
        learn = known & ~over & ~is_open
        old, new = level[learn], x[learn]
        tb["level"][rows[learn]] = np.where(np.isnan(old), new, old + LEVEL_ALPHA * (new - old))
        tb["last_ms"][rows] = t
        return np.flatnonzero(is_open & (calm >= self.calm_samples)).tolist()

    def _reset(self, row: int) -> None:
        for name in ("open", "calm"):
            self.table[name][row] = 0.0
        for name in ("calm_since", "started_ms", "updated_ms", "peak", "peak_value", "peak_level"):
            self.table[name][row] = np.nan

    def _finding(self, s: Series, row: int, *, closed: bool) -> Finding:
        """The statement of a series' episode from its row: open, or closed when it calmed."""
        g = {name: float(self.table[name][row]) for name in FIELDS}
        entity = {k: s.labels[k] for k in ENTITY_LABELS if s.labels.get(k)}
        name = s.labels.get("series", s.key)
        host, gpu = s.labels.get("host"), s.labels.get("gpu")
        where = (f" on {host}" if host else "") + (f" GPU {gpu}" if gpu else "")
        level = g["peak_level"]
        base = "no calm level yet" if np.isnan(level) else f"baseline {level:.4g}"
        started = int(g["started_ms"])
        return make_finding(
            kind=FindingKind.SERIES_ANOMALY, detector=self.name, entity=entity,
            severity=Severity.WARNING,
            summary=f"{name}{where} left its baseline: {g['peak_value']:.4g} ({base})",
            started_ms=started, raised_ms=started, updated_ms=int(g["updated_ms"]),
            ended_ms=int(g["calm_since"]) if closed else None,
            evidence=[Evidence(
                series=s.key, statistic="value", value=g["peak_value"],
                threshold=None if np.isnan(g["peak_level"]) else g["peak_level"],
                window_start_ms=started, window_end_ms=int(g["updated_ms"]),
                note=f"value against its calm level; score {g['peak']:.2f} "
                f"(alerts at {self.alert_score:.2f})",
            )],
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "table": self.table.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "model" in state:
            self.model.load_state_dict(state["model"])
        self.table.load_state_dict(state.get("table", {}))


def _grid(frame: Frame, raw: Sequence[RawSeries], scores: Sequence[np.ndarray]) -> np.ndarray:
    """Each series' largest score per step of the frame, for ``score-file``'s table."""
    out = np.full((len(raw), frame.steps), np.nan)
    for i, (s, sc) in enumerate(zip(raw, scores, strict=True)):
        col = (s.t_ms - frame.start_ms) // frame.step_ms
        ok = ~np.isnan(sc) & (col >= 0) & (col < frame.steps)
        np.fmax.at(out[i], col[ok], sc[ok])
    return out
