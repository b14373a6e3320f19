"""What PromQL expressions evaluate to, over a fixed grid of evaluation times.

An instant vector evaluated at every step of a range query is a list of ``Row``: one label
set, a value per step and a mask of the steps where the series is present.  Holding a row
over all steps lets the operators run as numpy over the steps, in the same order of series
Prometheus uses, so sums accumulate in the same order and give the same bits.

A range vector (a matrix selector or a subquery, the argument of ``rate`` and friends) is
``Windows``: the raw samples of each series and, per series and step, the slice of them the
step's window holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hbmwatch.promql.errors import QueryError

#: A label set: sorted ``(name, value)`` pairs, the metric name under ``__name__``.
Labels = tuple[tuple[str, str], ...]
NAME = "__name__"
#: Prometheus' staleness marker: a NaN with this bit pattern ends a series at its time
STALE_BITS = np.uint64(0x7FF0000000000002)
STALE_NAN = float(np.array([STALE_BITS], dtype=np.uint64).view(np.float64)[0])


def is_stale(values: np.ndarray) -> np.ndarray:
    return values.view(np.uint64) == STALE_BITS


def labels_of(mapping: dict[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in mapping.items() if v != ""))


def without_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != NAME)


def label_text(labels: Labels) -> str:
    """``{a="1", b="2"}`` as Prometheus prints a label set in its error messages."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


@dataclass(frozen=True)
class Grid:
    """Evaluation times in ms: ``start``, ``start + step``, ... up to and with ``end``."""

    start: int
    end: int
    step: int

    @property
    def times(self) -> np.ndarray:
        return np.arange(self.start, self.end + 1, self.step, dtype=np.int64)

    def __len__(self) -> int:
        return (self.end - self.start) // self.step + 1


@dataclass
class Row:
    """One series of an instant vector over the grid."""

    labels: Labels
    values: np.ndarray  # float64, one per step
    present: np.ndarray  # bool, one per step
    #: the sample timestamps (ms) where the row comes straight from a selector
    stamps: np.ndarray | None = field(default=None, repr=False)

    def any(self) -> bool:
        return bool(self.present.any())


@dataclass
class Scalar:
    values: np.ndarray  # float64, one per step


@dataclass
class String:
    value: str


@dataclass
class RawSeries:
    """The samples of one stored (or subquery) series, times ascending, in ms."""

    labels: Labels
    times: np.ndarray
    values: np.ndarray
    #: per sample (count, min, max, sum) where each stands for a minute or an hour
    stats: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


@dataclass
class Windows:
    """A range vector over the grid: series, and per series and step ``[lo, hi)`` indexes
    into that series' samples, the window ``[t - range, t]`` of the step."""

    series: list[RawSeries]
    lo: np.ndarray  # int64 [n_series, n_steps]
    hi: np.ndarray
    ends: np.ndarray  # the window's end (ms) per step
    range_ms: int

    @classmethod
    def over(cls, series: list[RawSeries], ends: np.ndarray, range_ms: int) -> Windows:
        lo = np.empty((len(series), len(ends)), dtype=np.int64)
        hi = np.empty_like(lo)
        for i, s in enumerate(series):
            lo[i] = np.searchsorted(s.times, ends - range_ms, side="left")
            hi[i] = np.searchsorted(s.times, ends, side="right")
        return cls(series, lo, hi, ends, range_ms)

    @property
    def counts(self) -> np.ndarray:
        return self.hi - self.lo


Value = list[Row] | Scalar | String | Windows


def merge_rows(rows: Iterable[Row]) -> list[Row]:
    """Rows with equal label sets become one; two present at one step is Prometheus' error.

    Operators compute one output row per input row; their labels may coincide (``abs`` of
    ``a{x="1"}`` and ``b{x="1"}``), which is fine where they never share a step.
    """
    merged: dict[Labels, Row] = {}
    for row in rows:
        if not row.any():
            continue
        seen = merged.get(row.labels)
        if seen is None:
            merged[row.labels] = Row(row.labels, row.values.copy(), row.present.copy())
            continue
        if (seen.present & row.present).any():
            raise QueryError("vector cannot contain metrics with the same labelset")
        seen.values[row.present] = row.values[row.present]
        seen.present |= row.present
    return list(merged.values())


def rows_sorted(series: Sequence[RawSeries]) -> list[RawSeries]:
    """Series in the order Prometheus' storage returns them: by label set."""
    return sorted(series, key=lambda s: s.labels)


def check_unique(rows: Sequence[Row]) -> None:
    """Prometheus' check over a whole matrix: no two series with one label set."""
    seen: set[Labels] = set()
    for row in rows:
        if row.labels in seen:
            raise QueryError("vector cannot contain metrics with the same labelset")
        seen.add(row.labels)
