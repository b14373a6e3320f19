"""``hbmwatch bench versus`` end to end on a tiny fleet: hbmwatch's collector into SQLite and
a real Prometheus on the same pages.  Checks what the report must always hold, never a speed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hbmwatch.bench import versus
from hbmwatch.bench.versus import VersusSpec, bench_versus, inference_fleet_toml


def require_prometheus() -> None:
    if shutil.which("prometheus") is None:
        message = "not installed: prometheus (apt-get install --no-install-recommends prometheus)"
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.slow
@pytest.mark.timeout(600)  # four processes and promtool, a minute on two idle cores
def test_tiny_fleet_both_systems_measured_on_the_same_pages(tmp_path: Path) -> None:
    require_prometheus()
    report = bench_versus(VersusSpec(gpus=8, seconds=4, warmup_s=3), workdir=tmp_path)
    assert not report["skipped"] and report["targets"] == 9  # a node page, 8 vLLM pages
    ours, prom = report["phases"]["hbmwatch"], report["phases"]["prometheus"]
    for name, phase in report["phases"].items():
        assert phase["samples"] > 0 and phase["cpu_s"] > 0, name
        assert phase["cpu_per_million"] > 0 and phase["cpu_per_million_page_samples"] > 0, name
        assert 0 < phase["rounds_kept"] <= 1.05, name
        assert 0 <= phase["scrape"]["p50_ms"] <= phase["scrape"]["p99_ms"], name
        assert phase["bytes_per_sample"] > 0, name
        assert phase["range_query"]["series"] == 8, (name, phase["range_query"])  # a p99 each
    assert ours["targets"] == report["targets"]
    assert ours["stored_total"] >= ours["samples"] and ours["written"] >= ours["samples"]
    assert ours["bytes_per_sample_day"] <= ours["bytes_per_sample"]
    # Prometheus stores each page sample and 5 series of its own a target, counted over the
    # same 4 s as its CPU (4 or 5 rounds either way); not over the warm-up too (7 rounds).
    assert 0.6 < prom["samples"] / prom["page_samples"] < 1.4
    assert set(report["ratios"]) >= {"cpu_per_sample_stored", "cpu_per_page_sample"}


def test_without_prometheus_the_baseline_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise versus.EngineUnavailable("prometheus not found on PATH: apt-get install ...")

    def ours(*args: object, **kwargs: object) -> dict[str, object]:  # the first test runs it
        return {"title": "hbmwatch", "cpu_s": 1.0, "window_s": 2.0, "samples": 100}

    monkeypatch.setattr(versus, "prometheus_phase", missing)
    monkeypatch.setattr(versus, "hbmwatch_phase", ours)
    report = bench_versus(VersusSpec(gpus=8, seconds=2, warmup_s=1), workdir=tmp_path)
    assert list(report["phases"]) == ["hbmwatch"] and "ratios" not in report
    assert report["skipped"] == [
        {"phase": "prometheus", "why": "prometheus not found on PATH: apt-get install ..."}
    ]


def test_every_gpu_gets_an_inference_page() -> None:
    toml = inference_fleet_toml(136)  # 17 nodes: two full racks and one of a single node
    assert toml.count("[[racks]]") == 3 and "training" not in toml
    assert "nodes = 1" in toml
