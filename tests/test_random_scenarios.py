"""``hbmwatch eval --random``: the generator, ramp shapes, the detection-limit table, the CLI."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hbmwatch.cli.main import app
from hbmwatch.evaluation import limits
from hbmwatch.evaluation.limits import DURATION_EDGES, MAGNITUDE_EDGES, Scored
from hbmwatch.evaluation.scoring import healthy_gpu_hours
from hbmwatch.simulator import random_scenarios as rs
from hbmwatch.simulator.faults import FaultPlan, intensity, ramp_shape
from hbmwatch.simulator.fleet import Fleet
from hbmwatch.simulator.scenario import (
    FAULT_SPECS,
    RAMP_SHAPES,
    Fault,
    FaultKind,
    Target,
    load_scenario,
    scenario_from_dict,
)
from hbmwatch.simulator.workloads import JITTER, Workloads
from hbmwatch.skus import SKUS

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def many() -> list[rs.RandomScenario]:
    return rs.draw_scenarios(500, 123)


def test_same_seed_same_scenarios_other_seed_others() -> None:
    a, b = rs.draw_scenarios(8, 101), rs.draw_scenarios(8, 101)
    assert [x.scenario for x in a] == [x.scenario for x in b]
    assert [x.faults for x in a] == [x.faults for x in b]
    other = rs.draw_scenarios(8, 102)
    assert all(x.scenario.faults != y.scenario.faults for x, y in zip(a, other, strict=True))
    assert len({x.scenario.name for x in a}) == 8


def test_every_draw_validates_and_carries_its_draw(many: list[rs.RandomScenario]) -> None:
    for d in many:
        s = d.scenario
        assert scenario_from_dict(s.model_dump()) == s  # the same model and checks as TOML
        assert [f.fault_id for f in d.faults] == [f"fault-{i}" for i in range(len(s.faults))]
        for fault, drawn in zip(s.faults, d.faults, strict=True):
            assert drawn.kind == fault.kind.value and drawn.shape == fault.shape
            assert drawn.duration_s == fault.end - fault.onset  # type: ignore[operator]
            assert 10 <= drawn.duration_s <= 7200 and fault.end <= s.duration  # type: ignore[operator]
            if drawn.rel_magnitude is None:
                assert fault.magnitude is None
            else:
                low, high = rs.RELATIVE_MAGNITUDE[fault.kind]  # type: ignore[misc]
                assert low * 0.95 <= drawn.rel_magnitude <= high * 1.05
                assert math.isclose(rs.magnitude_of(fault.kind, drawn.rel_magnitude),
                                    fault.magnitude, rel_tol=1e-9)  # fmt: skip
        assert s.start is not None and s.gpus <= 12 * 8


def test_draws_cover_every_kind_shape_vendor_and_overlap(many: list[rs.RandomScenario]) -> None:
    faults = [f for d in many for f in d.faults]
    assert set(Counter(f.kind for f in faults)) == {k.value for k in FaultKind}
    assert set(Counter(f.shape for f in faults)) == set(RAMP_SHAPES)
    assert {SKUS[f.sku].vendor for f in faults} == {s.vendor for s in SKUS.values()}
    overlapping = [d for d in many if len(d.faults) == 2]
    assert 0.1 < len(overlapping) / len(many) < 0.3
    for d in overlapping:
        first, second = d.scenario.faults
        assert first.kind != second.kind and first.onset <= second.onset < first.end  # type: ignore[operator]
    durations = [f.duration_s for f in faults]
    assert min(durations) < 30 and max(durations) > 3600  # seconds to hours
    assert any(d.redraws for d in many)  # refused draws happen, and are counted
    cooling = {r.effective_cooling for d in many for r in d.scenario.racks}
    assert cooling == {"air", "dlc"}
    assert {bool(d.scenario.workload.training) for d in many} == {True, False}


def test_two_hundred_draws_hold_a_thousand_healthy_gpu_hours() -> None:
    """The must-hold run's size: >= 1,000 healthy GPU-h for any seed (three checked)."""
    for seed in (7, 8, 9):
        hours = 0.0
        for d in rs.draw_scenarios(200, seed):
            s = d.scenario
            start = s.start.timestamp()  # type: ignore[union-attr]
            truth = FaultPlan(Fleet.build(s, s.seed)).ground_truth(start, {}, {})
            hours += healthy_gpu_hours({"gpus": s.gpus, "start_unix": start,
                                        "faults": truth}, s.duration)  # fmt: skip
        assert hours >= 1000, (seed, hours)


