"""`hbmwatch bench store` runs end to end and reports every figure (values not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hbmwatch.bench.benchmarks import TelemetryShape


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
    from hbmwatch.store.registry import validate_series

    shape = TelemetryShape(2, seed=5)
    for key in shape.keys:
        validate_series(key)
    assert len(shape.keys) == 2 * 92
    first = [s.value for s in next(TelemetryShape(2, seed=5).samples(0, 1))]
    again = [s.value for s in next(TelemetryShape(2, seed=5).samples(0, 1))]
    assert first == again


def test_bench_api_loads_a_fleet_day_and_times_both_reads(tmp_path: Path) -> None:
    from hbmwatch.bench.api import bench_api

    db = tmp_path / "api.db"
    report = bench_api(gpus=8, hours=2, db=db, requests=6, warmup=2)
    load, local, http = report["load"], report["in_process"], report["http"]
    assert not report["reused"] and report["db_bytes"] > 0
    assert load["series"] == 8 * load["series_per_gpu"] and load["simulated_series"] > 0
    assert load["fine_series"] == 8  # each GPU's memory temperature, every second
    assert load["samples"] == (load["series"] - 8) * 120 + 8 * 120 * 60
    assert load["chunk_rows"] == load["series"] * 120
    assert 10 <= report["incident"]["alerts"] <= 50 and report["incident"]["causes"] >= 2
    assert http is not None, report.get("http_error")
    for reads in (local, http):
        assert reads["tier"] == "1m"
        assert reads["first_read"]["returned"] == reads["query_range"]["returned"] == [120]
        assert reads["first_read"]["requests"] == 4  # every GPU once, half each way
        assert reads["incident"]["returned"] == [report["incident"]["alerts"]]
        for timing in (reads["query_range"], reads["incident"]):
            assert timing["requests"] == 6
            assert 0 < timing["p50_ms"] <= timing["p99_ms"] <= timing["max_ms"]
    assert http["query_range"]["bytes"] > 0 and http["incident"]["bytes"] > 0
    assert report["met"] in (True, False)

    # The CLI reuses the loaded day while its parameters match.
    out = tmp_path / "api.json"
    cmd = [sys.executable, "-m", "hbmwatch.cli", "bench", "api", "--gpus", "8", "--hours", "2",
           "--db", str(db), "--requests", "3", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    again = json.loads(out.read_text())
    assert again["reused"] and again["incident"]["id"] == report["incident"]["id"]
    assert "incident detail, HTTP" in done.stdout and "first read" in done.stdout


def test_bench_api_refuses_a_database_it_did_not_build(tmp_path: Path) -> None:
    from hbmwatch.bench.api import ensure_loaded
    from hbmwatch.validation import HbmwatchError

    db = tmp_path / "someone-elses.db"
    db.write_bytes(b"")
    with pytest.raises(HbmwatchError, match="--rebuild"):
        ensure_loaded(db, gpus=8, hours=1, interval=60, seed=1, rebuild=False)


@pytest.mark.parametrize("kind", ["dme", "dcgm"])
def test_bench_collect_pods_pages_carry_pods_and_yield_attribution(kind: str) -> None:
    """``--pods`` measures what it says: pod labels on the page, gpu_workload_info out."""
    from hbmwatch.bench.benchmarks import _page_of, parse_rates
    from hbmwatch.collector.sources.dcgm import DcgmTranslator
    from hbmwatch.collector.sources.dme import DmeTranslator

    plain, pods = _page_of(kind, 8), _page_of(kind, 8, pods=True)
    assert 'pod="' not in plain and 'pod="' in pods
    translator = DmeTranslator() if kind == "dme" else DcgmTranslator()
    metrics = {s.series.metric for s in translator.translate_text(pods, 0).samples}
    assert "gpu_workload_info" in metrics
    with_pods = parse_rates(kind, 8, rounds=2, pods=True)
    assert with_pods["bytes"] > parse_rates(kind, 8, rounds=2)["bytes"]
