"""A frame: new samples laid out on a time grid, one row per GPU, workload and target.

Detectors never see series ids or label sets: ``FrameBuilder`` (``detectors/frame_builder.py``)
routes each canonical series to an entity row and a signal once (cached by series id), turns
counters into increments per step (across resets and 32/64-bit wraps, remembering each
counter's last value between frames), and scatters everything onto a grid of ``step_ms``.
A missing value is NaN.  The signals and the series behind them are in
``detectors/signals.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hbmwatch.detectors.signals import SIGNAL_CODE, SIGNAL_METRIC, SIGNALS
from hbmwatch.records import Finding

#: The labels each table's entities keep.
GPU_LABELS = ("cluster", "rack", "host", "gpu", "sku", "vendor")
WORKLOAD_LABELS = ("cluster", "rack", "host", "gpu", "partition", "service", "model", "phase")
TARGET_LABELS = ("cluster", "rack", "host", "target", "source")
TABLES = ("gpu", "wl", "tgt")
TABLE_LABELS = (GPU_LABELS, WORKLOAD_LABELS, TARGET_LABELS)


@dataclass
class Entities:
    keys: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, labels: Mapping[str, str]) -> int:
        row = self.index.get(key)
        if row is None:
            row = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.labels.append(dict(labels))
        return row

    def __len__(self) -> int:
        return len(self.keys)


class SeriesIndex(MutableMapping[tuple[str, str, str], str]):
    """``(table, key, signal) -> series text``, looked up when asked.

    A frame has ~70k of them and evidence needs a handful, so the builder hands over each
    table's (row, signal) -> slot matrix instead of building a dict of strings every cycle.
    Entries set by hand (tests, other builders) sit in front of it.
    """

    def __init__(self, entities: Mapping[str, Entities], slots: Mapping[str, np.ndarray],
                 texts: list[str]) -> None:  # fmt: skip
        self._entities, self._slots, self._texts = entities, slots, texts
        self._extra: dict[tuple[str, str, str], str] = {}

    def __getitem__(self, key: tuple[str, str, str]) -> str:
        if key in self._extra:
            return self._extra[key]
        table, entity, signal = key
        ents, slots = self._entities.get(table), self._slots.get(table)
        row = ents.index.get(entity) if ents is not None else None
        code = SIGNAL_CODE.get(signal)
        if row is None or code is None or slots is None or slots[row, code] < 0:
            raise KeyError(key)
        return self._texts[int(slots[row, code])]

    def __setitem__(self, key: tuple[str, str, str], value: str) -> None:
        self._extra[key] = value

    def __delitem__(self, key: tuple[str, str, str]) -> None:
        del self._extra[key]

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        yield from self._extra
        for table, slots in self._slots.items():
            keys = self._entities[table].keys
            for row, code in zip(*np.nonzero(slots >= 0), strict=True):
                key = (table, keys[row], SIGNALS[code])
                if key not in self._extra:
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class RawSeries:
    """One series' own samples in the frame, in time order, at their own timestamps.

    For the metrics read raw (``signals.RAW_METRICS``): a grid would repeat or merge
    samples of a series whose rate has nothing to do with the detection step.
    """

    key: str  # the series text, its identity
    labels: dict[str, str]
    t_ms: np.ndarray  # int64, ascending
    values: np.ndarray  # float, finite


@dataclass
class Frame:
    """Signals on a grid: ``times_ms[i]`` is the start of step i, ``[t, t + step)``."""

    start_ms: int
    step_ms: int
    steps: int
    gpus: Entities
    workloads: Entities
    targets: Entities
    gpu: dict[str, np.ndarray]  # (G, T)
    stacks: np.ndarray  # (G, MAX_STACKS, T)
    wl: dict[str, np.ndarray]  # (W, T)
    tgt: dict[str, np.ndarray]  # (N, T)
    series: MutableMapping[tuple[str, str, str], str]  # (table, key, signal) -> series text
    resets: dict[str, int]  # GPU key -> counter resets seen in this frame
    link_errors: dict[str, dict[str, float]]  # GPU key -> link -> errors in this frame
    late: int = 0
    #: GPU key -> error code (``xid:79``) -> events in this frame (``detectors/gpu_errors.py``).
    gpu_errors: dict[str, dict[str, float]] = field(default_factory=dict)
    #: What earlier detectors computed for later ones (per GPU, (G, T)), this cycle only.
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    #: Findings open after the detectors that ran before, for correlation.
    open_findings: list[Finding] = field(default_factory=list)
    context: Any = None  # detectors.context.Context, set by the runner
    #: Each detector's score per entity and step (1.0 = at its threshold), for score-file.
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    #: The raw series' samples in [start_ms, end_ms) (``RawSeries``); empty if there are none.
    raw: list[RawSeries] = field(default_factory=list)

    @property
    def times_ms(self) -> np.ndarray:
        return self.start_ms + self.step_ms * np.arange(self.steps, dtype=np.int64)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.step_ms * self.steps

    def g(self, name: str) -> np.ndarray:
        """A GPU signal, all NaN if no GPU reported it in this frame."""
        return self.gpu.get(name, np.full((len(self.gpus), self.steps), np.nan))

    def w(self, name: str) -> np.ndarray:
        return self.wl.get(name, np.full((len(self.workloads), self.steps), np.nan))

    def t(self, name: str) -> np.ndarray:
        return self.tgt.get(name, np.full((len(self.targets), self.steps), np.nan))

    def series_of(self, table: str, key: str, signal: str) -> str:
        """The text of the series behind a signal (rebuilt if this frame did not see it)."""
        found = self.series.get((table, key, signal))
        if found is not None:
            return found
        metric = SIGNAL_METRIC.get(signal, signal)
        if table == "gpu" and key.count("/") == 2:
            cluster, host, gpu = key.split("/")
            return f'{metric}{{cluster="{cluster}",host="{host}",gpu="{gpu}"}}'
        return f"{metric}{{{key}}}"
