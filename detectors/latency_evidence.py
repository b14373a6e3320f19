"""A latency regression as a finding: its summary, severity and the evidence behind it.

Why its own module: what on-call reads (p99 and p50 against their baselines, the bucket
resolution, how many requests the window held, the CUSUM) is one concern, apart from how
the detector decides; each statistic names its series, threshold and window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmwatch.detectors.base import Episode, make_finding
from hbmwatch.detectors.frame import WORKLOAD_LABELS, Frame
from hbmwatch.records import Evidence, Finding, Severity
from hbmwatch.taxonomy import FindingKind

STEP_PHASE = "step"
E2E_PHASE = "e2e"
#: The phases that time the GPU's own work.  A request's e2e is its first token plus its
#: output length times the time per token: an e2e p99 that rises while neither of these
#: does is longer answers (what users asked for), not slower serving, and does not page.
SERVING_PHASES = ("ttft", "inter_token")


@dataclass
class LatencyTrace:
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
    peers: np.ndarray  # how many warm peers the baseline is the median of (0: its own)


@dataclass(frozen=True)
class Thresholds:
    """The detector's thresholds, as its evidence states them."""

    min_ratio: float
    critical_ratio: float
    resolution_factor: float
    cusum_h: float


def latency_finding(
    detector: str,
    limits: Thresholds,
    frame: Frame,
    trace: LatencyTrace,
    at: tuple[int, int, int],
    ep: Episode,
    end: int | None = None,
    *,
    e2e_alone: bool = False,
) -> Finding:
    """The finding of workload row ``at[0]``, stated at step ``at[1]`` (time ``at[2]``);
    ``e2e_alone``: an e2e regression whose service's ttft and inter-token p99 are steady
    (info: see ``SERVING_PHASES``)."""
    row, i, t_ms = at
    key = frame.workloads.keys[row]
    labels = frame.workloads.labels[row]
    p99, base = _f(trace.p99[row, i]), _f(trace.base[row, i])
    ratio = p99 / base if base > 0 else 0.0
    ep.peak = max(ep.peak, ratio)
    p50, base50 = _f(trace.p50[row, i]), _f(trace.base50[row, i])
    r50 = p50 / base50 if base50 > 0 else float("nan")
    step = labels.get("phase") == STEP_PHASE
    what = "p99 step time" if step else "p99"
    now = f"{ratio:.1f}x its baseline ({_secs(p99)} vs {_secs(base)})"
    if ratio < ep.peak / 1.25:  # easing off: the figure a reader acts on is the peak
        now = f"peaked {ep.peak:.1f}x its baseline, now {now}"
    summary = f"{what} of {key} {now}; p50 {r50:.1f}x its baseline"
    severity = Severity.CRITICAL if ep.peak >= limits.critical_ratio else Severity.WARNING
    if e2e_alone:
        summary += "; its ttft and inter-token p99 are steady: longer answers, not slower serving"
        severity = Severity.INFO
    return make_finding(
        kind=FindingKind.STEP_TIME_REGRESSION if step else FindingKind.P99_REGRESSION,
        detector=detector,
        entity={k: labels[k] for k in WORKLOAD_LABELS if k in labels},
        severity=severity,
        summary=summary,
        started_ms=ep.started_ms,
        raised_ms=ep.raised_ms,
        updated_ms=t_ms,
        ended_ms=end,
        evidence=_evidence(limits, frame, trace, at, ep),
    )


def _evidence(
    limits: Thresholds,
    frame: Frame,
    trace: LatencyTrace,
    at: tuple[int, int, int],
    ep: Episode,
) -> list[Evidence]:
    row, i, t_ms = at
    key = frame.workloads.keys[row]
    s99 = frame.series_of("wl", key, "p99")
    s50 = frame.series_of("wl", key, "p50")
    p99, base = _f(trace.p99[row, i]), _f(trace.base[row, i])
    p50, base50 = _f(trace.p50[row, i]), _f(trace.base50[row, i])
    res = _f(trace.res[row, i])
    span = (ep.started_ms, t_ms)
    tail = p99 / p50 if p50 > 0 else float("nan")
    usual = base / base50 if base50 > 0 else float("nan")
    peers = int(trace.peers[row, i])
    whose = f", the median of {peers} warm peers' (its own still warms)" if peers else ""
    return [
        Evidence(s99, "p99_over_baseline_ratio", p99 / base if base > 0 else 0.0,
                 limits.min_ratio, *span, note=f"peak {ep.peak:.2f}x"),
        Evidence(s99, "p99_seconds", p99, base * limits.min_ratio, *span,
                 note=f"baseline {base:.3g} s{whose}"),
        Evidence(s99, "p99_increase_seconds", p99 - base,
                 limits.resolution_factor * res if res > 0 else None, *span,
                 note=f"histogram bucket resolution {res:.3g} s"),
        Evidence(s50, "p50_seconds", p50, None, *span,
                 note=f"baseline {base50:.3g} s"),
        Evidence(s99, "p99_over_p50_ratio", tail, None, *span,
                 note=f"usually {usual:.2f}"),
        Evidence(frame.series_of("wl", key, "window_requests"), "window_requests",
                 _f(trace.win[row, i]), float(trace.need[row]), *span),
        Evidence(s99, "cusum_of_standardised_log_p99", _f(trace.cusum[row, i]),
                 limits.cusum_h, *span),
    ]  # fmt: skip


def _f(value: float) -> float:
    return float(np.nan_to_num(value))


def _secs(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"
