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

The baseline works on log(p99) (latency is multiplicative): a robust level and trend
(``TrendBaseline``) on the series with its learned daily shape removed (``SeasonalProfile``),
so a morning ramp seen on earlier days is not a regression.  A one-sided CUSUM of the
standardised deviation decides the onset (a noisy service needs a larger or longer rise),
the effect size alone decides that it persists.  How long it must persist scales with the
effect: ``min_on_s`` (75 s, longer than the 60 s quantile window, so chance tail excursions
of a few requests do not page) up to ``fast_ratio`` (2x), shorter for larger ratios (3x:
20 s, 10x and more: ``min_hold_s``, 5 s), because a GPU captured cold showed real
regressions of 20-60 s (2.3 -> 7.7 ms, 2.4 -> 122 ms) that a fixed 75 s never saw;
``Hysteresis`` closes after ``min_off_s``.  While a regression is open (or a step meets the
effect size) the baseline learns at ``open_learn_rate`` only, so a long fault does not
become normal.

A workload seen for the first time has no baseline for ``warmup_s``.  From ``cold_min_s``
of its own data it is judged against that provisional level, with no CUSUM (its spread is
not known yet) and a larger effect (``cold_ratio``): a cold start under load pages a large
regression instead of learning it as normal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from detectors.base import EntityTable, Episode, Hysteresis, latest, make_finding
from detectors.frame import WORKLOAD_LABELS, Frame
from detectors.scorers import Cusum, SeasonalProfile, TrendBaseline, decay
from hbmwatch.records import Evidence, Finding, Severity
from hbmwatch.taxonomy import FindingKind

STEP_PHASE = "step"


class _Rows(NamedTuple):
    """A frame's workloads' rows in each state table, looked up once a frame."""

    base: np.ndarray
    season: np.ndarray
    cusum: np.ndarray
    wl: np.ndarray
    open: np.ndarray


@dataclass
class _Trace:
    """One frame's inputs and per-step results, (W, T) each, for the findings' evidence."""

    p99: np.ndarray
    p50: np.ndarray
    res: np.ndarray
    win: np.ndarray
    need: np.ndarray  # (W,): the request minimum of each workload
    excess: np.ndarray  # log(p99 / baseline p99), NaN in warm-up or without evidence
    base: np.ndarray  # baseline p99, seconds
    base50: np.ndarray  # baseline p50, seconds
    cusum: np.ndarray


