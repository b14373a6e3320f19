"""`hbmwatch bench codec` runs end to end and reports every variant (values not asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from hbmwatch.bench.codecs import CODECS, SPANS


def test_bench_codec_reports_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "codec.json"
    cmd = [sys.executable, "-m", "hbmwatch.cli", "bench", "codec", "--gpus", "1",
           "--nodes", "1", "--minutes", "2", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    for name in ("telemetry", "simulated"):
        data = report[name]
        assert data["series"] > 0 and data["registry_bytes_per_series"] > 0
        variants = data["variants"]
        assert len(variants) == len(CODECS) * len(SPANS)
        for got in variants.values():
            assert 0 < got["blob_bytes_per_sample"] < got["rows_with_stats_bytes_per_sample"]
            assert got["day_bytes_per_sample"] > got["rows_with_stats_bytes_per_sample"]
    telemetry = report["telemetry"]
    assert telemetry["samples"] == telemetry["series"] * 120
    assert telemetry["variants"]["pcodec (v2), per minute"]["chunks"] == telemetry["series"] * 2
    assert "pcodec (v2), per hour" in done.stdout
    if shutil.which("promtool"):  # the baseline: the same samples as a Prometheus block
        assert telemetry["prometheus_block"]["bytes_per_sample"] > 0
