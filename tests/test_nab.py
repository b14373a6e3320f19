"""``hbmwatch nab``: NAB's data layout in, NAB's result files out, scored by NAB's sweeper."""

from __future__ import annotations

import csv
import json
import types
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hbmwatch.cli import app
from hbmwatch.detectors.generic_model import SeriesModel, score_series
from hbmwatch.evaluation import nab
from tests.conftest import FIXTURES

NAB = FIXTURES / "upstream" / "nab"
STANDARD = {"tpWeight": 1.0, "fnWeight": 1.0, "fpWeight": 0.11, "tnWeight": 1.0}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nab") / "results"
    run = CliRunner().invoke(app, ["nab", str(NAB / "data"), "--out", str(out)])
    assert run.exit_code == 0, run.output
    return out


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _result(results: Path, relative: str) -> Path:
    category, name = relative.split("/")
    return results / "hbmwatch" / category / f"hbmwatch_{name}"


@pytest.mark.parametrize("relative", sorted(json.loads((NAB / "windows.json").read_text())))
def test_nab_writes_nab_results_one_row_per_input_row(results: Path, relative: str) -> None:
    data = _rows(NAB / "data" / relative)
    out = _rows(_result(results, relative))
    assert out[0] == ["timestamp", "value", "anomaly_score", "label"]
    assert len(out) == len(data)
    assert [r[0] for r in out[1:]] == [r[0] for r in data[1:]]
    assert [float(r[1]) for r in out[1:]] == [float(r[1]) for r in data[1:]]
    scores = np.array([float(r[2]) for r in out[1:]])
    assert ((scores >= 0) & (scores <= 1)).all()
    f = nab.read_file(*relative.split("/")[:1], NAB / "data" / relative)
    assert np.allclose(scores, score_series(f.t_ms, f.values), atol=1e-6)


def _sweeper() -> types.ModuleType:
    """NAB's own per-file scorer (nab/sweeper.py, vendored unchanged)."""
    module = types.ModuleType("nab_sweeper")
    exec((NAB / "sweeper.py.txt").read_text(), module.__dict__)
    return module


def test_nab_scorer_finds_each_window_at_alert_score(results: Path) -> None:
    """NAB's sweeper, at the model's fixed ``alert_score``, scores every fixture file (one
    window each) above 0, where a missed window costs 1: our files are what NAB reads, and
    the windows are found with few false positives."""
    sweeper = _sweeper().Sweeper(probationPercent=0.15, costMatrix=STANDARD)
    for relative, windows in json.loads((NAB / "windows.json").read_text()).items():
        rows = _rows(_result(results, relative))[1:]
        stamps = [datetime.fromisoformat(r[0]) for r in rows]
        limits = [tuple(datetime.fromisoformat(t) for t in w) for w in windows]
        scores = [float(r[2]) for r in rows]
        _, row = sweeper.scoreDataSet(stamps, scores, limits, relative, SeriesModel.alert_score)
        assert row.tp >= 1 and row.score > 0, (relative, row)


def test_nab_refuses_a_folder_that_is_not_nab_layout(tmp_path: Path) -> None:
    (tmp_path / "flat.csv").write_text("timestamp,value\n2014-01-01 00:00:00,1\n")
    run = CliRunner().invoke(app, ["nab", str(tmp_path), "--out", str(tmp_path / "o")])
    assert run.exit_code == 2 and "not NAB's data layout" in run.output
    assert "Traceback" not in run.output


def test_nab_refuses_a_file_without_timestamp_value(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "x.csv").write_text("time,v\n2014-01-01 00:00:00,1\n")
    run = CliRunner().invoke(app, ["nab", str(tmp_path), "--out", str(tmp_path / "o")])
    assert run.exit_code == 2 and "not 'timestamp,value'" in run.output


def test_nab_half_keeps_every_other_file(tmp_path: Path) -> None:
    """``--half even|odd``: the development and held-out halves, by sorted index."""
    run = CliRunner().invoke(
        app, ["nab", str(NAB / "data"), "--half", "odd", "--out", str(tmp_path)]
    )
    assert run.exit_code == 0, run.output
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.csv"))
    assert written == ["hbmwatch/realKnownCause/hbmwatch_ec2_request_latency_system_failure.csv"]
    bad = CliRunner().invoke(app, ["nab", str(NAB / "data"), "--half", "third"])
    assert bad.exit_code == 2 and "use one of even, odd" in bad.output