class LatencyRegressions:
    """Sustained p99 regressions per workload, against a baseline that knows the day.

    Parameters: ``min_ratio`` (p99 over baseline to count; ``critical_ratio`` makes it
    critical), ``min_requests`` / ``min_steps`` (window observations below which a p99 is no
    evidence), ``resolution_factor`` (buckets the increase must exceed), ``cusum_k`` /
    ``cusum_h`` (CUSUM slack and decision level, in baseline scales), ``min_on_s`` (hold at
    ``min_ratio``), ``fast_ratio`` / ``hold_power`` / ``min_hold_s`` (past ``fast_ratio``
    the hold shrinks as ``(log fast_ratio / log ratio) ** hold_power``, not under
    ``min_hold_s``), ``min_off_s``, ``warmup_s``, ``cold_min_s`` / ``cold_ratio`` (the
    judgement while the baseline warms), ``level_half_life_s`` / ``trend_half_life_s`` /
    ``scale_half_life_s`` / ``min_scale`` (the log-p99 baseline), ``open_learn_rate``, and
    ``season_bins`` / ``season_period_s`` / ``season_half_life_days`` / ``season_min_days``
    (the daily profile).

    >>> import numpy as np
    >>> from detectors.frame import Entities, Frame
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
        self.base_ = TrendBaseline(
            level_half_life_s=self.level_half_life_s,
            trend_half_life_s=self.trend_half_life_s,
            scale_half_life_s=self.scale_half_life_s,
            min_scale=self.min_scale,
            warmup_s=self.warmup_s,
            clip=3.0,
        )
        self.season_ = SeasonalProfile(
            bins=self.season_bins,
            period_s=self.season_period_s,
            half_life_days=self.season_half_life_days,
            min_days=self.season_min_days,
        )
        self.cusum_ = Cusum(k=self.cusum_k, cap=2.0 * self.cusum_h)
        # slow_: log p99 averaged over a period (what the daily shape is relative to);
        # p50_: the log-p50 baseline; ready_: whether the daily shape was in use last step;
        # since_ / at_ / earned_: when the score last went over 1, its last step over 1, and
        # the share of the hold (which depends on the effect) earned since, so the
        # hysteresis itself opens at once.
        self.wl_ = EntityTable(
            {"slow_": np.nan, "p50_": np.nan, "ready_": 0.0, "since_": np.nan, "at_": np.nan,
             "earned_": 0.0}
        )  # fmt: skip
        self.open_ = Hysteresis(enter=1.0, exit=0.5, min_on_s=0.0, min_off_s=self.min_off_s)
        self._rows: tuple[list[str], _Rows] | None = None  # rows into the tables above

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
        rows = self._rows_for(frame.workloads.keys)
        base = self.base_.local(rows.base)  # the loop learns a copy, stored at the end
        findings: list[Finding] = []
        shape, shape_bin = np.zeros(n), -1
        scores = np.full((n, frame.steps), np.nan)
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            if self._bin(t_ms) != shape_bin:  # the shape is looked up once per bin a frame
                shape, shape_bin = self._daily_shape(rows, base, t_ms), self._bin(t_ms)
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

    def _rows_for(self, keys: list[str]) -> _Rows:
        """The workloads' rows in each state table, kept while the workloads stay the same."""
        if self._rows is None or self._rows[0] != keys:
            rows = _Rows(
                self.base_.rows(keys), self.season_.rows(keys), self.cusum_.rows(keys),
                self.wl_.rows(keys), self.open_.table.rows(keys),
            )  # fmt: skip
            self._rows = (list(keys), rows)
        return self._rows[1]

    def _inputs(self, frame: Frame) -> _Trace:
        n, steps = len(frame.workloads), frame.steps
        phases = [lab.get("phase", "") for lab in frame.workloads.labels]
        need = np.array(
            [self.min_steps if p == STEP_PHASE else self.min_requests for p in phases], float
        )
        empty = np.full((n, steps), np.nan)
        return _Trace(
            p99=frame.w("p99"), p50=frame.w("p50"), res=frame.w("res99"),
            win=frame.w("window_requests"), need=need, excess=empty.copy(),
            base=empty.copy(), base50=empty.copy(), cusum=empty.copy(),
        )  # fmt: skip

    def _step(
        self,
        rows: _Rows,
        base_state: dict[str, np.ndarray],
        trace: _Trace,
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
        dev = np.where(seen >= self.warmup_s, adj - pred, np.nan)
        cold = (seen < self.warmup_s) & (seen >= self.cold_min_s)
        judged = np.where(cold, adj - pred, dev)
        z = dev / self.base_.scale_local(base_state)
        cus = self.cusum_.update(rows.cusum, z)
        base = np.exp(pred + shape)
        score, effect = self._score(
            judged, cold, cus, (trace.p99[:, i], base, trace.res[:, i]), is_open
        )
        score = np.where(np.isnan(x), np.nan, np.nan_to_num(score, nan=0.0))  # warm-up: 0.0
        score = self._persist(rows, score, judged, is_open, t_ms)
        trace.excess[:, i] = judged
        trace.base[:, i] = np.where(np.isnan(judged), np.nan, base)
        trace.base50[:, i] = np.exp(self.wl_["p50_"][rows.wl])
        trace.cusum[:, i] = cus
        suspect = is_open | (np.nan_to_num(effect) >= 1.0)
        learn = np.where(suspect, self.open_learn_rate, 1.0)
        self.base_.learn_local(base_state, adj, t_ms, learn)
        self._learn_levels(rows, x, x50, t_ms, learn, dt_s)
        return score

    def _bin(self, t_ms: int) -> int:
        """The daily profile's bin at ``t_ms`` (as ``SeasonalProfile`` bins time)."""
        period = self.season_period_s
        return int((t_ms / 1000.0 % period) / period * self.season_bins)

    def _daily_shape(self, rows: _Rows, base_state: dict[str, np.ndarray], t_ms: int) -> np.ndarray:
        """The learned daily shape at ``t_ms`` (0 until learned), in log units."""
        shape = -self.season_.adjust(rows.season, np.zeros(len(rows.season)), t_ms)
        ready = self.season_.ready(rows.season)
        # When the shape first applies, move the level with it so the prediction stays put.
        starts = ready & (self.wl_["ready_"][rows.wl] == 0)
        if starts.any():
            base_state["level_"][starts] -= shape[starts]
        self.wl_["ready_"][rows.wl] = ready.astype(float)
        return shape

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

        ``min_on_s`` up to ``fast_ratio`` (chance tail excursions of a few requests reach
        1.5-2x); larger effects need less, down to ``min_hold_s``.

        >>> LatencyRegressions().hold_s(np.array([1.5, 2.0, 2.5, 3.0, 10.0])).round(1).tolist()
        [75.0, 75.0, 33.4, 19.7, 5.0]
        """
        with np.errstate(all="ignore"):
            part = np.log(self.fast_ratio) / np.log(np.fmax(ratio, self.fast_ratio))
            hold = self.min_on_s * np.nan_to_num(part, nan=1.0) ** self.hold_power
        return np.clip(hold, min(self.min_hold_s, self.min_on_s), self.min_on_s)

    def _persist(
        self,
        rows: _Rows,
        score: np.ndarray,
        dev: np.ndarray,
        is_open: np.ndarray,
        t_ms: int,
    ) -> np.ndarray:
        """The score, held under 1 until it has been over 1 for the hold its effect needs.

        Each second over 1 earns ``1 / hold_s(ratio)`` of the hold (the first step starts the
        clock; steps without data neither earn nor stop it, the next one earns the time
        since), so a constant effect pages after exactly ``hold_s`` and a varying one after
        the time its effects add up to.  Open workloads pass through: closing is hysteresis.
        The ratio is p99 over its baseline (``dev`` is its log): the bucket gate decides
        whether a rise counts, not how large it is, since vLLM's coarse buckets (2.5-5 s)
        read a 22x first-token p99 as under 2 buckets, which held it 75 s like a 1.9x one.
        """
        t, wrows = self.wl_, rows.wl
        since, at, earned = t["since_"][wrows], t["at_"][wrows], t["earned_"][wrows]
        known = ~np.isnan(score)
        over = known & (score >= 1.0) & ~is_open
        ratio = np.exp(np.fmax(np.nan_to_num(dev), 0.0))
        elapsed = np.nan_to_num((t_ms - at) / 1000.0)  # 0 on the first step over
        earned = np.where(over, earned + elapsed / self.hold_s(ratio), np.where(known, 0.0, earned))
        since = np.where(over, np.where(np.isnan(since), t_ms, since),
                         np.where(known, np.nan, since))  # fmt: skip
        at = np.where(over, t_ms, np.where(known, np.nan, at))
        t["since_"][wrows], t["at_"][wrows], t["earned_"][wrows] = since, at, earned
        waiting = over & (earned < 1.0 - 1e-9)
        return np.where(waiting, np.fmin(score, 0.999), score)

    def _learn_levels(
        self,
        rows: _Rows,
        x: np.ndarray,
        x50: np.ndarray,
        t_ms: int,
        learn: np.ndarray,
        dt_s: float,
    ) -> None:
        """The period-long level, the daily shape relative to it, and the p50 baseline."""
        t, wrows = self.wl_, rows.wl
        ok = ~np.isnan(x)
        slow = t["slow_"][wrows]
        a = decay(dt_s, self.season_period_s) * learn
        slow = np.where(ok, np.where(np.isnan(slow), x, slow + a * (x - slow)), slow)
        t["slow_"][wrows] = slow
        # The shape learns from every step: a fault recurring at one hour every day is
        # the daily pattern; one that did not recur is averaged over ``season_min_days``.
        self.season_.learn_one(rows.season, x - slow, t_ms, dt_s)
        p50 = t["p50_"][wrows]
        ok50 = ok & ~np.isnan(x50)
        b = decay(dt_s, self.level_half_life_s) * learn
        t["p50_"][wrows] = np.where(ok50, np.where(np.isnan(p50), x50, p50 + b * (x50 - p50)), p50)

    # -- findings ---------------------------------------------------------------------------
    def _decide(
        self,
        frame: Frame,
        trace: _Trace,
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

    def _refresh_open(self, frame: Frame, trace: _Trace) -> list[Finding]:
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
        self, frame: Frame, trace: _Trace, row: int, i: int, t_ms: int, end: int | None = None
    ) -> Finding:
        key = frame.workloads.keys[row]
        labels = frame.workloads.labels[row]
        ep = self.open_.episodes.get(key) or Episode(t_ms, t_ms)
        p99, base = _f(trace.p99[row, i]), _f(trace.base[row, i])
        ratio = p99 / base if base > 0 else 0.0
        ep.peak = max(ep.peak, ratio)
        p50, base50 = _f(trace.p50[row, i]), _f(trace.base50[row, i])
        r50 = p50 / base50 if base50 > 0 else float("nan")
        step = labels.get("phase") == STEP_PHASE
        what = "p99 step time" if step else "p99"
        summary = (
            f"{what} of {key} {ratio:.1f}x its baseline ({_secs(p99)} vs {_secs(base)}); "
            f"p50 {r50:.1f}x its baseline"
        )
        severity = Severity.CRITICAL if ep.peak >= self.critical_ratio else Severity.WARNING
        return make_finding(
            kind=FindingKind.STEP_TIME_REGRESSION if step else FindingKind.P99_REGRESSION,
            detector=self.name,
            entity={k: labels[k] for k in WORKLOAD_LABELS if k in labels},
            severity=severity,
            summary=summary,
            started_ms=ep.started_ms,
            raised_ms=ep.raised_ms,
            updated_ms=t_ms,
            ended_ms=end,
            evidence=self._evidence(frame, trace, key, row, i, ep, t_ms),
        )

    def _evidence(
        self, frame: Frame, trace: _Trace, key: str, row: int, i: int, ep: Episode, t_ms: int
    ) -> list[Evidence]:
        s99 = frame.series_of("wl", key, "p99")
        s50 = frame.series_of("wl", key, "p50")
        p99, base = _f(trace.p99[row, i]), _f(trace.base[row, i])
        p50, base50 = _f(trace.p50[row, i]), _f(trace.base50[row, i])
        res = _f(trace.res[row, i])
        span = (ep.started_ms, t_ms)
        tail = p99 / p50 if p50 > 0 else float("nan")
        usual = base / base50 if base50 > 0 else float("nan")
        return [
            Evidence(s99, "p99_over_baseline_ratio", p99 / base if base > 0 else 0.0,
                     self.min_ratio, *span, note=f"peak {ep.peak:.2f}x"),
            Evidence(s99, "p99_seconds", p99, base * self.min_ratio, *span,
                     note=f"baseline {base:.3g} s"),
            Evidence(s99, "p99_increase_seconds", p99 - base,
                     self.resolution_factor * res if res > 0 else None, *span,
                     note=f"histogram bucket resolution {res:.3g} s"),
            Evidence(s50, "p50_seconds", p50, None, *span,
                     note=f"baseline {base50:.3g} s"),
            Evidence(s99, "p99_over_p50_ratio", tail, None, *span,
                     note=f"usually {usual:.2f}"),
            Evidence(frame.series_of("wl", key, "window_requests"), "window_requests",
                     _f(trace.win[row, i]), float(trace.need[row]), *span),
            Evidence(s99, "cusum_of_standardised_log_p99", _f(trace.cusum[row, i]),
                     self.cusum_h, *span),
        ]  # fmt: skip

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


def _f(value: float) -> float:
    return float(np.nan_to_num(value))


def _secs(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"
