"""Fleet outliers: GPUs that run hotter or slower than their peers under the same load.

A GPU's own baseline cannot see a part that was always 8 C hotter than its siblings, or a
straggler whose clocks sit a few percent low from the day it was racked; its peers can.  The
detector keeps, per GPU, one-minute means of memory and hotspot temperature, power, compute
clock, memory bandwidth and utilisation (the last ``every_s`` of them), and every
``every_s`` of data, per peer group (same SKU, at least ``min_peers`` GPUs with data):

1. turns the window means into features: the raw means, and **residuals against the peers at
   similar load** (what a robust line on bandwidth and utilisation through the group, then
   the median of the ``neighbours`` peers at the nearest load, do not explain), so a GPU
   that is hot because it is busy, like its busy peers, is not an outlier;
2. fits scikit-learn's ``IsolationForest(random_state=0)`` on the group's rows and scores
   each GPU with ``-score_samples`` (higher = more anomalous, the project's one sign);
3. explains each score by the features with the largest robust z (median / MAD) against
   the group, and takes the direction from the residuals: **hot** (memory or hotspot
   temperature over the peers at its load, cause ``thermal``) or **slow** (compute clock
   under them, cause ``clock_drop``).

A direction opens when the isolation score, the residual's robust z and its absolute size
are all past their thresholds for two consecutive evaluations (``Hysteresis`` keyed by GPU
and direction), and closes after two consecutive evaluations under the exit level.  The
forest is never persisted: the state holds the per-minute features, and a restart refits
at the next evaluation.  One fit per group per ``every_s``: 1,024 GPUs cost about 0.2 s on
a small machine.  Steps 1 to 3 (features, residuals, scores) live in
``detectors/peer_features.py``; this module keeps the minutes, evaluations and findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode, Hysteresis, make_finding, quiet_nan
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.peer_features import (
    CLOCK_RESID,
    FEATURES,
    MEM_RESID,
    RAW,
    GroupScores,
    feature_series,
    hot_column,
    raw_signals,
    score_group,
)
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.taxonomy import Cause, FindingKind

MINUTE_MS = 60_000
DIRECTIONS = ("hot", "slow")


class FleetOutliers:
    """GPUs hotter or slower than their same-SKU peers at the same load, by IsolationForest.

    Parameters: ``every_s`` (seconds of data between evaluations, a multiple of 60; the
    window of one-minute means scored is as long), ``min_peers`` (smallest group scored),
    ``score_enter`` (isolation score, ``-score_samples``, past which a GPU may be an outlier;
    about 0.5 is ordinary), ``z_enter`` (robust z of the residual that sets the direction),
    ``min_temp_c`` / ``min_clock_drop`` (smallest effect worth an alert), ``consecutive``
    (evaluations in a row before a finding opens, and under the exit level before it closes),
    ``neighbours`` (peers at nearest load whose median a residual is taken against; at least
    5% of the group), ``n_estimators`` (trees: 50, not scikit-learn's 100, since fitting cost
    is per tree and the score is only one of three gates).

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
    >>> rng = np.random.default_rng(0)
    >>> gpus = Entities()
    >>> for i in range(16):
    ...     host, gpu = f"h{i // 8}", str(i % 8)
    ...     _ = gpus.add(f"c/{host}/{gpu}", {"rack": "r", "host": host, "gpu": gpu, "sku": "H200"})
    >>> steps = 66  # 11 minutes at 10 s
    >>> f = Frame(0, 10_000, steps, gpus, Entities(), Entities(), {},
    ...           np.full((16, 8, steps), np.nan), {}, {}, {}, {}, {})
    >>> bw = 0.6 + rng.normal(0, 0.02, (16, steps))
    >>> f.gpu["bw"], f.gpu["util"] = bw, np.full((16, steps), 0.9)
    >>> f.gpu["mem_temp"] = 60 + 20 * (bw - 0.6) + rng.normal(0, 0.5, (16, steps))
    >>> f.gpu["mem_temp"][5] += 8.0  # one GPU runs 8 C hotter at the same load
    >>> f.gpu["power"] = 500 + rng.normal(0, 5, (16, steps))
    >>> f.gpu["clock"] = 1.98e9 + rng.normal(0, 5e6, (16, steps))
    >>> [(x.entity["host"], x.entity["gpu"], str(x.top_cause)) for x in FleetOutliers().update(f)]
    [('h0', '5', 'thermal')]
    """

    name = "outliers"

    def __init__(
        self,
        *,
        every_s: float = 300.0,
        min_peers: int = 8,
        score_enter: float = 0.55,
        z_enter: float = 4.0,
        min_temp_c: float = 3.0,
        min_clock_drop: float = 0.03,
        exit_fraction: float = 0.7,
        consecutive: int = 2,
        neighbours: int = 8,
        n_estimators: int = 50,
    ) -> None:
        self.every_s = every_s
        self.min_peers = min_peers
        self.score_enter = score_enter
        self.z_enter = z_enter
        self.min_temp_c = min_temp_c
        self.min_clock_drop = min_clock_drop
        self.exit_fraction = exit_fraction
        self.consecutive = consecutive
        self.neighbours = neighbours
        self.n_estimators = n_estimators
        self._init_state()

    # -- state ----------------------------------------------------------------------------
    @property
    def window_(self) -> int:
        """Minutes per window: as many as between two evaluations."""
        return int(self.every_s // 60)

    def _init_state(self) -> None:
        w, r = self.window_, len(RAW)
        self.table_ = EntityTable(
            {"sum_": 0.0, "n_": 0.0, "hist_": np.nan}, {"sum_": r, "n_": r, "hist_": w * r}
        )
        self.minute_: int | None = None  # the minute being accumulated
        self.labels_: dict[str, dict[str, str]] = {}
        held = self.every_s * (self.consecutive - 1)
        self.open_ = Hysteresis(enter=1.0, exit=self.exit_fraction, min_on_s=held, min_off_s=held)
        self.episodes_: dict[str, Episode] = {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "table": self.table_.state_dict(),
            "minute": self.minute_,
            "labels": self.labels_,
            "open": self.open_.state_dict(),
            "episodes": {
                k: {
                    "started_ms": e.started_ms,
                    "raised_ms": e.raised_ms,
                    "peak": e.peak,
                    "extra": e.extra,
                }
                for k, e in self.episodes_.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.table_.load_state_dict(state.get("table", {}))
        minute = state.get("minute")
        self.minute_ = None if minute is None else int(minute)
        self.labels_ = {k: dict(v) for k, v in state.get("labels", {}).items()}
        self.open_.load_state_dict(state.get("open", {}))
        self.episodes_ = {
            k: Episode(
                int(e["started_ms"]),
                int(e["raised_ms"]),
                float(e.get("peak", 0.0)),
                dict(e.get("extra", {})),
            )
            for k, e in state.get("episodes", {}).items()
        }

    def _check(self) -> None:
        if self.every_s < 60 or self.every_s % 60:
            raise ValueError(f"every_s must be a positive multiple of 60, got {self.every_s}")
        if self.min_peers < 3 or self.consecutive < 1:
            raise ValueError("min_peers must be at least 3 and consecutive at least 1")

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        """Fold a frame into the per-minute means; evaluate at each ``every_s`` boundary."""
        self._check()
        if len(frame.gpus) == 0 or frame.steps == 0:
            return []
        for key, labels in zip(frame.gpus.keys, frame.gpus.labels, strict=True):
            self.labels_.setdefault(key, dict(labels))
        x = raw_signals(frame)  # (G, R, T)
        rows = self.table_.rows(frame.gpus.keys)
        minutes = frame.times_ms // MINUTE_MS
        findings: dict[str, Finding] = {}
        for m in np.unique(minutes).tolist():
            findings.update(self._close_through(int(m), frame))
            sel = minutes == m
            chunk = x[:, :, sel]
            self.table_["sum_"][rows] += np.nansum(chunk, axis=2)
            self.table_["n_"][rows] += (~np.isnan(chunk)).sum(axis=2)
        complete = frame.end_ms // MINUTE_MS  # minutes before this one are complete
        findings.update(self._close_through(int(complete), frame))
        return list(findings.values())

    def _close_through(self, minute: int, frame: Frame) -> dict[str, Finding]:
        """Close every accumulated minute before ``minute``, evaluating on the boundaries."""
        if self.minute_ is None:
            self.minute_ = minute
        out: dict[str, Finding] = {}
        steps = 0
        while self.minute_ < minute:
            self._push_minute()
            self.minute_ += 1
            steps += 1
            boundary_ms = self.minute_ * MINUTE_MS
            if boundary_ms % int(self.every_s * 1000) == 0:
                out.update({f.id: f for f in self._evaluate(frame, boundary_ms)})
            if steps > self.window_ and self.minute_ < minute:
                # A long gap: nothing left to remember, jump to the present.
                self.table_["hist_"][:] = np.nan
                self.minute_ = minute
        return out

    def _push_minute(self) -> None:
        """The accumulated minute's means become the newest column of each GPU's window."""
        r = len(RAW)
        with np.errstate(all="ignore"):
            mean = self.table_["sum_"] / self.table_["n_"]
        hist = self.table_["hist_"].reshape(len(self.table_), self.window_, r)
        hist = np.concatenate([hist[:, 1:], mean[:, None, :]], axis=1)
        self.table_["hist_"] = hist.reshape(len(self.table_), -1)
        self.table_["sum_"][:] = 0.0
        self.table_["n_"][:] = 0.0

    # -- one evaluation ---------------------------------------------------------------------
    def _evaluate(self, frame: Frame, t_ms: int) -> list[Finding]:
        keys = list(self.table_.keys)
        means = self._window_means()
        scored = [s for s in self._score_groups(keys, means) if s is not None]
        by_key = {k: (s, i) for s in scored for i, k in enumerate(s.keys)}
        dir_keys = [f"{k}#{d}" for k in keys for d in DIRECTIONS]
        dir_score = np.full(len(dir_keys), np.nan)
        for j, k in enumerate(keys):
            if k in by_key:
                s, i = by_key[k]
                dir_score[2 * j : 2 * j + 2] = self._direction_scores(s, i)
        self.open_.step(dir_keys, dir_score, t_ms)
        is_open = self.open_.is_open(dir_keys).reshape(len(keys), 2)
        return self._findings(frame, keys, is_open, by_key, t_ms)

    def _window_means(self) -> np.ndarray:
        """Each GPU's mean of its one-minute means, NaN with under half the window seen."""
        hist = self.table_["hist_"].reshape(len(self.table_), self.window_, len(RAW))
        seen = (~np.isnan(hist)).sum(axis=1)
        mean = quiet_nan(np.nanmean, hist, axis=1)
        return np.where(seen * 2 >= self.window_, mean, np.nan)

    def _score_groups(self, keys: list[str], means: np.ndarray) -> list[GroupScores | None]:
        groups: dict[str, list[int]] = {}
        for row, key in enumerate(keys):
            labels = self.labels_.get(key, {})
            has_load = not np.isnan(means[row, 4]) or not np.isnan(means[row, 5])
            has_signal = not np.isnan(means[row, :4]).all()
            if has_load and has_signal:
                groups.setdefault(labels.get("sku", ""), []).append(row)
        return [
            score_group(
                sku,
                [keys[r] for r in rows],
                means[rows],
                neighbours=self.neighbours,
                n_estimators=self.n_estimators,
            )
            for sku, rows in groups.items()
            if len(rows) >= self.min_peers
        ]

    def _direction_scores(self, s: GroupScores, i: int) -> np.ndarray:
        """Hot and slow, each as the least of (isolation, z, effect) over its threshold."""
        iso = s.iso[i] / self.score_enter
        z, v = s.z[i], s.values[i]
        hot_col = hot_column(z)
        hot = min(iso, z[hot_col] / self.z_enter, v[hot_col] / self.min_temp_c)
        slow = min(iso, -z[CLOCK_RESID] / self.z_enter, -v[CLOCK_RESID] / self.min_clock_drop)
        return np.array([hot, slow], dtype=float)

    # -- findings ---------------------------------------------------------------------------
    def _findings(
        self,
        frame: Frame,
        keys: list[str],
        is_open: np.ndarray,
        by_key: Mapping[str, tuple[GroupScores, int]],
        t_ms: int,
    ) -> list[Finding]:
        out = []
        window_ms = int(self.every_s * 1000)
        for j, key in enumerate(keys):
            dirs = [d for d, o in zip(DIRECTIONS, is_open[j], strict=True) if o]
            ep = self.episodes_.get(key)
            if dirs and ep is None:
                over = [self.open_.over_since(f"{key}#{d}") for d in dirs]
                since = float(np.nanmin(over)) if not np.isnan(over).all() else float(t_ms)
                ep = self.episodes_[key] = Episode(int(since) - window_ms, raised_ms=t_ms)
            if ep is None or key not in by_key:
                if ep is not None and not dirs:  # closed without fresh numbers
                    self.episodes_.pop(key)
                continue
            s, i = by_key[key]
            end = None if dirs else t_ms
            ep.extra["dirs"] = dirs or ep.extra.get("dirs", ["hot"])  # a close says what it was
            out.append(self._finding(frame, key, ep.extra["dirs"], ep, s, i, t_ms, end))
            if end is not None:
                self.episodes_.pop(key)
        return out

    def _finding(
        self,
        frame: Frame,
        key: str,
        dirs: Sequence[str],
        ep: Episode,
        s: GroupScores,
        i: int,
        t_ms: int,
        end: int | None,
    ) -> Finding:
        labels = self.labels_.get(key, {})
        z, v = s.z[i], s.values[i]
        order = np.argsort(-np.nan_to_num(np.abs(z), nan=-1.0), kind="stable")[:3]
        start = t_ms - int(self.every_s * 1000)
        evidence = [
            Evidence(
                feature_series(frame, key, int(c)), FEATURES[c], float(v[c]), None, start, t_ms,
                note=f"robust z {z[c]:+.1f} against the {s.group} peers' median "
                f"{s.medians[c]:.4g}",
            )
            for c in order.tolist()
            if not np.isnan(z[c])
        ]  # fmt: skip
        evidence.append(
            Evidence(
                f"IsolationForest over {len(s.keys)} {s.group} GPUs", "isolation_score",
                float(s.iso[i]), self.score_enter, start, t_ms,
            )
        )  # fmt: skip
        ep.peak = max(ep.peak, float(s.iso[i]))
        causes, phrases = self._causes(dirs, v, z)
        entity = {k: labels[k] for k in ("cluster", "rack", "host", "gpu", "sku") if k in labels}
        return make_finding(
            kind=FindingKind.FLEET_OUTLIER, detector=self.name, entity=entity,
            severity=Severity.WARNING,
            summary=f"{' and '.join(phrases)} than its {len(s.keys) - 1} {s.group} peers at "
            f"the same load (isolation score {s.iso[i]:.2f})",
            started_ms=ep.started_ms, raised_ms=ep.raised_ms, updated_ms=t_ms, ended_ms=end,
            evidence=evidence, causes=causes,
        )  # fmt: skip

    def _causes(
        self, dirs: Sequence[str], v: np.ndarray, z: np.ndarray
    ) -> tuple[list[RankedCause], list[str]]:
        """Heat first when both: a hot part's clocks often drop because it is hot."""
        causes, phrases = [], []
        if "hot" in dirs:
            c = hot_column(z)
            sensor = "memory" if c == MEM_RESID else "hotspot"
            phrases.append(f"runs hot: {sensor} {v[c]:+.1f} C")
            causes.append(RankedCause(Cause.THERMAL, 0.8, summary=f"{sensor} hotter than peers"))
        if "slow" in dirs:
            phrases.append(f"runs slow: compute clock {100 * v[CLOCK_RESID]:+.1f}%")
            causes.append(RankedCause(Cause.CLOCK_DROP, 0.8 if not causes else 0.2,
                                      summary="compute clock under its peers'"))  # fmt: skip
        return causes, phrases
