"""``score-file`` for any series: value columns that are not canonical metrics.

A plain ``timestamp,value`` CSV (a public anomaly benchmark's layout, a user's queue depth)
has no metric hbmwatch knows, so it does not go through the store and the grid: each such
column is a user series scored by the generic model directly, sample by sample in time
order (a file may span months at 5-minute steps), with the rule the service uses for
``user_series_value`` (``detectors/generic.py``), so a file and the service agree.

Naming: a column's header names its series (``value`` alone: the file's stem; labels in
Prometheus notation, ``queue{host="n1"}``, place it), unless ``--name`` names it (only
with one such column).  Bad values are dropped and counted: ``non_numeric`` (text),
``non_finite`` (empty, NaN, infinite), ``no_timestamp``, ``duplicate_timestamp`` (the last
sample of a timestamp is kept); unsorted rows are sorted, and the trace says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hbmwatch.collector.exposition import MalformedLine, parse_series
from hbmwatch.detectors.base import latest
from hbmwatch.detectors.generic import ENTITY_LABELS, Series, SeriesAnomalies
from hbmwatch.records import Finding, SeriesKey
from hbmwatch.validation import HbmwatchError

#: The metric a user series is, in the store and in its findings' evidence.
USER_METRIC = "user_series_value"


class TraceError(HbmwatchError):
    """A trace file that cannot be read, with the file and what is wrong in it."""


@dataclass
class UserSeries:
    """One value column as a user series: its name, labels and finite samples in order."""

    name: str
    labels: dict[str, str]
    t_ms: np.ndarray  # int64, strictly ascending
    values: np.ndarray

    @property
    def key(self) -> str:
        return SeriesKey(USER_METRIC, self.labels).text


def user_series(
    path: Path, header: str, times: np.ndarray, column: pd.Series,
    labels: Mapping[str, str] | None, dropped: dict[str, int], notes: list[str],
) -> UserSeries:  # fmt: skip
    """A value column as a user series: bad values dropped and counted, rows sorted by time,
    the last sample of a repeated timestamp kept."""
    name, own = _name_of(path, header)
    timed = times != np.iinfo(np.int64).min  # offline.NO_TIME: a missing timestamp
    _count(dropped, "no_timestamp", int((~timed).sum()))
    times, column = times[timed], column[timed]
    values = pd.to_numeric(column, errors="coerce").to_numpy(float)
    text = column.notna().to_numpy() & np.isnan(values)
    finite = np.isfinite(values)
    if not finite.any():
        raise TraceError(f"{path}: column {header!r} has no numeric values to score",
                          path=str(path))  # fmt: skip
    _count(dropped, "non_numeric", int(text.sum()))
    _count(dropped, "non_finite", int((~finite & ~text).sum()))
    t, x = times[finite], values[finite]
    if len(t) > 1 and (np.diff(t) < 0).any():
        order = np.argsort(t, kind="stable")
        t, x = t[order], x[order]
        note = f"{header}: rows not in time order; sorted"
        if note not in notes:
            notes.append(note)
    keep = np.r_[t[1:] != t[:-1], True]  # the last of each run of one timestamp
    _count(dropped, "duplicate_timestamp", int((~keep).sum()))
    given = {**(labels or {}), **own}
    scope = {k: v for k, v in given.items() if k in ENTITY_LABELS and k != "series"}
    return UserSeries(name, {**scope, "series": name}, t[keep].astype(np.int64), x[keep])


def _name_of(path: Path, header: str) -> tuple[str, dict[str, str]]:
    """A header's series name and labels: ``queue{host="n1"}`` names ``queue`` on n1, a
    header that is no series notation (``queue depth``) is the name as it stands."""
    text = header.strip()
    if text.lower() == "value":
        return path.stem, {}
    try:
        ref = parse_series(text)
    except MalformedLine:
        return text, {}
    return ref.name, ref.label_dict()


def rename(path: Path, series: list[UserSeries], name: str | None) -> list[UserSeries]:
    """``--name``: the one user series' name; a clear error where there are several, or
    where two columns name one series."""
    keys = [s.key for s in series]
    if len(set(keys)) < len(keys):
        twice = next(s.name for s in series if keys.count(s.key) > 1)
        raise TraceError(f"{path}: two columns name the series {twice!r}; rename one",
                         path=str(path))  # fmt: skip
    if name is None:
        return series
    if len(series) != 1:
        raise TraceError(
            f"{path}: --name names one series, but the file has {len(series)} value columns "
            "that are not canonical metrics; name them by their headers instead",
            path=str(path),
        )
    s = series[0]
    return [UserSeries(name, {**s.labels, "series": name}, s.t_ms, s.values)]


def score_user_series(
    series: Sequence[UserSeries], detector: SeriesAnomalies | None = None
) -> tuple[pd.DataFrame, list[Finding]]:
    """Every user series through one generic detector, sample by sample: a table of scores
    (``timestamp`` in seconds, one column per series) and the findings."""
    det = detector or SeriesAnomalies()
    found, scores = det.feed([Series(s.key, s.labels, s.t_ms, s.values) for s in series])
    names = [s.name for s in series]
    tables = [
        pd.DataFrame({"timestamp": s.t_ms / 1000.0, _column(s, names): sc}).set_index("timestamp")
        for s, sc in zip(series, scores, strict=True)
    ]
    table = pd.concat(tables, axis=1, join="outer").sort_index().reset_index()
    return table, latest(found)


def _column(s: UserSeries, names: Sequence[str]) -> str:
    """A score column's name: the series', with its labels where two share a name."""
    if names.count(s.name) == 1:
        return s.name
    return SeriesKey(s.name, {k: v for k, v in s.labels.items() if k != "series"}).text


def join_scores(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two score tables as one, outer-joined on ``timestamp`` (either may be empty)."""
    if a.empty or "timestamp" not in a:
        return b
    if b.empty or "timestamp" not in b:
        return a
    return a.merge(b, on="timestamp", how="outer").sort_values("timestamp", ignore_index=True)


def _count(dropped: dict[str, int], reason: str, n: int) -> None:
    if n:
        dropped[reason] = dropped.get(reason, 0) + n
