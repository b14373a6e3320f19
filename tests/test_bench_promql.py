"""`hbmwatch bench promql` at a tiny size: the day is generated into both engines, every query
is timed on both, and both answer with the same series (values not asserted here; the
differential suite compares them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hbmwatch.bench.promql import queries, substitute
from hbmwatch.bench.promql_day import DaySpec, Values, families
from hbmwatch.store.registry import validate_series

needs_prometheus = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="needs prometheus and promtool (Prometheus 2.42)",
)


def test_the_day_is_canonical_seeded_and_shaped() -> None:
    spec = DaySpec(gpus=16, hours=1, interval_s=60)
    fams = families(spec)
    for family in fams:
        for key in family.keys:
            validate_series(key)
    assert sum(len(f.keys) for f in fams) == 16 * 46
    one, two = Values(spec, fams).block(0, 60), Values(spec, fams).block(0, 60)
    assert all(np.array_equal(one[m], two[m]) for m in one)
    temp = one["gpu_memory_temperature_celsius"]
    assert np.array_equal(temp, np.round(temp)) and 30 < temp.mean() < 100
    energy = one["gpu_energy_joules_total"]
    assert (np.diff(energy, axis=1) >= 0).mean() > 0.99  # a counter, resets aside
    assert ((one["gpu_utilization_ratio"] >= 0) & (one["gpu_utilization_ratio"] <= 1)).all()


def test_grafana_variables_are_filled_as_grafana_fills_them() -> None:
    spec = DaySpec(gpus=1024, hours=24, interval_s=300)
    expr = 'rate(x{host="$host",gpu="${gpu}"}[$__rate_interval]) + y[$__interval]'
    assert substitute(expr, spec, 300) == 'rate(x{host="node0064",gpu="2"}[1200s]) + y[300s]'
    assert substitute('x{a="$unknown"}', spec, 300) is None
    qs, _ = queries(spec, 300)
    assert qs and all("$" not in q.expr for q in qs)


def dashboard(folder: Path) -> Path:
    """A dashboard with two panels over stored series and one over hbmwatch's own."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = [
        ("fleet", 'max by (rack) (gpu_memory_temperature_celsius{cluster=~"$cluster"})'),
        ("fabric", 'sum by (link) (rate(gpu_fabric_bytes_total{host="$host"}[$__rate_interval]))'),
        ("self", "max(hbmwatch_store_series)"),
    ]
    panels = [{"title": t, "targets": [{"refId": "A", "expr": e}]} for t, e in targets]
    (folder / "board.json").write_text(json.dumps({"panels": [{"panels": panels}]}))
    return folder


def test_dashboard_queries_over_stored_series_are_chosen(tmp_path: Path) -> None:
    qs, skipped = queries(DaySpec(), 300, dashboard(tmp_path))
    assert [q.name for q in qs] == ["board: fleet [A]", "board: fabric [A]"]
    assert qs[1].expr == 'sum by (link) (rate(gpu_fabric_bytes_total{host="node0064"}[1200s]))'
    why = "reads series the bench does not generate (hbmwatch_store_series)"
    assert skipped == [{"query": "board: self [A]", "why": why}]


@pytest.mark.slow
@needs_prometheus
def test_bench_promql_times_every_query_on_both_servers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "hbmwatch.cli", "bench", "promql", "--gpus", "8",
            "--hours", "1", "--interval", "60", "--step", "60", "--runs", "2",
            "--dir", str(tmp_path / "day"), "--json", str(out),
            "--dashboards", str(dashboard(tmp_path / "boards"))]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["load"]["samples"] == 8 * 46 * 60 and report["reused"] is False
    assert [row["query"] for row in report["queries"]] == ["board: fleet [A]", "board: fabric [A]"]
    for row in report["queries"]:
        for server in ("hbmwatch", "prometheus"):
            assert row[server]["p99_ms"] >= row[server]["p50_ms"] > 0, row
            assert "error" not in row[server], row
        assert row["same_series"] and row["same_points"] and row["same_values"], row
    assert any(row["hbmwatch"]["series"] > 0 for row in report["queries"])
    assert "hbmwatch bench promql" in done.stdout and "ratio p50" in done.stdout
    again = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert again.returncode == 0 and json.loads(out.read_text())["reused"] is True