def test_saved_toml_reloads_to_an_equal_scenario(
    tmp_path: Path, many: list[rs.RandomScenario]
) -> None:
    for d in many[:60]:
        path = tmp_path / f"{d.scenario.name}.toml"
        path.write_text(rs.scenario_toml(d.scenario))
        assert load_scenario(path) == d.scenario


def _fault(shape: str = "linear", **extra: object) -> Fault:
    return Fault(kind=FaultKind.POWER_CAP, target=Target(host="r0-node0", gpu=0), onset=100,
                 ramp=40, end=300, **({"shape": shape} if shape != "linear" else {}), **extra)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("linear", [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.0]),
        ("exponential", [0.0, 0.0, 0.0321, 0.1192, 0.3561, 1.0, 1.0, 0.0]),
        ("s_curve", [0.0, 0.0, 0.1562, 0.5, 0.8438, 1.0, 1.0, 0.0]),
        ("step", [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 0.0]),
    ],
)
def test_ramp_shapes(shape: str, expected: list[float]) -> None:
    f = _fault(shape)
    got = [round(intensity(f, t), 4) for t in (99, 100, 110, 120, 130, 140, 299, 300)]
    assert got == expected


def test_linear_is_the_default_and_unchanged() -> None:
    f = _fault()
    assert f.shape == "linear"
    assert [intensity(f, t) for t in (100, 113, 127.5, 139.9)] == [
        min(1.0, (t - 100) / 40) for t in (100, 113, 127.5, 139.9)
    ]
    assert all(ramp_shape(s, 0.0) == 0.0 or s == "step" for s in RAMP_SHAPES)
    assert all(ramp_shape(s, 1.0) == 1.0 for s in RAMP_SHAPES)


def test_noise_knob_scales_jitter_and_defaults_to_the_calibrated() -> None:
    d = rs.draw_scenarios(1, 5)[0].scenario
    calm = d.model_copy(update={"noise": 1.0})
    loud = d.model_copy(update={"noise": 2.5})
    assert Workloads(Fleet.build(calm, 1), 1).jitter_sd == JITTER
    assert Workloads(Fleet.build(loud, 1), 1).jitter_sd == 2.5 * JITTER
    plain = {"name": "x", "duration": 60, "racks": [{"name": "r0", "nodes": 1, "sku": "H200"}]}
    assert scenario_from_dict(plain).noise == 1.0


def test_magnitude_is_relative_to_the_default_size() -> None:
    for kind, spec in FAULT_SPECS.items():
        if rs.RELATIVE_MAGNITUDE[kind] is not None:
            assert math.isclose(rs.magnitude_of(kind, 1.0), spec["magnitude"])
    assert rs.magnitude_of(FaultKind.POWER_CAP, 0.5) == pytest.approx(0.775)  # half the cut
    assert rs.magnitude_of(FaultKind.DEGRADED_STACK, 0.5) == pytest.approx(2.0)


# -- the detection-limit table --------------------------------------------------------------
def _scored(kind: str, rel: float | None, duration: float, found: bool, i: int) -> Scored:
    draw = rs.FaultDraw(f"s{i}", "fault-0", kind, rel, duration, 0.0, "linear", "H200", False)
    return Scored(draw, found)


