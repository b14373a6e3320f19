"""Data quality of a scrape target: down, or sending "not supported" sentinels.

Why apart from the detector (``detectors/quality.py``): both checks read the collector's
own per-target series (``up`` and dropped sentinels), not the GPU's, and carry the
start-up rule that a target which has never answered is "not yet up" rather than down.
"""

from __future__ import annotations

import numpy as np

from hbmwatch.detectors.base import EntityTable, Episode
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.quality_sensors import CheckReport
from hbmwatch.records import Evidence, Severity
from hbmwatch.taxonomy import Cause

TARGET_ENTITY = ("cluster", "rack", "host", "target", "source")


class TargetChecks:
    """The ``target_down`` and ``sentinel`` checks of ``DataQuality``, as a mixin over its
    settings and its ``targets_`` table."""

    min_down_scrapes: int
    first_up_grace_s: float
    sentinel_min_scrapes: int
    sentinel_quiet_s: float
    sentinel_sustained_s: float
    targets_: EntityTable

    def _target_step(
        self, s: dict[str, np.ndarray], up: np.ndarray, sentinel: np.ndarray, t_ms: int
    ) -> list[np.ndarray]:
        known = ~np.isnan(up)
        down = known & (up < 0.5)
        run = np.where(down, s["down_run_"] + 1, np.where(known, 0.0, s["down_run_"]))
        first = down & (run == 1)
        s["down_since_ms_"] = np.where(
            first, t_ms, np.where(known & ~down, np.nan, s["down_since_ms_"])
        )
        s["down_run_"] = run
        # Not yet up: never answered and still within its grace; no data as far as the gate goes.
        s["first_ms_"] = np.where(known & np.isnan(s["first_ms_"]), t_ms, s["first_ms_"])
        s["ever_up_"] = np.where(known & ~down, 1.0, s["ever_up_"])
        waiting = (s["ever_up_"] == 0) & (t_ms - s["first_ms_"] < self.first_up_grace_s * 1000)
        down_score = np.where(known & ~waiting, run / self.min_down_scrapes, np.nan)
        # Sentinels: an episode is a run of scrapes with drops, each within the quiet time.
        dropped = ~np.isnan(sentinel) & (sentinel > 0)
        last = s["last_drop_ms_"]
        with np.errstate(invalid="ignore"):
            quiet = np.isnan(last) | (t_ms - last >= self.sentinel_quiet_s * 1000)
        drops = s["drops_"] = np.where(quiet, 0.0, s["drops_"]) + dropped
        s["dropped_"] = np.where(quiet, 0.0, s["dropped_"]) + np.where(dropped, sentinel, 0.0)
        s["drop_since_ms_"] = np.where(dropped & quiet, t_ms, s["drop_since_ms_"])
        s["last_drop_ms_"] = np.where(dropped, t_ms, last)
        return [down_score, drops / self.sentinel_min_scrapes]

    def _target_down_report(self, frame: Frame, ekey: str, ep: Episode, t_ms: int) -> CheckReport:
        start = ep.started_ms
        row = self.targets_.index[ekey]
        ep.peak = max(ep.peak, float(self.targets_["down_run_"][row]))
        run = ep.peak
        evidence = [
            Evidence(frame.series_of("tgt", ekey, "up"), "consecutive_down_scrapes", run,
                     float(self.min_down_scrapes), start, t_ms),
        ]  # fmt: skip
        summary = f"target {ekey} down for {(t_ms - start) / 1000:.0f} s ({run:.0f} scrapes)"
        return CheckReport(evidence, summary, target_entity(frame, ekey), cause=Cause.TARGET_DOWN)

    def _sentinel_report(self, frame: Frame, ekey: str, ep: Episode, t_ms: int) -> CheckReport:
        start = ep.started_ms
        row = self.targets_.index[ekey]
        ep.peak = max(ep.peak, float(self.targets_["drops_"][row]))
        ep.extra["dropped"] = max(
            ep.extra.get("dropped", 0.0), float(self.targets_["dropped_"][row])
        )
        drops, dropped = ep.peak, ep.extra["dropped"]
        lasted = (t_ms - start) / 1000.0
        sustained = lasted >= self.sentinel_sustained_s
        severity = Severity.WARNING if sustained else Severity.INFO
        evidence = [
            Evidence(frame.series_of("tgt", ekey, "sentinel"), "scrapes_with_sentinels",
                     drops, float(self.sentinel_min_scrapes), start, t_ms,
                     note=f"{dropped:g} sentinel values dropped"),
            Evidence(frame.series_of("tgt", ekey, "sentinel"), "sentinels_lasted_s", lasted,
                     self.sentinel_sustained_s, start, t_ms),
        ]  # fmt: skip
        summary = f"target {ekey} sends 'not supported' sentinels ({dropped:g} dropped)"
        return CheckReport(evidence, summary, target_entity(frame, ekey), severity=severity)


def target_entity(frame: Frame, tkey: str) -> dict[str, str]:
    row = frame.targets.index.get(tkey)
    labels = frame.targets.labels[row] if row is not None else {}
    out = {k: labels[k] for k in TARGET_ENTITY if labels.get(k)}
    out["target"] = tkey
    return out
