"""``hbmwatch score-file``: traces in both layouts, causal scoring, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hbmwatch.runtime.offline import TraceError, read_trace, score_trace

T0 = 1_795_670_000
ONSET = 500


def wide_trace(path: Path, seconds: int = 800) -> Path:
    """An H200's memory warming 15 C at constant load from ONSET: a thermal excursion."""
    rng = np.random.default_rng(0)
    t = np.arange(seconds)
    rise = np.clip((t - ONSET) * 0.5, 0, 15)
    pd.DataFrame({
        "timestamp": T0 + t,
        "gpu_memory_temperature_celsius": np.round(45 + rise + rng.normal(0, 0.3, seconds)),
        "gpu_hotspot_temperature_celsius": np.round(40 + rng.normal(0, 0.3, seconds)),
        "gpu_power_watts": 250 + rng.normal(0, 3, seconds),
        "gpu_memory_bandwidth_utilization_ratio": 0.3 + rng.normal(0, 0.01, seconds),
    }).to_csv(path, index=False)  # fmt: skip
    return path


def test_wide_trace_finds_the_excursion_soon_after_it_starts(tmp_path: Path) -> None:
    trace = read_trace(wide_trace(tmp_path / "h200.csv"), {"sku": "H200"})
    assert len(trace.samples) == 800 * 4
    result = score_trace(trace)
    thermal = [f for f in result.findings if f.kind == "thermal_excursion"]
    assert len(thermal) == 1
    f = thermal[0]
    assert f.entity == {"host": "h200", "gpu": "0", "sku": "H200"}
    assert 0 <= f.raised_ms / 1000 - (T0 + ONSET) <= 30
    assert f.evidence[0].series.startswith("gpu_memory_temperature_celsius{")
    scores = result.scores.set_index("timestamp")["thermal"]
    assert scores.loc[: T0 + ONSET - 1].max() < 1.0 <= scores.loc[T0 + ONSET + 30 :].max()


def test_scores_never_look_ahead(tmp_path: Path) -> None:
    """Scoring a file cut at ONSET gives the same scores up to the cut as the whole file."""
    full = wide_trace(tmp_path / "full.csv")
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(full.read_text().splitlines(keepends=True)[: ONSET + 1]))
    a = score_trace(read_trace(full)).scores.set_index("timestamp")
    b = score_trace(read_trace(cut)).scores.set_index("timestamp")
    shared = b.index[b.index < T0 + ONSET - 1]
    pd.testing.assert_frame_equal(a.loc[shared], b.loc[shared])


def test_long_layout_with_labels_and_iso_times(tmp_path: Path) -> None:
    times = pd.date_range("2026-11-26T03:00:00Z", periods=3, freq="1s")
    path = tmp_path / "long.csv"
    pd.DataFrame({
        "metric": ["gpu_power_watts"] * 3,
        "labels": ['{host="n1",gpu="3"}'] * 3,
        "timestamp": [t.isoformat() for t in times],
        "value": [250.0, "NaN", 260.0],
    }).to_csv(path, index=False)  # fmt: skip
    trace = read_trace(path)
    assert [s.series.text for s in trace.samples] == ['gpu_power_watts{gpu="3",host="n1"}'] * 2
    assert trace.samples[0].timestamp_ms == int(times[0].timestamp() * 1000)
    assert trace.dropped == {"non_finite": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("when,gpu_power_watts\n1,2\n", "no time column"),
        ("metric,timestamp,value\nhbm_temp,1,2\n", "'hbm_temp' is not a canonical metric"),
        ("timestamp,gpu_power_watts{host=\n1,2\n", "gpu_power_watts{host="),
        ("timestamp,gpu_power_watts\n1,nan\n", "no finite values"),
        ("timestamp,gpu_power_watts\nyesterday,1\n", "neither numbers nor ISO 8601"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message.replace("{", r"\{").replace("(", r"\(")):
        read_trace(path)


def test_a_column_that_is_no_canonical_metric_is_a_user_series(tmp_path: Path) -> None:
    """Once refused ('hbm_temp' is not a canonical metric): now the generic detector's."""
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,hbm_temp\n1,2\n")
    trace = read_trace(path)
    assert trace.samples == [] and [s.name for s in trace.user] == ["hbm_temp"]
    assert trace.user[0].labels == {"series": "hbm_temp"}


def test_cli_writes_scores_and_findings(tmp_path: Path) -> None:
    trace = wide_trace(tmp_path / "gpu.csv", seconds=300)
    out = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", str(trace), "--out",
         str(tmp_path / "out"), "--label", "sku=H200"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    scores = pd.read_csv(tmp_path / "out" / "gpu.scores.csv")
    assert list(scores.columns[:2]) == ["timestamp", "time"] and len(scores) == 300
    doc = json.loads((tmp_path / "out" / "gpu.findings.json").read_text())
    assert doc["samples"] == 1200 and doc["findings"] == []
    bad = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", str(tmp_path / "missing.csv")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "cannot read it as CSV" in bad.stdout + bad.stderr


def test_probe_samples_csv_reads_back_as_a_long_trace(tmp_path: Path) -> None:
    """``collector.probe --samples-csv`` (the device script's capture) is score-file input."""
    from hbmwatch.collector.probe import probe
    from hbmwatch.collector.sources.nvml import NvmlCollector
    from tests.fakes.nvml import FakeNvml

    source = NvmlCollector(FakeNvml(), host="gpu-host")
    source.open()
    try:
        report = probe(source, 1.1, 0.5, tmp_path / "trace.csv")
    finally:
        source.close()
    trace = read_trace(tmp_path / "trace.csv")
    names = {s.series.text for s in trace.samples}
    assert names == set(report["series"])
    assert len(trace.samples) == sum(s["samples"] for s in report["series"].values())
    mem = [s for s in trace.samples if s.series.metric == "gpu_memory_temperature_celsius"]
    assert mem and mem[0].series.label("host") == "gpu-host"
