"""``hbmwatch score-file``: a recorded trace through the detectors, offline and causally.

For users with a capture from their own hardware.  Two layouts are read:

* **wide**: a ``timestamp`` column (Unix seconds or milliseconds, or ISO 8601) and one
  column per series, named in Prometheus notation (``gpu_memory_temperature_celsius{host=
  "n1",gpu="0"}``) or by a bare canonical metric name (labels then come from ``--label``).
  A column whose name is no canonical metric is a **user series** (a plain
  ``timestamp,value`` file is one), named by its header (``value`` alone: the file's stem)
  or by ``--name``, and scored by the generic detector directly (``runtime/offline_series.py``);
* **long** (the canonical layout): columns ``metric``, ``labels`` (``{a="1"}`` notation,
  may be empty), ``timestamp`` and ``value``.

The trace is replayed in time order through the same store and detection runner that
``hbmwatch up`` uses: each cycle writes only the samples up to its own end and then runs
the detectors, so no verdict sees a later sample (no look-ahead).  The output is a CSV of
per-timestamp anomaly scores (each detector's largest score over its entities, 1.0 = at
its threshold) and the findings as JSON.  A file with canonical and user columns scores
each through its own path and writes one table, outer-joined on the timestamp: the user
series' scores sit at their own timestamps, the detectors' at the grid's.

A short capture needs shorter detector settings than a fleet watched for days:
``DetectorOptions`` sets the latency and thermal warm-up and the latency holds
(``score-file --warmup --hold --min-hold``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hbmwatch.collector.exposition import MalformedLine, parse_series
from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.context import Context
from hbmwatch.metrics import METRICS
from hbmwatch.records import Finding, Sample, SeriesKey, finding_to_dict
from hbmwatch.runtime import offline_series as user
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.runtime.offline_series import TraceError, UserSeries
from hbmwatch.settings import StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store

TIME_COLUMNS = ("timestamp", "time", "ts")
NO_TIME = np.iinfo(np.int64).min  # a row whose timestamp is missing
LONG_COLUMNS = {"metric", "timestamp", "value"}


@dataclass
class Trace:
    path: Path
    samples: list[Sample]
    dropped: dict[str, int] = field(default_factory=dict)
    #: Value columns that are no canonical metric, scored by the generic detector.
    user: list[UserSeries] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done to the input (sorted)

    @property
    def count(self) -> int:
        """Samples to score: canonical ones and the user series'."""
        return len(self.samples) + sum(len(s.t_ms) for s in self.user)


@dataclass(frozen=True)
class DetectorOptions:
    """Detector settings for a capture; None keeps each detector's own default.

    ``warmup_s``: data the latency and thermal baselines learn before judging (a capture
    that starts seconds before its fault wants less); ``hold_s``: how long a small p99
    regression (up to 2x) must last; ``min_hold_s``: how long a very large one must.
    """

    warmup_s: float | None = None
    hold_s: float | None = None
    min_hold_s: float | None = None

    def detectors(self) -> list[Any]:
        """``default_detectors()`` with the latency and thermal detectors set as asked."""
        from hbmwatch.detectors.latency import LatencyRegressions
        from hbmwatch.detectors.thermal import ThermalExcursions

        lat: dict[str, float] = {}
        therm: dict[str, float] = {}
        if self.warmup_s is not None:
            lat["warmup_s"] = therm["warmup_s"] = self.warmup_s
            lat["cold_min_s"] = min(self.warmup_s, LatencyRegressions().cold_min_s)
        if self.hold_s is not None:
            lat["min_on_s"] = self.hold_s
        if self.min_hold_s is not None:
            lat["min_hold_s"] = self.min_hold_s
        made = {"latency": LatencyRegressions(**lat), "thermal": ThermalExcursions(**therm)}
        return [made.get(d.name, d) for d in default_detectors()]


@dataclass
class ScoredFile:
    path: Path
    samples: int
    dropped: dict[str, int]
    scores: pd.DataFrame
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)


