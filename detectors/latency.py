"""Latency regressions: a workload's p99 (or training step time) sustained above its baseline.

Why this shape.  Tail latency is the first thing an AI service's users feel, and on the real
H200 trace a co-tenant copy at 10% duty tripled p99 while p50 stayed flat, so p99 is watched
on its own, per workload (service and phase kept apart: mixing prefill into per-token
latency is a known 2.7x trap).  A p99 is only as good as its data, so three gates come
before any statistics:

* **too few requests** (``min_requests`` in the quantile's window; ``min_steps`` for a
  training job's ``step`` phase) gives no evidence at all: the step neither opens nor closes;
* **bucket resolution**: a p99 read off a histogram is exact only to its bucket, so the
  increase must exceed ``resolution_factor`` buckets (``res99``) to count;
* **effect size**: p99 must be ``min_ratio`` times its baseline.

The baseline works on log(p99) (latency is multiplicative), with its learned daily shape
removed (``latency_baseline``), so a morning ramp seen on earlier days is not a regression.
A one-sided CUSUM of the standardised deviation decides the onset (a noisy service needs a
larger or longer rise), the effect size alone decides that it persists, for a hold that
shrinks as the effect grows (``latency_hold``: 75 s up to 2x, 20 s at 3x, 5 s at 10x);
``Hysteresis`` closes after ``min_off_s``.  While a regression is open (or a step meets the
effect size) the baseline learns at ``open_learn_rate`` only, so a long fault does not
become normal.  ``latency_evidence`` states the finding.

A workload seen for the first time has no baseline for ``warmup_s``.  Where at least
``min_peers`` peers (the same service, model and phase on other GPUs of its SKU) are warm,
it is judged against the median of their baselines from its first sample
(``latency_peers``), and its own baseline starts from theirs; a whole fleet seen cold has no
warm peers, and from ``cold_min_s`` of its own data a workload is judged against that
provisional level.  Either way with no CUSUM (its spread is not known yet) and a larger
effect (``cold_ratio``): a cold start under load pages a large regression instead of
learning it as normal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode, Hysteresis, latest
from hbmwatch.detectors.frame import WORKLOAD_LABELS, Frame
from hbmwatch.detectors.latency_baseline import BASELINE_FIELDS, LatencyBaseline
from hbmwatch.detectors.latency_evidence import (
    E2E_PHASE,
    SERVING_PHASES,
    STEP_PHASE,
    LatencyTrace,
    Thresholds,
    latency_finding,
)
from hbmwatch.detectors.latency_hold import HOLD_FIELDS, HoldRule
from hbmwatch.detectors.latency_peers import PeerLevels, peer_groups, start_from_peers
from hbmwatch.detectors.scorers import Cusum
from hbmwatch.records import Finding


class _Rows(NamedTuple):
    """A frame's workloads' rows in each state table, looked up once a frame."""

    base: np.ndarray
    season: np.ndarray
    cusum: np.ndarray
    wl: np.ndarray
    open: np.ndarray
    #: Each e2e row's service's ttft / inter-token workloads (``SERVING_PHASES``).
    serving: dict[int, tuple[str, ...]]


def serving_siblings(keys: list[str], labels: list[dict[str, str]]) -> dict[int, tuple[str, ...]]:
    """For each e2e workload row, the keys of its service's ttft and inter-token workloads
    (same labels but the phase); rows with none are left out."""
    same = [k for k in WORKLOAD_LABELS if k != "phase"]
    by_service: dict[tuple[str | None, ...], list[str]] = {}
    for key, lab in zip(keys, labels, strict=True):
        if lab.get("phase") in SERVING_PHASES:
            by_service.setdefault(tuple(lab.get(k) for k in same), []).append(key)
    out = {}
    for row, lab in enumerate(labels):
        found = by_service.get(tuple(lab.get(k) for k in same))
        if lab.get("phase") == E2E_PHASE and found:
            out[row] = tuple(found)
    return out


class LatencyRegressions:
    """Sustained p99 regressions per workload, against a baseline that knows the day.

    Parameters: ``min_ratio`` (p99 over baseline to count; ``critical_ratio`` makes it
    critical), ``min_requests`` / ``min_steps`` (window observations below which a p99 is no
    evidence), ``resolution_factor`` (buckets the increase must exceed), ``cusum_k`` /
    ``cusum_h`` (CUSUM slack and decision level, in baseline scales), ``min_on_s`` (hold at
    ``min_ratio``), ``fast_ratio`` / ``hold_power`` / ``min_hold_s`` (past ``fast_ratio``
    the hold shrinks as ``(log fast_ratio / log ratio) ** hold_power``, not under
    ``min_hold_s``), ``min_off_s``, ``warmup_s``, ``cold_min_s`` / ``cold_ratio`` /
    ``min_peers`` (the judgement while the baseline warms), ``level_half_life_s`` /
    ``trend_half_life_s`` / ``scale_half_life_s`` / ``min_scale`` (the log-p99 baseline),
    ``open_learn_rate``, and
    ``season_bins`` / ``season_period_s`` / ``season_half_life_days`` / ``season_min_days``
    (the daily profile).

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
    >>> det = LatencyRegressions(warmup_s=60, min_on_s=10)
    >>> def frame(t0, p99):
    ...     wls = Entities()
    ...     wls.add("chat/e2e", {"host": "h", "gpu": "0", "service": "chat", "phase": "e2e"})
    ...     n = len(p99)
    ...     f = Frame(t0, 1000, n, Entities(), wls, Entities(), {}, np.zeros((0, 8, n)),
    ...               {}, {}, {}, {}, {})
    ...     f.wl["p99"] = np.array([p99], dtype=float)
    ...     f.wl["p50"] = np.full((1, n), 0.1)
    ...     f.wl["res99"] = np.full((1, n), 0.01)
    ...     f.wl["window_requests"] = np.full((1, n), 500.0)
    ...     return f
    >>> rng = np.random.default_rng(0)
    >>> det.update(frame(0, 0.3 * np.exp(rng.normal(0, 0.05, 300))))
    []
    >>> [f.summary for f in det.update(frame(300_000, [0.75] * 20))]
    ['p99 of chat/e2e 2.5x its baseline (0.75 s vs 0.3 s); p50 1.0x its baseline']
    """

    name = "latency"

    def __init__(
        self,
        *,
        min_ratio: float = 1.5,
        critical_ratio: float = 3.0,
        min_requests: int = 20,
        min_steps: int = 5,
        resolution_factor: float = 1.0,
        cusum_k: float = 0.5,
        cusum_h: float = 5.0,
        min_on_s: float = 75.0,
        fast_ratio: float = 2.0,
        hold_power: float = 2.9,
        min_hold_s: float = 5.0,
        min_off_s: float = 60.0,
        warmup_s: float = 180.0,
        cold_min_s: float = 20.0,
        cold_ratio: float = 2.5,
        min_peers: int = 3,
        level_half_life_s: float = 900.0,
        trend_half_life_s: float = 3600.0,
        scale_half_life_s: float = 1800.0,
        min_scale: float = 0.05,
        open_learn_rate: float = 0.02,
        season_bins: int = 24,
        season_period_s: float = 86_400.0,
        season_half_life_days: float = 7.0,
        season_min_days: float = 2.0,
    ) -> None:
        self.min_ratio = min_ratio
        self.critical_ratio = critical_ratio
        self.min_requests = min_requests
        self.min_steps = min_steps
        self.resolution_factor = resolution_factor
        self.cusum_k = cusum_k
        self.cusum_h = cusum_h
        self.min_on_s = min_on_s
        self.fast_ratio = fast_ratio
        self.hold_power = hold_power
        self.min_hold_s = min_hold_s
        self.min_off_s = min_off_s
        self.warmup_s = warmup_s
        self.cold_min_s = cold_min_s
        self.cold_ratio = cold_ratio
        self.min_peers = min_peers
        self.level_half_life_s = level_half_life_s
        self.trend_half_life_s = trend_half_life_s
        self.scale_half_life_s = scale_half_life_s
        self.min_scale = min_scale
        self.open_learn_rate = open_learn_rate
        self.season_bins = season_bins
        self.season_period_s = season_period_s
        self.season_half_life_days = season_half_life_days
        self.season_min_days = season_min_days
        self._init_state()

    def _init_state(self) -> None:
        self.baseline_ = LatencyBaseline(
            warmup_s=self.warmup_s,
            level_half_life_s=self.level_half_life_s,
            trend_half_life_s=self.trend_half_life_s,
            scale_half_life_s=self.scale_half_life_s,
            min_scale=self.min_scale,
            season_bins=self.season_bins,
            season_period_s=self.season_period_s,
            season_half_life_days=self.season_half_life_days,
            season_min_days=self.season_min_days,
        )
        self.base_, self.season_ = self.baseline_.base, self.baseline_.season
        self.hold_ = HoldRule(self.min_on_s, self.fast_ratio, self.hold_power, self.min_hold_s)
        self.limits_ = Thresholds(
            self.min_ratio, self.critical_ratio, self.resolution_factor, self.cusum_h
        )
        self.cusum_ = Cusum(k=self.cusum_k, cap=2.0 * self.cusum_h)
        # One row per workload: the baseline's levels and the hold's clock.
        self.wl_ = EntityTable({**BASELINE_FIELDS, **HOLD_FIELDS})
        self.open_ = Hysteresis(enter=1.0, exit=0.5, min_on_s=0.0, min_off_s=self.min_off_s)
        self._rows: tuple[list[str], _Rows] | None = None  # rows into the tables above
        self._peers: PeerLevels | None = None  # this frame's peer groups, while any is cold

    # -- the update -------------------------------------------------------------------------
    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.workloads)
        if n == 0 or frame.steps == 0:
            return []
        trace = self._inputs(frame)
        with np.errstate(all="ignore"):
            x = np.log(np.where(trace.p99 > 0, trace.p99, np.nan))
            x = np.where(trace.win >= trace.need[:, None], x, np.nan)
            x50 = np.log(np.where(trace.p50 > 0, trace.p50, np.nan))
        dt_s = frame.step_ms / 1000.0
        rows = self._rows_for(frame.workloads.keys, frame.workloads.labels)
        base = self.base_.local(rows.base)  # the loop learns a copy, stored at the end
        cold = bool((base["seen_s_"] < self.warmup_s).any())
        self._peers = PeerLevels(peer_groups(frame), self.min_peers) if cold else None
        findings: list[Finding] = []
        shape, shape_bin = np.zeros(n), -1
        scores = np.full((n, frame.steps), np.nan)
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            if self.baseline_.bin(t_ms) != shape_bin:  # the shape is looked up once per bin
                shape = self.baseline_.daily_shape(self.wl_, (rows.season, rows.wl), base, t_ms)
                shape_bin = self.baseline_.bin(t_ms)
            is_open = self.open_.table["open"][rows.open] > 0
            score = self._step(rows, base, trace, i, t_ms, (x[:, i], x50[:, i]), shape, is_open,
                               dt_s)  # fmt: skip
            scores[:, i] = score
            findings += self._decide(frame, trace, rows, i, t_ms, score, is_open)
        self.base_.store(rows.base, base)
        frame.scores[self.name] = scores
        if frame.context is not None:
            signals = {"lat_excess": trace.excess, "requests": frame.w("requests")}
            frame.context.append_workloads(frame, signals)
        findings += self._refresh_open(frame, trace)
        return latest(findings)

    def _rows_for(self, keys: list[str], labels: list[dict[str, str]]) -> _Rows:
        """The workloads' rows in each state table, kept while the workloads stay the same."""
        if self._rows is None or self._rows[0] != keys:
            rows = _Rows(
                self.base_.rows(keys), self.season_.rows(keys), self.cusum_.rows(keys),
                self.wl_.rows(keys), self.open_.table.rows(keys),
                serving_siblings(keys, labels),
            )  # fmt: skip
            self._rows = (list(keys), rows)
        return self._rows[1]

    def _inputs(self, frame: Frame) -> LatencyTrace:
        n, steps = len(frame.workloads), frame.steps
        phases = [lab.get("phase", "") for lab in frame.workloads.labels]
        need = np.array(
            [self.min_steps if p == STEP_PHASE else self.min_requests for p in phases], float
        )
        empty = np.full((n, steps), np.nan)
        return LatencyTrace(
            p99=frame.w("p99"), p50=frame.w("p50"), res=frame.w("res99"),
            win=frame.w("window_requests"), need=need, excess=empty.copy(),
            base=empty.copy(), base50=empty.copy(), cusum=empty.copy(), peers=np.zeros((n, steps)),
        )  # fmt: skip

    def _step(
        self,
        rows: _Rows,
        base_state: dict[str, np.ndarray],
        trace: LatencyTrace,
        i: int,
        t_ms: int,
        logs: tuple[np.ndarray, np.ndarray],
        shape: np.ndarray,
        is_open: np.ndarray,
        dt_s: float,
    ) -> np.ndarray:
        """Score one time step for every workload, then learn from it.

        ``base_state`` is the baseline's copy of the workloads' rows (``TrendBaseline.local``);
        ``logs`` are log p99 (NaN without enough requests) and log p50 at this step.
        """
        x, x50 = logs
        adj = x - shape
        pred = self.base_.predict_local(base_state, t_ms)
        seen = base_state["seen_s_"]
        warm = seen >= self.warmup_s
        dev = np.where(warm, adj - pred, np.nan)
        ref, peers = self._peer_reference(warm, pred + shape)
        by_peer = ~np.isnan(ref)
        cold = by_peer | (~warm & (seen >= self.cold_min_s))
        judged = np.where(by_peer, x - ref, np.where(cold, adj - pred, dev))
        z = dev / self.base_.scale_local(base_state)
        cus = self.cusum_.update(rows.cusum, z)
        base = np.where(by_peer, np.exp(ref), np.exp(pred + shape))
        score, effect = self._score(
            judged, cold, cus, (trace.p99[:, i], base, trace.res[:, i]), is_open
        )
        score = np.where(np.isnan(x), np.nan, np.nan_to_num(score, nan=0.0))  # warm-up: 0.0
        score = self.hold_.persist(self.wl_, rows.wl, score, judged, is_open, t_ms)
        trace.excess[:, i] = judged
        trace.base[:, i] = np.where(np.isnan(judged), np.nan, base)
        trace.base50[:, i] = np.exp(self.wl_["p50_"][rows.wl])
        trace.cusum[:, i] = cus
        trace.peers[:, i] = peers
        suspect = is_open | (np.nan_to_num(effect) >= 1.0)
        learn = np.where(suspect, self.open_learn_rate, 1.0)
        start_from_peers(base_state, by_peer & ~np.isnan(adj), ref - shape, t_ms)
        self.base_.learn_local(base_state, adj, t_ms, learn)
        self.baseline_.learn_levels(self.wl_, (rows.season, rows.wl), (x, x50), t_ms, learn, dt_s)
        return score

    def _peer_reference(self, warm: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The warm peers' median log baseline for each warming workload (NaN where it has
        fewer than ``min_peers``), and how many peers that is."""
        if self._peers is None:
            return np.full(len(warm), np.nan), np.zeros(len(warm))
        return self._peers.reference(~warm, warm, level)

    def _score(
        self,
        dev: np.ndarray,
        cold: np.ndarray,
        cus: np.ndarray,
        values: tuple[np.ndarray, np.ndarray, np.ndarray],
        is_open: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Hysteresis score (1 = every gate met) and the effect-size part of it.

        ``dev`` is log(p99 / baseline); ``values`` are p99, the baseline and the bucket
        resolution.  A ``cold`` workload needs ``cold_ratio`` and has no CUSUM to pass.
        """
        p99, base, res = values
        need = np.where(cold, self.cold_ratio, self.min_ratio)
        with np.errstate(all="ignore"):
            effect = (np.exp(dev) - 1.0) / (need - 1.0)
            known = res > 0
            buckets = np.where(known, (p99 - base) / (self.resolution_factor * res), np.inf)
            effect = np.minimum(effect, buckets)  # NaN (warm-up, no data) stays NaN
            onset = np.where(cold, effect, np.minimum(effect, cus / self.cusum_h))
        return np.where(is_open, effect, onset), effect

    def hold_s(self, ratio: np.ndarray | float) -> np.ndarray:
        """How long a regression of ``ratio`` times its baseline must last to page.

        >>> LatencyRegressions().hold_s(np.array([1.5, 2.0, 2.5, 3.0, 10.0])).round(1).tolist()
        [75.0, 75.0, 33.4, 19.7, 5.0]
        """
        return self.hold_.hold_s(ratio)

    # -- findings ---------------------------------------------------------------------------
    def _decide(
        self,
        frame: Frame,
        trace: LatencyTrace,
        rows: _Rows,
        i: int,
        t_ms: int,
        score: np.ndarray,
        is_open: np.ndarray,
    ) -> list[Finding]:
        # Only workloads that are open, over, or were over can change state: step those.
        pending = ~np.isnan(self.open_.table["over_since"][rows.open])
        live = np.flatnonzero(is_open | pending | (score >= 1.0))
        if not len(live):
            return []
        keys = [frame.workloads.keys[j] for j in live.tolist()]
        opened, closed = self.open_.step(keys, score[live], t_ms)
        out = []
        for key in opened:
            start = int(self.wl_["since_"][self.wl_.index[key]])
            self.open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._finding(frame, trace, frame.workloads.index[key], i, t_ms))
        for key in closed:
            row = frame.workloads.index[key]
            out.append(self._finding(frame, trace, row, i, t_ms, end=t_ms))
            self.open_.episodes.pop(key, None)
        if closed:
            self.cusum_.reset(self.cusum_.rows(closed))
        return out

    def _refresh_open(self, frame: Frame, trace: LatencyTrace) -> list[Finding]:
        """Open findings, re-stated with this frame's last evidence."""
        out = []
        for key in self.open_.episodes:
            row = frame.workloads.index.get(key)
            if row is None:
                continue
            have = np.flatnonzero(~np.isnan(trace.excess[row]))
            if len(have):
                i = int(have[-1])
                out.append(self._finding(frame, trace, row, i, int(frame.times_ms[i])))
        return out

    def _finding(
        self,
        frame: Frame,
        trace: LatencyTrace,
        row: int,
        i: int,
        t_ms: int,
        end: int | None = None,
    ) -> Finding:
        ep = self.open_.episodes.get(frame.workloads.keys[row]) or Episode(t_ms, t_ms)
        alone = self._e2e_alone(row, ep)
        return latency_finding(self.name, self.limits_, frame, trace, (row, i, t_ms), ep, end,
                               e2e_alone=alone)  # fmt: skip

    def _e2e_alone(self, row: int, ep: Episode) -> bool:
        """An e2e workload whose service's ttft and inter-token latency have not regressed
        in this episode (``SERVING_PHASES``); False where there is nothing to compare with.
        Once one has, the episode pages to its end."""
        siblings = self._rows[1].serving.get(row) if self._rows is not None else None
        if not siblings or ep.extra.get("served_slow"):
            return False
        if any(k in self.open_.episodes for k in siblings):
            ep.extra["served_slow"] = True
            return False
        return True

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "base": self.base_.state_dict(),
            "season": self.season_.state_dict(),
            "cusum": self.cusum_.state_dict(),
            "workloads": self.wl_.state_dict(),
            "open": self.open_.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.base_.load_state_dict(state.get("base", {}))
        self.season_.load_state_dict(state.get("season", {}))
        self.cusum_.load_state_dict(state.get("cusum", {}))
        self.wl_.load_state_dict(state.get("workloads", {}))
        self.open_.load_state_dict(state.get("open", {}))
