"""Whose heat is it: one GPU's, its rack's (``cooling``) or the room's (``ambient``)?

Root cause names heat from what the context ring shows, not only from the thermal findings
open at the time: when most of a rack's GPUs rise over their load-adjusted baselines
together, the rack's cooling explains each of them better than any one GPU's ``thermal``
(a coolant loss once ranked per-GPU ``thermal`` "its rack's other GPUs do not" first while
the whole rack warmed).  When several racks of a cluster rise together, it is the room.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from hbmwatch.detectors.base import quiet_nan
from hbmwatch.records import Evidence
from hbmwatch.taxonomy import Cause

RISE_C = 2.5  # a GPU has risen when its load-adjusted rise grew this much (C)
SHARE = 0.6  # ... and a rack has when this share of its GPUs did
RECENT_MS = 60_000  # the rise is read over the last minute of the window


@dataclass(frozen=True)
class Scope:
    """A rack- or cluster-wide rise: the cause, where it is and the evidence for it."""

    cause: Cause
    entity: dict[str, str]
    evidence: Evidence
    summary: str


def heat_scope(ctx: Any, key: str, span: tuple[int, int, int, int]) -> Scope | None:
    """The rack or room rise that ``key``'s GPU is part of, or None when it rises alone.

    ``span`` is (baseline start, baseline end, regression start, now) in ms.
    """
    lo, cut, start, now = span
    labels = ctx.gpu_labels.get(key)
    if not labels:
        return None
    cluster, rack = labels.get("cluster", ""), labels.get("rack", "")
    racks: dict[str, list[str]] = defaultdict(list)
    for k, lab in ctx.gpu_labels.items():
        if lab.get("cluster", "") == cluster:
            racks[lab.get("rack", "")].append(k)
    if len(racks[rack]) < 2:
        return None
    risen = {r: _risen(ctx, keys, (lo, cut, now)) for r, keys in racks.items()}
    mine = risen[rack]
    if key not in mine.risen or mine.share < SHARE:
        return None
    warm = [r for r, got in risen.items() if got.share >= SHARE and len(racks[r]) >= 2]
    room = len(warm) >= 2 and len(warm) * 2 >= len(racks)
    cause = Cause.AMBIENT if room else Cause.COOLING
    entity = {"cluster": cluster} if room else {"cluster": cluster, "rack": rack}
    where = f"{len(warm)} of {len(racks)} racks of {cluster}" if room else f"rack {rack}"
    onset = mine.onset_ms
    lead = (start - onset) / 1000.0 if onset is not None else None
    ev = Evidence(
        series=f'load-adjusted rise of gpu_memory_temperature_celsius{{cluster="{cluster}",'
        f'rack="{rack}"}} ({len(mine.risen)} of {len(racks[rack])} GPUs)',
        statistic=f"share of the rack's GPUs risen {RISE_C:g} C over the baseline before",
        value=round(mine.share, 3),
        threshold=SHARE,
        window_start_ms=cut,
        window_end_ms=now,
        lag_seconds=lead,
        strength=round(min(1.0, mine.median_rise / (2 * RISE_C)), 3),
        note=_lead_note(lead),
    )
    summary = (
        f"{where}: {len(mine.risen)} of {len(racks[rack])} GPUs of rack {rack} rose together "
        f"(median +{mine.median_rise:.1f} C over their load-adjusted baselines)"
    )
    return Scope(cause, entity, ev, summary)


def _lead_note(lead: float | None) -> str:
    if lead is None:
        return ""
    when = "before" if lead >= 0 else "after"
    return f"the rack rose {abs(lead):.0f} s {when} the regression"


@dataclass(frozen=True)
class _Rise:
    risen: frozenset[str]
    share: float
    median_rise: float
    onset_ms: int | None


def _risen(ctx: Any, keys: list[str], span: tuple[int, int, int]) -> _Rise:
    """Which GPUs of one rack rose over the last minute against the baseline window."""
    lo, cut, now = span
    keys = [k for k in keys if k in ctx.gpus.index]
    times, values = ctx.window("gpu", keys, "thermal_rise", lo, now)
    if values.size == 0:
        return _Rise(frozenset(), 0.0, 0.0, None)
    base = np.nan_to_num(quiet_nan(np.nanmean, values[:, times < cut], axis=1))
    recent = quiet_nan(np.nanmean, values[:, times >= now - RECENT_MS], axis=1)
    rise = recent - base
    ok = ~np.isnan(rise)
    if not ok.any():
        return _Rise(frozenset(), 0.0, 0.0, None)
    up = ok & (rise >= RISE_C)
    mean = quiet_nan(np.nanmean, values - base[:, None], axis=0)
    hits = np.flatnonzero(np.nan_to_num(mean) >= RISE_C / 2)
    return _Rise(
        frozenset(k for k, u in zip(keys, up, strict=True) if u),
        float(up.sum() / ok.sum()),
        float(np.median(rise[ok])),
        int(times[hits[0]]) if len(hits) else None,
    )
