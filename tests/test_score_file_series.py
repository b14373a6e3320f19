"""``score-file`` on any series: plain ``timestamp,value`` CSVs through the generic detector."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hbmwatch.detectors.generic import SeriesAnomalies
from hbmwatch.runtime.offline import TraceError, read_trace, score_trace, write_outputs
from hbmwatch.taxonomy import FindingKind

T0 = 1_700_000_000  # s
STEP = 300  # a NAB-like 5-minute series
N = 2000
ALERT = SeriesAnomalies().alert_score


def series(
    n: int = N, seed: int = 0, spike: int | None = None, shift: int | None = None
) -> np.ndarray:
    """A calm level of 100 with unit noise; a +40 spike and a +20 level shift where asked."""
    x = 100 + np.random.default_rng(seed).normal(0, 1, n)
    if spike is not None:
        x[spike] += 40
    if shift is not None:
        x[shift:] += 20
    return x


def write(path: Path, **columns: np.ndarray) -> Path:
    n = len(next(iter(columns.values())))
    pd.DataFrame({"timestamp": T0 + STEP * np.arange(n), **columns}).to_csv(path, index=False)
    return path


def starts(found: list, kind: str = FindingKind.SERIES_ANOMALY) -> list[int]:
    """Each finding's start as a sample index."""
    return sorted((f.started_ms // 1000 - T0) // STEP for f in found if f.kind == kind)


def test_a_timestamp_value_csv_finds_a_spike_and_a_level_shift(tmp_path: Path) -> None:
    path = write(tmp_path / "queue.csv", value=series(spike=1200, shift=1600))
    result = score_trace(read_trace(path))
    assert list(result.scores.columns) == ["timestamp", "queue"] and len(result.scores) == N
    scores = result.scores["queue"].to_numpy()
    assert np.nanmin(scores) >= 0.0 and np.nanmax(scores) <= 1.0
    found = starts(result.findings)
    assert found[0] == 1200 and 1600 in found, found
    f = next(f for f in result.findings if f.started_ms == (T0 + 1200 * STEP) * 1000)
    assert f.entity == {"series": "queue"} and f.detector == "series"
    assert f.severity.value == "warning" and f.ended_ms is not None
    assert f.evidence[0].series == 'user_series_value{series="queue"}'
    assert f.evidence[0].value > 130 and 95 < f.evidence[0].threshold < 105  # its calm level
    assert scores[:1200].max() < ALERT <= scores[1200]


def test_a_calm_series_raises_nothing(tmp_path: Path) -> None:
    result = score_trace(read_trace(write(tmp_path / "calm.csv", value=series())))
    assert result.findings == []
    assert result.scores["calm"].max() < ALERT


def test_a_file_cut_short_scores_identically_up_to_the_cut(tmp_path: Path) -> None:
    """No look-ahead: scores and the findings raised before the cut do not change."""
    x = series(spike=1200, shift=1600)
    full = score_trace(read_trace(write(tmp_path / "full.csv", value=x)))
    cut = score_trace(read_trace(write(tmp_path / "cut.csv", value=x[:1610])))
    np.testing.assert_array_equal(full.scores["full"][:1610], cut.scores["cut"])
    end_ms = (T0 + 1610 * STEP) * 1000

    def raised(found: list) -> list[tuple]:
        return sorted((f.started_ms, f.raised_ms) for f in found if f.raised_ms < end_ms)

    assert raised(full.findings) == raised(cut.findings) != []
    assert max(starts(cut.findings)) == 1600  # the shift, 10 samples before the end


def test_several_value_columns_are_scored_each_on_its_own(tmp_path: Path) -> None:
    path = write(tmp_path / "app.csv", queue_depth=series(seed=1),
                 **{'latency_ms{host="n1"}': series(seed=2, spike=1500)})  # fmt: skip
    trace = read_trace(path)
    assert [(s.name, s.labels) for s in trace.user] == [
        ("queue_depth", {"series": "queue_depth"}),
        ("latency_ms", {"host": "n1", "series": "latency_ms"}),
    ]
    result = score_trace(trace)
    assert list(result.scores.columns) == ["timestamp", "queue_depth", "latency_ms"]
    assert {tuple(sorted(f.entity.items())) for f in result.findings} == {
        (("host", "n1"), ("series", "latency_ms"))
    }
    assert starts(result.findings)[0] == 1500


def test_the_name_comes_from_the_header_the_file_or_name(tmp_path: Path) -> None:
    one = write(tmp_path / "nab_file.csv", value=series(n=50))
    assert [s.name for s in read_trace(one).user] == ["nab_file"]
    assert [s.name for s in read_trace(one, name="cpu").user] == ["cpu"]
    assert read_trace(one, name="cpu").user[0].labels == {"series": "cpu"}
    named = write(tmp_path / "x.csv", requests=series(n=50))
    assert [s.name for s in read_trace(named).user] == ["requests"]
    two = write(tmp_path / "two.csv", a=series(n=50), b=series(n=50))
    with pytest.raises(TraceError, match="--name names one series, but the file has 2"):
        read_trace(two, name="cpu")
    clash = write(tmp_path / "q.csv", value=series(n=50), q=series(n=50))
    with pytest.raises(TraceError, match="two columns name the series 'q'; rename one"):
        read_trace(clash)


def test_bad_rows_are_sorted_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "messy.csv"
    path.write_text(
        "timestamp,value\n"
        "1700000600,3\n1700000000,1\n1700000300,2\n"  # out of order
        "1700000900,4\n1700000900,5\n"  # a repeated timestamp: the last stays
        "1700001200,high\n1700001500,\n1700001800,NaN\n1700002100,6\n"
    )
    trace = read_trace(path)
    (s,) = trace.user
    assert s.t_ms.tolist() == [(T0 + STEP * i) * 1000 for i in (0, 1, 2, 3, 7)]
    assert s.values.tolist() == [1.0, 2.0, 3.0, 5.0, 6.0]
    assert trace.dropped == {"non_numeric": 1, "non_finite": 2, "duplicate_timestamp": 1}
    assert trace.notes == ["value: rows not in time order; sorted"]
    result = score_trace(trace)
    assert result.scores["timestamp"].tolist() == [T0 + STEP * i for i in (0, 1, 2, 3, 7)]


def test_rows_without_a_timestamp_are_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "gaps.csv"
    for stamps in (["1700000000", "", "1700000600"],
                   ["2023-11-14T22:13:20Z", "", "2023-11-14T22:23:20Z"]):  # fmt: skip
        path.write_text("timestamp,value\n" + "".join(f"{t},{i}\n" for i, t in enumerate(stamps)))
        trace = read_trace(path)
        assert trace.user[0].t_ms.tolist() == [T0 * 1000, (T0 + 600) * 1000]
        assert trace.user[0].values.tolist() == [0.0, 2.0]
        assert trace.dropped == {"no_timestamp": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timestamp,value\n", "no value columns beside|no numeric values"),
        ("timestamp,value\n1,\n2,\n", "column 'value' has no numeric values to score"),
        ("timestamp,value\n1,nan\n2,x\n", "column 'value' has no numeric values to score"),
    ],
)
def test_an_empty_or_all_nan_column_is_a_clear_error(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_canonical_and_user_columns_score_each_their_own_way_into_one_table(
    tmp_path: Path,
) -> None:
    n = 600
    t = T0 + np.arange(n)  # one sample a second
    path = tmp_path / "mixed.csv"
    pd.DataFrame({"timestamp": t, "gpu_power_watts": 300.0 + np.zeros(n),
                  "queue": series(n=n)}).to_csv(path, index=False)  # fmt: skip
    trace = read_trace(path)
    assert len(trace.samples) == n and [s.name for s in trace.user] == ["queue"]
    result = score_trace(trace)
    assert "queue" in result.scores and result.scores["timestamp"].is_monotonic_increasing
    assert result.scores["queue"].notna().sum() == n
    assert result.samples == 2 * n


def test_cli_scores_a_plain_csv_end_to_end(tmp_path: Path) -> None:
    path = write(tmp_path / "qd.csv", value=series(spike=1200))
    out = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", str(path), "--out",
         str(tmp_path / "out"), "--name", "queue_depth"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "series_anomaly {'series': 'queue_depth'}" in out.stderr
    scores = pd.read_csv(tmp_path / "out" / "qd.scores.csv")
    assert list(scores.columns) == ["timestamp", "time", "queue_depth"] and len(scores) == N
    doc = json.loads((tmp_path / "out" / "qd.findings.json").read_text())
    assert doc["samples"] == N and doc["dropped"] == {} and doc["notes"] == []
    assert doc["findings"][0]["kind"] == "series_anomaly"
    two = write(tmp_path / "two.csv", a=series(n=50), b=series(n=50))
    bad = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", str(two), "--name", "x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--name names one series" in bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr


def test_outputs_write_the_scores_at_every_input_timestamp(tmp_path: Path) -> None:
    result = score_trace(read_trace(write(tmp_path / "w.csv", value=series(n=100))))
    scores_path, findings_path = write_outputs(result, tmp_path / "out")
    table = pd.read_csv(scores_path)
    assert table["timestamp"].tolist() == [float(T0 + STEP * i) for i in range(100)]
    assert json.loads(findings_path.read_text())["file"].endswith("w.csv")
