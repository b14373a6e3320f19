"""Device-level causes a regression can have: PCIe / fabric link errors (and throttling).

``LinkErrors`` works as ``Throttling`` does (``detectors/throttle.py``, re-exported here):
vectorised over GPUs, one loop over the frame's time steps, a per-entity level smoothed by
the time between samples, ``Hysteresis`` with minimum durations, and each update clipped at
a few times its threshold so one scrape with a thousand replays cannot open a finding.

Uncorrectable ECC errors (``ecc_uncorrectable``) are not reported here: the taxonomy has no
kind for them yet, and forcing them under ``pcie_errors`` would mislead the correlation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from hbmwatch.detectors.base import (
    EntityTable,
    Episode,
    Hysteresis,
    SparseGate,
    latest,
    make_finding,
    quiet_nan,
)
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.scorers import decay
from hbmwatch.detectors.throttle import THROTTLE_GROUPS, Throttling, _dt_s, _entity
from hbmwatch.records import Evidence, Finding, RankedCause, Severity
from hbmwatch.taxonomy import Cause, FindingKind

__all__ = ["CHANNELS", "THROTTLE_GROUPS", "LinkErrors", "Throttling"]


#: Error channels: the frame signal, and which finding it belongs to.
CHANNELS: tuple[tuple[str, str], ...] = (
    ("pcie_replays", "pcie"),
    ("pcie_recoveries", "pcie"),
    ("fabric_errors", "fabric"),
)


class LinkErrors:
    """PCIe replays / recoveries and fabric link errors far over a GPU's own baseline.

    Why: a replay storm or a degrading fabric link (CRC errors, retrains) slows transfers and
    collectives without heating anything, so it is a non-thermal cause the correlation must
    be able to name.  Per GPU and channel the error rate (per second, across scrape gaps) is
    smoothed with a half-life of ``half_life_s``; a channel is over when its rate is at least
    its absolute floor (``pcie_floor_per_s`` for replays, ``recovery_floor_per_s`` for link
    recoveries, ``fabric_floor_per_s`` for fabric errors) *and* at least ``ratio`` times the
    GPU's own long-run rate (half-life ``baseline_half_life_s``, learned while no finding is
    open), for ``min_on_s``.  PCIe findings have kind ``pcie_errors`` (cause ``pcie``); fabric
    findings ``fabric_errors`` (cause ``fabric``), with the ``link`` in the entity when one link
    carries at least ``link_share`` of the GPU's recent fabric errors.

    >>> import numpy as np
    >>> from hbmwatch.detectors.frame import Entities, Frame
    >>> def frame(t0, replays):
    ...     gpus = Entities()
    ...     gpus.add("c/h/0", {"cluster": "c", "rack": "r", "host": "h", "gpu": "0"})
    ...     n = len(replays)
    ...     f = Frame(t0, 1000, n, gpus, Entities(), Entities(), {}, np.full((1, 8, n), np.nan),
    ...               {}, {}, {}, {}, {})
    ...     f.gpu["pcie_replays"] = np.array([replays], dtype=float)
    ...     return f
    >>> rng = np.random.default_rng(0)
    >>> det = LinkErrors()
    >>> det.update(frame(0, rng.poisson(0.2, 60)))
    []
    >>> [f"{f.kind} {f.top_cause}" for f in det.update(frame(60_000, rng.poisson(400, 30)))]
    ['pcie_errors pcie']
    """

    name = "links"

    def __init__(
        self,
        *,
        pcie_floor_per_s: float = 5.0,
        recovery_floor_per_s: float = 0.1,
        fabric_floor_per_s: float = 1.0,
        ratio: float = 10.0,
        link_share: float = 0.6,
        min_on_s: float = 10.0,
        min_off_s: float = 30.0,
        exit_ratio: float = 0.5,
        half_life_s: float = 5.0,
        baseline_half_life_s: float = 3600.0,
    ) -> None:
        self.pcie_floor_per_s = pcie_floor_per_s
        self.recovery_floor_per_s = recovery_floor_per_s
        self.fabric_floor_per_s = fabric_floor_per_s
        self.ratio = ratio
        self.link_share = link_share
        self.min_on_s = min_on_s
        self.min_off_s = min_off_s
        self.exit_ratio = exit_ratio
        self.half_life_s = half_life_s
        self.baseline_half_life_s = baseline_half_life_s
        self._init_state()

    def _init_state(self) -> None:
        self.rates_ = EntityTable({"level_": 0.0, "rate_": 0.0, "base_": 0.0, "last_ms_": np.nan})
        #: GPU key -> link -> fabric errors, decayed with ``half_life_s`` x 60.
        self.links_: dict[str, dict[str, float]] = {}
        self.open_ = Hysteresis(
            enter=1.0, exit=self.exit_ratio, min_on_s=self.min_on_s, min_off_s=self.min_off_s
        )

    def _floors(self) -> np.ndarray:
        return np.array([self.pcie_floor_per_s, self.recovery_floor_per_s, self.fabric_floor_per_s])

    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        if self.ratio <= 0 or min(self._floors()) <= 0:
            raise ValueError("ratio and the floors must be positive")
        self._learn_links(frame)
        x = np.stack([frame.g(sig) for sig, _ in CHANNELS], axis=1)  # (G, 3, T)
        ckeys = [f"{g}#{sig}" for g in frame.gpus.keys for sig, _ in CHANNELS]
        rows = self.rates_.rows(ckeys)
        keys = [f"{g}#{k}" for g in frame.gpus.keys for k in ("pcie", "fabric")]
        floors = np.tile(self._floors(), n)
        step_s = frame.step_ms / 1000.0
        gate = SparseGate(self.open_, keys)
        r = self.rates_
        level, rate, base, last = (r[f][rows] for f in ("level_", "rate_", "base_", "last_ms_"))
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            inc = x[:, :, i].ravel()
            known = ~np.isnan(inc)
            dt = _dt_s(last, t_ms, step_s)
            inst = np.fmax(np.nan_to_num(inc), 0.0) / dt
            a = decay(dt, self.half_life_s)
            threshold = np.fmax(floors, self.ratio * base)
            level = np.where(known, level + a * (np.minimum(inst, 3 * threshold) - level), level)
            rate = np.where(known, rate + a * (inst - rate), rate)
            score = np.where(known, level / threshold, np.nan)
            is_open = np.repeat(gate.open.reshape(n, 2), [2, 1], axis=1).ravel()
            w = decay(dt, self.baseline_half_life_s) * np.where(is_open, 0.05, 1.0)
            base = np.where(known, base + w * (np.minimum(inst, floors) - base), base)
            last = np.where(known, t_ms, last)
            per_gpu = score.reshape(n, 3)
            pcie = quiet_nan(np.nanmax, per_gpu[:, :2], axis=1)
            opened, closed = gate.step(np.stack([pcie, per_gpu[:, 2]], axis=1).ravel(), t_ms)
            if not (opened or closed):
                continue
            r["level_"][rows], r["rate_"][rows], r["base_"][rows] = level, rate, base
            r["last_ms_"][rows] = last
            for key in opened:
                start = int(self.open_.over_since(key))
                self.open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
                if key.endswith("#fabric"):
                    link = self._dominant_link(key.rsplit("#", 1)[0])
                    self.open_.episodes[key].extra["link"] = link
            findings += [self._finding(frame, k, t_ms) for k in opened]
            findings += [self._finding(frame, k, t_ms, end=t_ms) for k in closed]
            for key in closed:
                self.open_.episodes.pop(key, None)
        r["level_"][rows], r["rate_"][rows], r["base_"][rows] = level, rate, base
        r["last_ms_"][rows] = last
        end_ms = int(frame.times_ms[-1])
        present = set(frame.gpus.keys)
        findings += [
            self._finding(frame, k, end_ms)
            for k in self.open_.episodes
            if k.rsplit("#", 1)[0] in present
        ]
        return latest(findings)

    def _learn_links(self, frame: Frame) -> None:
        keep = 1.0 - float(decay(frame.steps * frame.step_ms / 1000.0, 60 * self.half_life_s))
        for gkey, links in list(self.links_.items()):
            decayed = {k: v * keep for k, v in links.items() if v * keep >= 0.5}
            if decayed:
                self.links_[gkey] = decayed
            else:
                del self.links_[gkey]
        for gkey, links in frame.link_errors.items():
            mine = self.links_.setdefault(gkey, {})
            for link, errors in links.items():
                mine[link] = mine.get(link, 0.0) + float(errors)

    def _dominant_link(self, gkey: str) -> str:
        links = {k: v for k, v in self.links_.get(gkey, {}).items() if k != "all"}
        total = sum(self.links_.get(gkey, {}).values())
        if not links or total <= 0:
            return ""
        link, errors = max(links.items(), key=lambda kv: kv[1])
        return link if errors / total >= self.link_share else ""

    def _finding(self, frame: Frame, key: str, t_ms: int, end: int | None = None) -> Finding:
        gkey, what = key.rsplit("#", 1)
        grow = frame.gpus.index[gkey]
        ep = self.open_.episodes.get(key) or Episode(t_ms, t_ms)
        signals = ("pcie_replays", "pcie_recoveries") if what == "pcie" else ("fabric_errors",)
        floors = dict(zip((s for s, _ in CHANNELS), self._floors().tolist(), strict=True))
        link = str(ep.extra.get("link", ""))
        evidence, worst = [], 0.0
        for sig in signals:
            row = self.rates_.index[f"{gkey}#{sig}"]
            rate, base = float(self.rates_["rate_"][row]), float(self.rates_["base_"][row])
            threshold = max(floors[sig], self.ratio * base)
            series = frame.series_of("gpu", gkey, sig)
            if link:
                series = _with_link(series, link)
            evidence.append(
                Evidence(series, "errors_per_second", rate, threshold, ep.started_ms, t_ms,
                         note=f"own baseline {base:.3g}/s, floor {floors[sig]:g}/s")
            )  # fmt: skip
            worst = max(worst, rate)
        ep.peak = max(ep.peak, worst)
        if what == "pcie":
            kind, cause = FindingKind.PCIE_ERRORS, Cause.PCIE
            summary = f"PCIe replays/recoveries at {worst:.3g}/s (peak {ep.peak:.3g}/s)"
        else:
            kind, cause = FindingKind.FABRIC_ERRORS, Cause.FABRIC
            where = f" on link {link}" if link else ""
            summary = f"fabric errors{where} at {worst:.3g}/s (peak {ep.peak:.3g}/s)"
            if frame.link_errors.get(gkey):
                per_link = ", ".join(
                    f"{k}: {v:g}" for k, v in sorted(frame.link_errors[gkey].items())
                )
                evidence.append(
                    Evidence(series, "errors_per_link_in_frame", float(sum(
                        frame.link_errors[gkey].values())), None, frame.start_ms, frame.end_ms,
                        note=per_link)
                )  # fmt: skip
        entity = _entity(frame, grow, **({"link": link} if link else {}))
        return make_finding(
            kind=kind, detector=self.name, entity=entity, severity=Severity.WARNING,
            summary=summary, started_ms=ep.started_ms, raised_ms=ep.raised_ms, updated_ms=t_ms,
            ended_ms=end, evidence=evidence,
            causes=[RankedCause(cause, 0.9, summary=f"{what} error rate over its own baseline")],
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {
            "rates": self.rates_.state_dict(),
            "links": {g: dict(v) for g, v in self.links_.items()},
            "open": self.open_.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._init_state()
        self.rates_.load_state_dict(state.get("rates", {}))
        self.links_ = {
            g: {k: float(v) for k, v in links.items()}
            for g, links in state.get("links", {}).items()
        }
        self.open_.load_state_dict(state.get("open", {}))


def _with_link(series: str, link: str) -> str:
    """The same series text naming ``link`` (the frame keeps one series per signal)."""
    if 'link="' in series:
        return re.sub(r'link="[^"]*"', f'link="{link}"', series)
    if series.endswith("}"):
        body = series[series.index("{") + 1 : -1]
        return f'{series[: series.index("{")]}{{{body + "," if body else ""}link="{link}"}}'
    return f'{series}{{link="{link}"}}'
