"""The detection cycle: new samples from the store, through every detector, findings back.

Runs on a schedule (``DetectionSettings.interval_seconds``) over new data only: the store
hands over what was written since the last cycle (from memory, or from SQL after a
restart), the cycle lays it on a grid up to ``settle_seconds`` ago (later samples wait for
the next cycle, so a slow target is not "missing"), the detectors run in order, and their
findings and state go back to the store.  Detectors themselves do no I/O.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hbmwatch import log
from hbmwatch.detectors.base import Detector
from hbmwatch.detectors.frame import Frame
from hbmwatch.detectors.frame_builder import FrameBuilder
from hbmwatch.detectors.signals import WATCHED_METRICS, reads
from hbmwatch.records import Finding, SeriesKey
from hbmwatch.sharding import Shard
from hbmwatch.store.feed import RecentSamples, SampleBlock
from hbmwatch.store.store import Store, StoreUnavailable

logger = log.get("hbmwatch.runtime.detection")
STATE_PREFIX = "detector:"
RUNNER_STATE = "detection:runner"
WHOLE = Shard()


def partition_key(label: Callable[[str], str | None]) -> str:
    """What detector shards split by: a series' or finding's ``cluster/rack``.

    Every series carries its target's cluster and rack (the collector adds them), so a
    GPU's, its workloads' and its exporter's series all land in one shard.
    """
    return f"{label('cluster') or ''}/{label('rack') or ''}"


@dataclass
class CycleReport:
    start_ms: int = 0
    end_ms: int = 0
    samples: int = 0
    late: int = 0
    gpus: int = 0
    workloads: int = 0
    opened: list[Finding] = field(default_factory=list)
    closed: list[Finding] = field(default_factory=list)
    #: Every finding stated this cycle (latest statement of each), for alerting.
    findings: list[Finding] = field(default_factory=list)
    updated: int = 0
    seconds: float = 0.0
    detector_seconds: dict[str, float] = field(default_factory=dict)
    #: Where the cycle's time went: read, build (the frame), detect, record.
    stage_seconds: dict[str, float] = field(default_factory=dict)


class DetectionRunner:
    def __init__(
        self,
        store: Store,
        detectors: Sequence[Detector],
        *,
        step_seconds: float = 1.0,
        settle_seconds: float = 2.0,
        backfill_seconds: float = 600.0,
        state_every_seconds: float = 60.0,
        context: Any = None,
        clock: Callable[[], float] | None = None,
        shard: Shard = WHOLE,
        state_suffix: str = "",
        shared: bool = False,
    ) -> None:
        """``shard``: the racks this runner reads (by the hash of cluster/rack); the state
        of a runner with a ``state_suffix`` is kept apart from other runners' over the same
        store; ``shared``: other processes write the samples, so every cycle reads them back
        from the store by time rather than from this process' in-memory feed."""
        self.store = store
        self.detectors = list(detectors)
        self.shard = shard
        self.state_suffix = state_suffix
        # A store with no feed in memory (samples on a remote engine) is read back by time.
        self.shared = shared or not isinstance(getattr(store, "feed", None), RecentSamples)
        self._owned = np.zeros(0, dtype=np.int8)  # per series id: 0 unknown, 1 mine, 2 not
        self.step_ms = int(step_seconds * 1000)
        self.settle_ms = int(settle_seconds * 1000)
        self.backfill_ms = int(backfill_seconds * 1000)
        self.state_every_ms = int(state_every_seconds * 1000)
        self.context = context
        self.clock = clock or (lambda: store.now_ms() / 1000)
        self.builder = FrameBuilder(store.key_of)
        self.cursor: int | None = None
        self.frame_end_ms: int | None = None
        self.pending = SampleBlock.empty()
        self.open: dict[str, Finding] = {}
        self._saved_ms = 0
        self.last_frame: Frame | None = None
        #: Findings the store could not take yet (an outage), written with the next cycle's.
        self.unsaved: dict[str, Finding] = {}

    def start(self, watch: bool = True) -> None:
        """Watch the detectors' metrics (unless the caller watches for several runners) and
        load every detector's saved state and open findings."""
        if watch:
            self.store.watch(WATCHED_METRICS, wants=self.routed)
        runner = self.store.get_state(RUNNER_STATE + self.state_suffix) or {}
        self.frame_end_ms = runner.get("frame_end_ms")
        for det in self.detectors:
            state = self.store.get_state(STATE_PREFIX + det.name + self.state_suffix)
            if state:
                det.load_state_dict(state)
        mine = {d.name for d in self.detectors}
        stored = self.store.findings.query(open_only=True, limit=5000)
        self.open = {f.id: f for f in stored if f.detector in mine and self._entity_mine(f)}
        logger.info(
            "detectors ready",
            detectors=[d.name for d in self.detectors],
            resumed_from_ms=self.frame_end_ms,
            open_findings=len(self.open),
        )

    def routed(self, key: SeriesKey) -> bool:
        """Whether this runner reads the series: a frame needs it and its rack is ours."""
        return reads(key) and self.shard.owns(partition_key(key.label))

    def _entity_mine(self, f: Finding) -> bool:
        """An open finding of another shard's rack is not this runner's to carry on."""
        return self.shard.owns(partition_key(f.entity.get))

    def save_state(self) -> None:
        for det in self.detectors:
            self.store.put_state(STATE_PREFIX + det.name + self.state_suffix, det.state_dict())
        self.store.put_state(RUNNER_STATE + self.state_suffix, {"frame_end_ms": self.frame_end_ms})

    def cycle(self, now_ms: int | None = None) -> CycleReport:
        started = time.perf_counter()
        now = int(self.clock() * 1000) if now_ms is None else now_ms
        since = now - self.backfill_ms
        if self.frame_end_ms is not None:
            since = max(since, self.frame_end_ms - self.settle_ms)
        self.cursor, block = self._read(since)
        t_read = time.perf_counter()
        end = (now - self.settle_ms) // self.step_ms * self.step_ms
        report = CycleReport(samples=len(block))
        if len(block) == 0 or end <= (self.frame_end_ms or 0):
            self.pending = block
            return report
        start = self.frame_end_ms
        if start is None or start < since:
            start = int(block.timestamps_ms.min()) // self.step_ms * self.step_ms
        later = block.timestamps_ms >= end
        self.pending = SampleBlock(
            block.series_ids[later], block.timestamps_ms[later], block.values[later]
        )
        frame = self.builder.build(block, start, end, self.step_ms)
        t_build = time.perf_counter()
        frame.context = self.context
        self.last_frame = frame
        frame.open_findings = list(self.open.values())
        findings = self._detect(frame, report)
        if self.context is not None:
            self.context.append(frame)
        t_detect = time.perf_counter()
        self._record(findings, report)
        self.frame_end_ms = end
        if end - self._saved_ms >= self.state_every_ms:
            try:
                self.save_state()
                self._saved_ms = end
            except StoreUnavailable as exc:  # saved again at the next cycle that can
                logger.warning("detector state not saved: store unavailable", error=str(exc))
        report.start_ms, report.end_ms, report.late = start, end, frame.late
        report.gpus, report.workloads = len(frame.gpus), len(frame.workloads)
        report.seconds = time.perf_counter() - started
        report.stage_seconds = {
            "read": t_read - started, "build": t_build - t_read, "detect": t_detect - t_build,
            "record": started + report.seconds - t_detect,
        }  # fmt: skip
        return report

    def _read(self, since_ms: int) -> tuple[int, SampleBlock]:
        """The held samples followed by everything stored since the cursor.

        From the store's in-memory feed in one copy when the cursor is still in it (what
        ``Store.read_new`` does, less a second copy to put the held samples in front); else
        through ``read_new``, which reads the span back from SQL.  A shared runner reads
        from the end of its last frame on every cycle: the samples are other processes'.
        """
        if self.shared:
            since = since_ms if self.frame_end_ms is None else self.frame_end_ms
            cursor, block = self.store.read_new(None, since)
            return cursor, self._mine(block)
        feed = getattr(self.store, "feed", None)
        if self.cursor is not None and isinstance(feed, RecentSamples):
            block = feed.read(self.cursor, head=self.pending)
            if block is not None:
                return feed.next_seq, self._mine(block)
        cursor, block = self.store.read_new(self.cursor, since_ms)
        return cursor, self._mine(SampleBlock.concat([self.pending, block]))

    def _mine(self, block: SampleBlock) -> SampleBlock:
        """Only this runner's series, when the store watches for several runners."""
        if self.shard.whole or len(block) == 0:
            return block
        sids = block.series_ids
        top = int(sids.max()) + 1
        if top > len(self._owned):
            self._owned = np.concatenate([self._owned, np.zeros(top - len(self._owned), np.int8)])
        for sid in np.unique(sids[self._owned[sids] == 0]).tolist():
            key = self.store.key_of(sid)
            self._owned[sid] = 1 if key is not None and self.routed(key) else 2
        keep = self._owned[sids] == 1
        if keep.all():
            return block
        return SampleBlock(sids[keep], block.timestamps_ms[keep], block.values[keep])

    def _detect(self, frame: Frame, report: CycleReport) -> list[Finding]:
        """Every detector over the frame, in order, each seeing the findings open so far.

        In order on one thread: the detectors' per-step loops hold the GIL between their
        numpy calls, so thermal in a worker thread beside the others made the stage slower,
        not faster, once thermal was no longer most of it (docs/benchmarks.md).
        """
        findings: list[Finding] = []
        for det in self.detectors:
            t0 = time.perf_counter()
            out = det.update(frame)
            report.detector_seconds[det.name] = time.perf_counter() - t0
            findings += out
            frame.open_findings = self._merge(frame.open_findings, out)
        return findings

    def _keep_causes(self, f: Finding) -> Finding:
        """A restatement without causes keeps the ranking an earlier one carried.

        The detector that finds a regression does not rank its causes (root cause does,
        while it is open); its closing statement must not erase that ranking.
        """
        prev = self.open.get(f.id)
        if f.causes or prev is None or not prev.causes:
            return f
        return dataclasses.replace(f, causes=prev.causes)

    @staticmethod
    def _merge(current: list[Finding], new: list[Finding]) -> list[Finding]:
        merged = {f.id: f for f in current}
        for f in new:
            if f.open:
                merged[f.id] = f
            else:
                merged.pop(f.id, None)
        return list(merged.values())

    def _save_findings(self, latest: dict[str, Finding]) -> None:
        """Write this cycle's findings with any an outage held back; hold them if it goes on.

        The cycle itself carries on: its frame is done and the detectors have moved past
        it, so failing here would lose the findings rather than retry them.
        """
        self.unsaved.update(latest)
        try:
            self.store.findings.save(self.unsaved.values())
        except StoreUnavailable as exc:
            logger.warning("findings held until the store is back", findings=len(self.unsaved),
                           error=str(exc))  # fmt: skip
            return
        self.unsaved = {}

    def _record(self, findings: list[Finding], report: CycleReport) -> None:
        latest = {f.id: self._keep_causes(f) for f in findings}
        report.findings = list(latest.values())
        for f in latest.values():
            if f.id not in self.open and f.open:
                report.opened.append(f)
            elif not f.open:
                report.closed.append(f)
            else:
                report.updated += 1
            if f.open:
                self.open[f.id] = f
            else:
                self.open.pop(f.id, None)
        self._save_findings(latest)
        for f in report.opened:
            logger.info("finding opened", kind=f.kind, entity=dict(f.entity), summary=f.summary)
        for f in report.closed:
            logger.info("finding resolved", kind=f.kind, entity=dict(f.entity))
