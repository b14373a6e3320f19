"""A real, short ``hbmwatch eval``: the incident table comes out of the whole path.

Simulated exporters over HTTP, the scrape engine, SQLite, the detectors, the alert engine
and delivery over HTTP to the recording webhook receiver; then the JSON report is checked
for the incident-level figures and their consistency with the run's own records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hbmwatch.cli import app
from hbmwatch.evaluation.run import EVAL_START

SCENARIO = """
name = "short_target_down"
description = "One 8-GPU node whose exporter stops answering for a minute"
duration = "3m"
seed = 3
[[racks]]
name = "r0"
nodes = 1
sku = "H200"

[[faults]]
kind = "target_down"
target = { host = "r0-node0" }
onset = "1m"
end = "2m"
"""


@pytest.mark.slow
def test_short_eval_reports_consistent_incident_table(tmp_path: Path) -> None:
    scenario = tmp_path / "short.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "eval.json"
    args = ["eval", str(scenario), "--duration", "180", "--start-hour", "14.5", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output  # 1: a target missed, not a crash
    assert "incident evaluation" in result.output
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["start_unix"] == EVAL_START.replace(hour=14, minute=30).timestamp()
    table = data["incidents"]
    (fault,) = table["faults"]
    assert fault["kind"] == "target_down" and fault["expected_cause"] == "target_down"
    (row,) = table["by_scenario"]
    assert (row["scenario"], row["kind"], row["n"]) == ("short_target_down", "target_down", 1)
    assert table["by_kind"]["target_down"]["n"] == 1
    # The exporter's outage is paged, within the fault, as one incident of its own.
    assert fault["incidents"] and fault["judged"] in fault["incidents"]
    assert fault["page_delay_s"] is not None and 0 <= fault["page_delay_s"] <= 60
    assert row["paged"] == 1.0 and row["one_incident"] == float(fault["one_incident"])
    assert 0 <= table["unexplained_pages"] <= table["pages"]
    assert 1 <= len(fault["incidents"]) <= table["incidents"]
    assert 0 <= table["unexplained_incidents"] <= table["incidents"] - 1
    hours = 8 * 180 / 3600 - 8 * 60 / 3600
    assert table["healthy_gpu_hours"] == pytest.approx(hours)
    assert table["passed"] == all(v is not False for v in table["checks"].values())