def test_binning_and_the_half_recall_crossing() -> None:
    items = []
    # Long power caps: found at 1.0x and 0.6x, half at 0.4x (0.35-0.5 bin), never at 0.25x.
    for i, (rel, hit) in enumerate([(1.2, 1), (1.2, 1), (0.6, 1), (0.6, 1), (0.4, 1), (0.4, 0),
                                    (0.25, 0), (0.25, 0)]):  # fmt: skip
        items.append(_scored("power_cap", rel, 900.0, bool(hit), i))
    # Big but short ones: found only from 120 s on.
    for i, (dur, hit) in enumerate([(20, 0), (45, 0), (90, 0), (200, 1), (400, 1)]):
        items.append(_scored("power_cap", 1.2, float(dur), bool(hit), 100 + i))
    table = limits.limit_table("power_cap", items)
    assert limits.bin_of(7200.0, DURATION_EDGES) == len(DURATION_EDGES) - 2  # the longest drawn
    assert limits.bin_of(3.0, MAGNITUDE_EDGES) == len(MAGNITUDE_EDGES) - 2
    assert (
        limits.bin_of(0.05, MAGNITUDE_EDGES) is None
        and limits.bin_of(None, MAGNITUDE_EDGES) is None
    )
    cols = {label: j for j, label in enumerate(limits.labels(DURATION_EDGES, " s"))}
    rows = {label: j for j, label in enumerate(limits.labels(MAGNITUDE_EDGES))}
    assert table.cells[rows["0.35-0.5"]][cols["600-1800 s"]] == (1, 2)
    assert table.cells[rows["1-1.5"]][cols["600-1800 s"]] == (2, 2)
    assert table.cells[rows["1-1.5"]][cols["10-30 s"]] == (0, 1)
    assert table.cells[rows["0.2-0.35"]][cols["600-1800 s"]] == (0, 2)
    # By magnitude (long ones): 1.0 in 0.5-0.7, 0.5 in 0.35-0.5, 0 in 0.2-0.35: crossing at
    # the 0.35-0.5 bin's centre exactly (recall 0.5 there).
    assert table.magnitude_at_half == pytest.approx(math.sqrt(0.35 * 0.5))
    # By duration (big ones): 1.0 at 120-300 s, 0 at 60-120 s: halfway between the centres.
    expected = math.exp((math.log(math.sqrt(120 * 300)) + math.log(math.sqrt(60 * 120))) / 2)
    assert table.duration_at_half == pytest.approx(expected)
    assert table.above == (2, 2)  # DETECTABLE power_cap: >= 1x and >= 600 s
    assert limits.crossing(MAGNITUDE_EDGES, [(1, 1)] * 7) == (None, pytest.approx(
        "n/a (recall at or above 0.5 down to the smallest bin)"))  # fmt: skip
    assert limits.crossing(MAGNITUDE_EDGES, [(0, 0)] * 7)[1] == "no faults"


def test_limits_report_joins_outcomes_by_scenario_and_fault() -> None:
    from hbmwatch.evaluation.incident_scoring import IncidentOutcome

    draws = [d for r in rs.draw_scenarios(3, 11) for d in r.faults]
    outcomes = []
    for d in draws:
        o = IncidentOutcome(d.scenario, 0, d.fault_id, d.kind, "x")
        o.one_incident, o.page_delay_s, o.top1 = True, 12.0, d is draws[0]
        outcomes.append(o)
    report = limits.limits_report(draws, outcomes, unexplained_rate=0.0, healthy_gpu_hours=10)
    assert [s.found for s in report.faults] == [d is draws[0] for d in draws]
    data = report.to_json()
    assert data["overall"]["n"] == len(draws) and "detectable" in data
    text = "\n".join(limits.summary_lines(report))
    assert "alone / overlapping another fault" in text and "unexplained pages" in text


# -- docs and the command -------------------------------------------------------------------
def test_docs_show_the_distributions_the_code_draws_from() -> None:
    assert rs.distributions_markdown() in (DOCS / "simulator.md").read_text()
    assert "Randomised scenarios: detection limits" in (DOCS / "detection.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["default", "--random", "2", "--seed", "101"], "not both"),
        ([], "or --random N --seed S"),
        (["--random", "2"], "exactly one --seed"),
        (["default", "--save-scenarios", "x"], "goes with --random"),
    ],
)
def test_eval_random_arguments(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_eval_random_end_to_end_and_a_saved_draw_reruns_identically(tmp_path: Path) -> None:
    runner = CliRunner()
    out, saved = tmp_path / "r.json", tmp_path / "draws"
    result = runner.invoke(app, ["eval", "--random", "1", "--seed", "101", "--duration", "40",
                                 "--json", str(out), "--save-scenarios", str(saved)])  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    assert "detection limits, all" in result.output and "random-101-000 seed" in result.output
    data = json.loads(out.read_text())
    assert data["random"]["draws"][0]["scenario"] == "random-101-000"
    assert {"overall", "detectable", "above_limits_recall"} <= set(data["limits"])
    again = tmp_path / "again.json"
    result = runner.invoke(app, ["eval", str(saved / "random-101-000.toml"), "--duration", "40",
                                 "--json", str(again)])  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    first, second = data["runs"][0], json.loads(again.read_text())["runs"][0]
    assert first["truth"] == second["truth"] and first["samples"] == second["samples"]
    assert first["findings"] == second["findings"]
