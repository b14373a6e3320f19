"""A real Prometheus over hbmwatch's samples: the reference engine PromQL answers are judged by.

The differential tests (``tests/test_promql_diff.py``) and ``hbmwatch bench promql`` load the
same samples into hbmwatch's store and into an offline Prometheus, then ask both the same
queries.  Prometheus is loaded the way an operator backfills it: the samples as OpenMetrics
text, ``promtool tsdb create-blocks-from openmetrics`` into a TSDB folder, then ``prometheus``
over that folder with an empty configuration (it scrapes nothing, so the data is exactly
what was written).  Metric names stay as hbmwatch spells them: every family is declared
``unknown``, since OpenMetrics' counter type would want ``_total`` split off.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from hbmwatch.bench.engines import EngineProcess, EngineUnavailable
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.store import Store

#: Series dumped per database round trip.
_DUMP_BATCH = 500


class PrometheusUnavailable(EngineUnavailable):
    """promtool or prometheus is missing, or the server would not load or start."""


@dataclass(frozen=True)
class SeriesSamples:
    """Every raw sample of one series, timestamps in milliseconds, in time order."""

    key: SeriesKey
    timestamps_ms: np.ndarray
    values: np.ndarray


def dump_store(store: Store, start_ms: int = 0, end_ms: int = 2**62) -> Iterator[SeriesSamples]:
    """Every raw sample of every series in ``[start_ms, end_ms)``: minute chunks and the head.

    The store has one copy of each raw sample (a minute is either a chunk or still in the
    head), so this is exactly what was accepted, whatever compaction did since.
    """
    # Not ``Store.select_samples``: that one is bounded for queries, a dump reads everything.
    store.series_registry.refresh()
    found = sorted(store.series_registry.keys.items())
    for i in range(0, len(found), _DUMP_BATCH):
        part = found[i : i + _DUMP_BATCH]
        raw, _ = store._raw_samples([sid for sid, _ in part], start_ms, end_ms)
        for sid, key in part:
            if sid in raw:
                t, v = raw[sid]
                yield SeriesSamples(key, t, v)


def samples_by_series(samples: Iterable[Sample]) -> list[SeriesSamples]:
    """Group ``Sample`` records into sorted per-series arrays (duplicates: the first wins)."""
    grouped: dict[SeriesKey, dict[int, float]] = {}
    for s in samples:
        grouped.setdefault(s.series, {}).setdefault(s.timestamp_ms, s.value)
    out = []
    for key in sorted(grouped, key=lambda k: k.text):
        points = sorted(grouped[key].items())
        out.append(
            SeriesSamples(
                key,
                np.array([p[0] for p in points], dtype=np.int64),
                np.array([p[1] for p in points], dtype=np.float64),
            )
        )
    return out


def _om_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _om_labels(key: SeriesKey) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in key.labels)
    return f"{{{body}}}" if body else ""


def write_openmetrics(series: Iterable[SeriesSamples], out: IO[str]) -> int:
    """OpenMetrics text promtool backfills from: one family per metric, timestamps in
    seconds with millisecond digits (written as integers, so no float rounding moves them).
    Returns the number of samples written."""
    by_metric: dict[str, list[SeriesSamples]] = {}
    for s in series:
        by_metric.setdefault(s.key.metric, []).append(s)
    written = 0
    for metric in sorted(by_metric):
        out.write(f"# TYPE {metric} unknown\n")
        for s in by_metric[metric]:
            head = metric + _om_labels(s.key)
            for ts, value in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True):
                out.write(f"{head} {_om_value(value)} {ts // 1000}.{ts % 1000:03d}\n")
            written += len(s.timestamps_ms)
    out.write("# EOF\n")
    return written


def binaries() -> tuple[str, str]:
    """Paths of promtool and prometheus, or a one-line error naming what is missing."""
    found = {name: shutil.which(name) for name in ("promtool", "prometheus")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise PrometheusUnavailable(
            f"{' and '.join(missing)} not found on PATH: install Prometheus 2.42 "
            "(Debian/Ubuntu: apt install prometheus) to compare with the real engine"
        )
    return found["promtool"], found["prometheus"]  # type: ignore[return-value]


def create_blocks(series: Iterable[SeriesSamples], folder: Path) -> Path:
    """Backfill ``folder/tsdb`` with the samples; returns the TSDB path."""
    promtool, _ = binaries()
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "data.om"
    with text.open("w") as out:
        write_openmetrics(series, out)
    tsdb = folder / "tsdb"
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PrometheusUnavailable(f"promtool could not load {text}: {last[0]}")
    text.unlink()
    return tsdb


class RealPrometheus(EngineProcess):
    """``prometheus`` serving a backfilled TSDB on a free loopback port; stop it by PID.

    >>> # with RealPrometheus.over(series, tmp) as prom: httpx.get(prom.url + "/api/v1/query", ...)
    """

    def __init__(self, tsdb: Path, *, ready_timeout_s: float = 120.0) -> None:
        self.tsdb = tsdb
        (tsdb.parent / "prometheus.yml").write_text("global: {}\n")
        args = [
            f"--storage.tsdb.path={tsdb}",
            "--config.file={folder}/prometheus.yml",
            "--storage.tsdb.retention.time=100y",
            "--web.listen-address=127.0.0.1:{port}",
            "--query.lookback-delta=5m",
            # PromQL that hbmwatch evaluates and 2.42 keeps behind a flag.
            "--enable-feature=promql-negative-offset",
        ]
        try:
            super().__init__("prometheus", args, tsdb.parent, ready_path="/-/ready",
                             ready_timeout_s=ready_timeout_s)  # fmt: skip
        except EngineUnavailable as exc:
            raise PrometheusUnavailable(str(exc)) from None

    @classmethod
    def over(cls, series: Iterable[SeriesSamples], folder: Path) -> RealPrometheus:
        """Backfill ``folder`` with the samples and start a server over them."""
        return cls(create_blocks(series, folder))