def read_trace(
    path: Path, labels: Mapping[str, str] | None = None, name: str | None = None
) -> Trace:
    """Read a wide or long CSV into canonical samples and user series; bad values are
    dropped and counted.  ``name``: the one user series' name (``--name``)."""
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot read it as CSV: {exc}", path=str(path)) from exc
    columns = {c.strip().lower(): c for c in frame.columns}
    if set(columns) >= LONG_COLUMNS:
        keys = [
            _key(path, f"{m}{lab}" if isinstance(lab, str) else str(m), labels)
            for m, lab in zip(frame[columns["metric"]], _labels_column(frame, columns), strict=True)
        ]  # fmt: skip
        times = _timestamps(path, frame[columns["timestamp"]])
        values = pd.to_numeric(frame[columns["value"]], errors="coerce").to_numpy(float)
        return _samples(path, keys, times, values)
    time_col = next((columns[c] for c in TIME_COLUMNS if c in columns), None)
    if time_col is None:
        raise TraceError(
            f"{path}: no time column: name one of {', '.join(TIME_COLUMNS)}, or use the "
            "long layout (metric, labels, timestamp, value)",
            path=str(path),
        )
    times = _timestamps(path, frame[time_col])
    keys, all_times, all_values = [], [], []
    dropped: dict[str, int] = {}
    notes: list[str] = []
    users = []
    for col in frame.columns:
        if col == time_col:
            continue
        key = _key(path, str(col), labels, user_ok=True)
        if key is None:
            users.append(
                user.user_series(path, str(col), times, frame[col], labels, dropped, notes)
            )
            continue
        keys += [key] * len(frame)
        all_times.append(times)
        all_values.append(pd.to_numeric(frame[col], errors="coerce").to_numpy(float))
    if not keys and not users:
        raise TraceError(f"{path}: no value columns beside {time_col!r}", path=str(path))
    users = user.rename(path, users, name)
    if not keys:
        return Trace(path, [], dropped, users, notes)
    trace = _samples(path, keys, np.concatenate(all_times), np.concatenate(all_values))
    for reason, n in dropped.items():
        trace.dropped[reason] = trace.dropped.get(reason, 0) + n
    trace.user, trace.notes = users, notes
    return trace


def _labels_column(frame: pd.DataFrame, columns: Mapping[str, str]) -> list[Any]:
    if "labels" not in columns:
        return [""] * len(frame)
    return [v if isinstance(v, str) else "" for v in frame[columns["labels"]]]


def _key(
    path: Path, text: str, labels: Mapping[str, str] | None, user_ok: bool = False
) -> SeriesKey | None:
    """The canonical series a column or row names; None for a user series (``user_ok``: a
    wide column whose name is no canonical metric, or no series notation at all)."""
    try:
        ref = parse_series(text.strip())
    except MalformedLine as exc:
        if user_ok and "{" not in text:
            return None
        raise TraceError(f"{path}: column or series {text!r}: {exc}", path=str(path)) from exc
    if ref.name not in METRICS and user_ok:
        return None
    if ref.name not in METRICS:
        raise TraceError(
            f"{path}: {ref.name!r} is not a canonical metric (see docs/metrics.md); rename the "
            'column, e.g. gpu_memory_temperature_celsius{host="n1",gpu="0"}',
            path=str(path),
            metric=ref.name,
        )
    merged = {"host": path.stem, "gpu": "0", **(labels or {}), **ref.label_dict()}
    return SeriesKey(ref.name, merged)


def _timestamps(path: Path, column: pd.Series) -> np.ndarray:
    """Milliseconds since the epoch from Unix seconds, milliseconds or ISO 8601 text; a
    missing timestamp is ``NO_TIME`` (its row is dropped and counted as ``no_timestamp``)."""
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric[column.notna()].notna().all():
        values = numeric.to_numpy(float)
        ms = np.round(np.where(values > 1e11, values, values * 1000))
        return np.where(np.isnan(ms), float(NO_TIME), ms).astype(np.int64)
    try:
        parsed = pd.to_datetime(column, utc=True, format="ISO8601")
    except (ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: timestamps are neither numbers nor ISO 8601: {first}",
                         path=str(path)) from exc  # fmt: skip
    ms = parsed.dt.as_unit("ms").astype("int64").to_numpy(np.int64)
    return np.where(parsed.isna().to_numpy(), NO_TIME, ms)


def _samples(path: Path, keys: list[SeriesKey], times: np.ndarray, values: np.ndarray) -> Trace:
    timed = times != NO_TIME
    finite = np.isfinite(values)
    dropped = {"non_finite": int((timed & ~finite).sum())} if (timed & ~finite).any() else {}
    if not timed.all():
        dropped["no_timestamp"] = int((~timed).sum())
    finite &= timed
    order = np.argsort(times, kind="stable")
    samples = [
        Sample(keys[i], int(times[i]), float(values[i])) for i in order.tolist() if finite[i]
    ]
    if not samples:
        raise TraceError(f"{path}: no finite values to score", path=str(path))
    return Trace(path, samples, dropped)


