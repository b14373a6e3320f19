"""``hbmwatch bench scale`` end to end on a tiny fleet: real collectors, VictoriaMetrics and
Prometheus.  Checks what the report must always hold, never a speed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hbmwatch.bench.scale import ScaleSpec, bench_scale, cpu_seconds, prometheus_config
from hbmwatch.collector.targets import TargetSet
from hbmwatch.settings import CollectorSettings


def require_binaries() -> None:
    missing = [b for b in ("victoria-metrics", "prometheus") if shutil.which(b) is None]
    if missing:
        message = f"not installed: {', '.join(missing)} (apt-get install ...)"
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


def shards_honoured() -> bool:
    """Whether this collector filters its targets by ``collector.shard`` yet."""
    targets = [{"kind": "dcgm", "url": f"http://127.0.0.1:{9000 + i}/metrics"} for i in range(8)]
    owned = TargetSet(CollectorSettings(targets=targets, shard="0/2"), []).current()
    return len(owned) < len(targets)


def test_tiny_fleet_every_phase_and_every_sample_counted(tmp_path: Path) -> None:
    require_binaries()
    report = bench_scale(ScaleSpec(gpus=16, seconds=3, warmup_s=0.5), workdir=tmp_path)
    phases = {p["name"]: p for p in report["phases"]}
    assert sorted(phases) == ["A", "B", "C"] and not report["skipped"]
    assert report["targets"] == 3  # two node exporters and one training job
    for name, phase in phases.items():
        assert phase["samples"] > 0 and phase["samples_per_second"] > 0, name
        assert phase["cpu_s"]["engine"] >= 0 and phase["cpu_per_million"]["total"] > 0, name
    for name in ("A", "B"):
        p = phases[name]
        assert p["written"] > 0 and p["stored"] == p["written"] and p["all_counted"], p
        assert p["ratio_to_prometheus"] > 0 and p["cpu_s"]["collector"] > 0
    assert phases["A"]["processes"] == 1 and phases["B"]["processes"] == 2
    assert phases["A"]["targets_scraped"] == report["targets"]
    if shards_honoured():
        assert phases["B"]["shards_partition"], phases["B"]
    prom = phases["C"]
    assert prom["page_samples"] < prom["samples"]  # the rest: up and scrape_* series
    assert 0.5 < prom["rounds_kept"] <= 1.05


def test_prometheus_scrapes_the_collectors_pages() -> None:
    targets = [{"kind": "training", "url": "http://127.0.0.1:4000/jobs/j1/metrics",
                "labels": {"rack": "r0"}}]  # fmt: skip
    config = prometheus_config(targets, 0.5)
    assert '"scrape_interval": "500ms"' in config and '"127.0.0.1:4000"' in config
    assert '"__metrics_path__": "/jobs/j1/metrics"' in config and '"rack": "r0"' in config


def test_cpu_seconds_of_this_process() -> None:
    assert cpu_seconds(os.getpid()) > 0
