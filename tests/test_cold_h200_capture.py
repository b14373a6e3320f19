"""``score-file``'s hold options on the real H200 capture (docs/device-runs/2026-11-26-h200-trace).

What scoring the capture must find, whole and cut to a cold start, is its expected.toml's
matter (tests/test_device_captures.py); this module keeps the CLI's options.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).parent.parent / "docs" / "device-runs" / "2026-11-26-h200-trace"
FILES = ("nvml_samples.csv", "latency.csv")


@pytest.mark.slow
@pytest.mark.parametrize(("hold", "found"), [("5", True), ("200", False)])
def test_score_file_takes_the_hold_for_a_short_capture(
    tmp_path: Path, hold: str, found: bool
) -> None:
    """``--hold`` / ``--min-hold``: a user may ask for a hold longer than the copy lasted."""
    out = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", *[str(FOLDER / n) for n in FILES],
         "--merge", "--out", str(tmp_path), "--warmup", "60", "--hold", hold,
         "--min-hold", hold],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "nvml_samples.findings.json").read_text())
    assert any(f["kind"] == "p99_regression" for f in doc["findings"]) is found
    bad = subprocess.run(
        [sys.executable, "-m", "hbmwatch.cli", "score-file", str(FOLDER / FILES[0]),
         "--warmup", "-1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "--warmup" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
