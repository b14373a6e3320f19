"""`hbmwatch bench store` runs end to end and reports every figure (values not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hbmwatch.benchmarks import TelemetryShape


def test_bench_store_reports_all_figures(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "hbmwatch.cli",
        "bench",
        "store",
        "--gpus",
        "8",
        "--seconds",
        "3",
        "--size-gpus",
        "2",
        "--size-minutes",
        "2",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    ingest = report["ingest_sqlite"]
    assert ingest["samples"] == 3 * 8 * len(TelemetryShape(1).keys)
    for key in (
        "store_samples_per_second",
        "store_ids_samples_per_second",
        "ceiling_samples_per_second",
        "ratio",
        "ratio_ids",
    ):
        assert ingest[key] > 0
    assert report["size_sqlite"]["bytes_per_sample"] > 0
    assert report["query_sqlite"]["points"] == 1440 and report["query_sqlite"]["tier"] == "1m"
    assert "bare driver ceiling" in done.stdout


def test_telemetry_shape_is_canonical_and_deterministic() -> None:
    from store.registry import validate_series

    shape = TelemetryShape(2, seed=5)
    for key in shape.keys:
        validate_series(key)
    assert len(shape.keys) == 2 * 92
    first = [s.value for s in next(TelemetryShape(2, seed=5).samples(0, 1))]
    again = [s.value for s in next(TelemetryShape(2, seed=5).samples(0, 1))]
    assert first == again