def merge_traces(traces: list[Trace]) -> Trace:
    """Several files of one capture as one trace, named after the first, in time order."""
    samples = sorted((s for t in traces for s in t.samples), key=lambda s: s.timestamp_ms)
    dropped: dict[str, int] = {}
    for t in traces:
        for reason, n in t.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    users = [s for t in traces for s in t.user]
    keys = [s.key for s in users]
    if len(set(keys)) < len(keys):
        path = str(traces[0].path)
        raise TraceError(f"{path}: --merge: two files name one user series; rename a column "
                          "or score the files apart", path=path)  # fmt: skip
    notes = [n for t in traces for n in t.notes]
    return Trace(traces[0].path, samples, dropped, users, notes)


def score_trace(
    trace: Trace,
    *,
    step_seconds: float = 1.0,
    cycle_seconds: float = 60.0,
    workdir: Path | None = None,
    progress: Callable[[float], None] | None = None,
    options: DetectorOptions | None = None,
) -> ScoredFile:
    """Replay a trace cycle by cycle through a scratch store and the detectors; its user
    series through the generic detector directly; one table of scores."""
    user_scores, user_found = (
        user.score_user_series(trace.user) if trace.user else (pd.DataFrame(), [])
    )
    if not trace.samples:
        if progress is not None:
            progress(1.0)
        n = trace.count
        return ScoredFile(trace.path, n, trace.dropped, user_scores, user_found, trace.notes)
    result = _score_canonical(trace, step_seconds, cycle_seconds, workdir, progress, options)
    result.scores = user.join_scores(result.scores, user_scores)
    result.findings += user_found
    result.samples += sum(len(s.t_ms) for s in trace.user)
    result.notes = trace.notes
    return result


def _score_canonical(
    trace: Trace,
    step_seconds: float,
    cycle_seconds: float,
    workdir: Path | None,
    progress: Callable[[float], None] | None,
    options: DetectorOptions | None,
) -> ScoredFile:
    """The canonical samples, cycle by cycle, through a scratch store and the detectors."""
    times = np.array([s.timestamp_ms for s in trace.samples], dtype=np.int64)
    now = {"ms": int(times[0])}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="hbmwatch-score-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'trace.db'}"
        engine = create_store_engine(url)
        upgrade(engine)
        engine.dispose()
        store = Store(create_store_engine(url), StoreSettings(url=url),
                      clock=lambda: now["ms"] / 1000)  # fmt: skip
        detectors = (options or DetectorOptions()).detectors()
        runner = DetectionRunner(
            store, detectors, step_seconds=step_seconds, settle_seconds=0.0,
            backfill_seconds=10 * 86_400, context=Context(), clock=lambda: now["ms"] / 1000,
        )  # fmt: skip
        runner.start()
        scores: list[pd.DataFrame] = []
        cycle_ms, written = int(cycle_seconds * 1000), 0
        end = int(times[0]) + cycle_ms
        last = int(times[-1]) + int(step_seconds * 1000)
        try:
            while written < len(times):
                upto = int(np.searchsorted(times, end, side="left"))
                now["ms"] = end
                if upto > written:
                    store.write(trace.samples[written:upto])
                    written = upto
                runner.cycle(min(end, last))
                scores.append(_frame_scores(runner))
                if progress is not None:
                    progress(written / len(times))
                end += cycle_ms
            findings = store.findings.query(limit=100_000)
        finally:
            store.close()
    table = pd.concat(scores) if scores else pd.DataFrame()
    return ScoredFile(trace.path, len(trace.samples), trace.dropped, table, findings)


def _frame_scores(runner: DetectionRunner) -> pd.DataFrame:
    frame = runner.last_frame
    if frame is None or frame.steps == 0:
        return pd.DataFrame()
    data: dict[str, Any] = {"timestamp": frame.times_ms / 1000.0}
    for name, values in frame.scores.items():
        with np.errstate(all="ignore"):
            col = np.nanmax(np.where(np.isnan(values), -np.inf, values), axis=0)
        data[name] = np.where(np.isinf(col), np.nan, col)
    return pd.DataFrame(data)


def write_outputs(result: ScoredFile, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result.path.stem
    scores_path = out_dir / f"{stem}.scores.csv"
    findings_path = out_dir / f"{stem}.findings.json"
    table = result.scores.copy()
    if "timestamp" in table:
        table.insert(1, "time", pd.to_datetime(table["timestamp"], unit="s", utc=True))
        table["timestamp"] = table["timestamp"].map("{:.3f}".format)
    table.to_csv(scores_path, index=False, float_format="%.4g")
    doc = {
        "file": str(result.path),
        "samples": result.samples,
        "dropped": result.dropped,
        "notes": result.notes,
        "findings": [finding_to_dict(f) for f in result.findings],
    }
    findings_path.write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n")
    return scores_path, findings_path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
