"""The simulator: determinism, real exposition formats, physics, scenarios and the server."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.collector.spellings import dcgm
from hbmwatch.simulator.faults import intensity
from hbmwatch.simulator.fleet import Fleet
from hbmwatch.simulator.physics import Demand, Physics
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import bundled_scenarios, load_scenario, scenario_from_dict
from hbmwatch.simulator.server import SimServer
from hbmwatch.skus import SKUS
from hbmwatch.validation import ConfigError

START = 1_800_000_000.0  # 08:00 UTC


def small(**extra: object) -> dict:
    scenario = {
        "name": "t",
        "duration": "30m",
        "seed": 5,
        "racks": [
            {"name": "r0", "nodes": 1, "sku": "MI300X"},
            {"name": "r1", "nodes": 1, "sku": "H200", "dcgm_names": "old"},
            {
                "name": "r2",
                "nodes": 1,
                "sku": "MI300X",
                "compute_partition": "cpx",
                "memory_partition": "nps4",
            },
            {"name": "r3", "nodes": 1, "sku": "H100"},
        ],
        "workload": {"training": [{"name": "job", "racks": ["r3"]}]},
    }
    scenario.update(extra)
    return scenario


def all_pages(sim: Simulation) -> list[str]:
    pages = [sim.node_page(i) or "" for i in range(len(sim.fleet.nodes))]
    pages += [sim.service_page(i) for i in range(len(sim.fleet.services))]
    pages += [sim.job_page(i) for i in range(len(sim.fleet.jobs))]
    return pages


# -- determinism ---------------------------------------------------------------------------
def test_same_scenario_and_seed_give_identical_samples_and_truth() -> None:
    scenario = load_scenario("default")
    a = Simulation(scenario, start_unix=START)
    b = Simulation(scenario, start_unix=START)
    for _ in range(90):
        a.step()
        b.step()
    assert all_pages(a) == all_pages(b)
    assert a.ground_truth() == b.ground_truth()
    c = Simulation(scenario, seed=99, start_unix=START)
    for _ in range(90):
        c.step()
    assert all_pages(c) != all_pages(a)


# -- formats -------------------------------------------------------------------------------
def test_every_page_parses_with_prometheus_client() -> None:
    sim = Simulation(scenario_from_dict(small()), start_unix=START)
    for _ in range(5):
        sim.step()
    for page in all_pages(sim):
        families = list(text_string_to_metric_families(page))
        assert families


def _support_matrix_names(fixtures: Path) -> set[str]:
    text = (
        fixtures / "upstream/amd-device-metrics-exporter/metrics-support-matrix.yaml"
    ).read_text()
    return {m.lower() for m in re.findall(r"^\s+- name: (\w+)", text, re.M)}


def test_dme_page_uses_the_exporters_names_and_mandatory_labels(fixtures_dir: Path) -> None:
    known = _support_matrix_names(fixtures_dir) | {"gpu_violation_current_accumulated_counter"}
    sim = Simulation(scenario_from_dict(small()), start_unix=START)
    sim.step()
    families = list(text_string_to_metric_families(sim.node_page(0)))
    for family in families:
        assert family.name in known, family.name
        assert family.type == "gauge"  # the exporter types accumulators as gauges too
        for sample in family.samples:
            if family.name != "gpu_nodes_total":
                for label in (
                    "card_model",
                    "gpu_id",
                    "gpu_partition_id",
                    "gpu_compute_partition_type",
                    "hostname",
                    "serial_number",
                ):
                    assert label in sample.labels
    names = {f.name for f in families}
    for required in (
        "gpu_junction_temperature",
        "gpu_memory_temperature",
        "gpu_hbm_temperature",
        "gpu_violation_hbm_thermal_residency_accumulated",
        "gpu_xgmi_link_rx",
        "gpu_energy_consumed",
        "gpu_umc_activity",
        "gpu_clock",
    ):
        assert required in names
    stacks = {
        s.labels["hbm_index"]
        for f in families
        if f.name == "gpu_hbm_temperature"
        for s in f.samples
    }
    assert stacks == {str(i) for i in range(SKUS["MI300X"].hbm_stacks)}


def test_cpx_partitions_report_physical_sensors_on_partition_0_only() -> None:
    sim = Simulation(scenario_from_dict(small()), start_unix=START)
    sim.step()
    families = {f.name: f for f in text_string_to_metric_families(sim.node_page(2))}
    temps = families["gpu_junction_temperature"].samples
    assert {s.labels["gpu_partition_id"] for s in temps} == {"0"}
    assert len(temps) == 8
    activity = families["gpu_gfx_activity"].samples
    assert len(activity) == 64  # 8 GPUs x 8 CPX partitions
    assert {s.labels["gpu_memory_partition_type"] for s in activity} == {"nps4"}


def _dcgm_known_fields(fixtures: Path) -> set[str]:
    names: set[str] = set()
    folder = fixtures / "upstream"
    for path in [
        *folder.glob("nvidia-dcgm-exporter/*.csv"),
        folder / "datadog-dcgm-exporter-fixture/metrics.txt",
        folder / "nvidia-dcgm-exporter/readme-sample-output.prom",
    ]:
        names |= set(re.findall(r"DCGM_FI_[A-Z0-9_]+", path.read_text()))
    return names


def test_dcgm_page_uses_the_exporters_fields_in_both_generations(fixtures_dir: Path) -> None:
    known = _dcgm_known_fields(fixtures_dir)
    renamed_back = {new: old for old, new in dcgm.RENAMED.items()}
    sim = Simulation(scenario_from_dict(small()), start_unix=START)
    sim.step()
    for node, host_label in ((1, "Hostname"), (3, "hostname")):
        families = list(text_string_to_metric_families(sim.node_page(node)))
        for family in families:
            old = renamed_back.get(family.name, family.name)
            per_link = re.sub(r"_L\d+$", "_L0", old)  # the counter lists name link 0
            per_link = re.sub(r"_COUNT_L\d+$", "_COUNT_TOTAL", per_link)
            assert old in known or per_link in known, family.name
            for sample in family.samples:
                assert {"gpu", "UUID", "modelName", host_label} <= set(sample.labels)
    old_names = {f.name for f in text_string_to_metric_families(sim.node_page(1))}
    new_names = {f.name for f in text_string_to_metric_families(sim.node_page(3))}
    assert "DCGM_FI_DEV_MEMORY_TEMP" in old_names and "DCGM_FI_DEV_GPU_TEMP" in old_names
    assert "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS" in new_names
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in new_names


def test_vllm_page_has_upstream_buckets_and_labels() -> None:
    sim = Simulation(scenario_from_dict(small()), start_unix=START)
    for _ in range(30):
        sim.step()
    families = {f.name: f for f in text_string_to_metric_families(sim.service_page(0))}
    e2e = families["vllm:e2e_request_latency_seconds"]
    assert e2e.type == "histogram"
    edges = [s.labels["le"] for s in e2e.samples if s.name.endswith("_bucket")]
    assert edges[14:16] == ["60.0", "120.0"]  # the coarse jump DOMAIN.md warns about
    assert {"model_name", "engine"} <= set(e2e.samples[0].labels)
    assert "vllm:time_to_first_token_seconds" in families
    assert "vllm:inter_token_latency_seconds" in families
    assert families["vllm:request_success"].samples[0].value > 0


def test_dropout_is_the_dcgm_sentinel_on_nvidia_and_absence_on_amd() -> None:
    faults = [
        {"kind": "sensor_dropout", "target": {"host": "r0-node0", "gpu": 2}, "onset": 0},
        {"kind": "sensor_dropout", "target": {"host": "r1-node0", "gpu": 4}, "onset": 0},
    ]
    sim = Simulation(scenario_from_dict(small(faults=faults)), start_unix=START)
    sim.step()
    amd = {f.name: f for f in text_string_to_metric_families(sim.node_page(0))}
    gpus = {s.labels["gpu_id"] for s in amd["gpu_memory_temperature"].samples}
    assert "2" not in gpus and len(gpus) == 7
    nv = {f.name: f for f in text_string_to_metric_families(sim.node_page(1))}
    values = {s.labels["gpu"]: s.value for s in nv["DCGM_FI_DEV_MEMORY_TEMP"].samples}
    assert dcgm.is_sentinel(values["4"]) and values["3"] < 120
    assert f"}} {dcgm.NOT_SUPPORTED}\n" in sim.node_page(1)  # printed exactly, as DCGM does


# -- physics -------------------------------------------------------------------------------
def _h200_physics() -> tuple[Physics, Simulation]:
    sim = Simulation(
        scenario_from_dict(
            {"name": "cal", "duration": "1h", "racks": [{"name": "r0", "nodes": 1, "sku": "H200"}]}
        ),
        start_unix=START,
    )
    return sim.physics, sim


def test_hbm_calibrated_to_the_real_h200_trace() -> None:
    physics, sim = _h200_physics()
    effects = sim.plan.effects(-1)
    ambient = np.zeros(1)
    n = sim.fleet.size
    idle = Demand(np.full(n, 0.05), np.full(n, 0.05), np.zeros(n))
    copy = Demand(np.full(n, 0.3), np.full(n, 0.88), np.zeros(n))
    for _ in range(600):
        physics.step(0.1, idle, effects, ambient)
    base = physics.mem_temp[0]
    for _ in range(30):  # 3 s of a full-bandwidth HBM copy
        physics.step(0.1, copy, effects, ambient)
    after_3s = physics.mem_temp[0]
    for _ in range(570):
        physics.step(0.1, copy, effects, ambient)
    after_60s = physics.mem_temp[0]
    for _ in range(50):  # 5 s of rest
        physics.step(0.1, idle, effects, ambient)
    rested = physics.mem_temp[0]
    assert 12 <= after_3s - base <= 20  # 41 -> 57 C within about 3 s
    assert 1.5 <= after_60s - after_3s <= 6  # then the slow creep (to 60 C)
    assert rested - base <= 6  # back near 43 C within about 5 s


def test_healthy_fleet_under_steady_load_stays_within_limits() -> None:
    sim = Simulation(load_scenario("healthy"), start_unix=START)
    for _ in range(600):
        sim.step()
        p = sim.physics
        assert (p.mem_temp < p.mem_limit - 10).all()
        assert (p.hot_temp < p.hot_limit - 10).all()
        assert not p.active.any()


def test_coolant_fault_heats_the_whole_rack_throttles_and_relaxes() -> None:
    scenario = load_scenario("coolant_loss")
    fault = scenario.faults[0]
    sim = Simulation(scenario, start_unix=START)
    rack = np.array([g.device.rack == "r0" for g in sim.fleet.gpus])
    sim.advance_to(fault.onset - 1)
    before = sim.physics.mem_temp.copy()
    throttled_at = None
    while sim.t < fault.end:
        sim.step()
        if throttled_at is None and sim.physics.active[rack].any(axis=1).all():
            throttled_at = sim.t
    heated = sim.physics.mem_temp - before
    assert (heated[rack] > 25).all()  # every GPU of the rack
    assert (np.abs(heated[~rack]) < 3).all()  # nobody else
    assert throttled_at is not None and throttled_at - fault.onset <= 300  # within 5 minutes
    sim.advance_to(fault.end + 300)
    assert (np.abs(sim.physics.mem_temp - before)[rack] < 4).all()  # relaxed after the end
    assert not sim.physics.active[rack].any()


def _window_quantiles(before: np.ndarray, after: np.ndarray, edges: tuple) -> tuple[float, float]:
    counts = after - before
    cumulative = np.cumsum(counts) / counts.sum()
    bounds = (*edges, float("inf"))
    p50 = bounds[int(np.searchsorted(cumulative, 0.5))]
    p99 = bounds[int(np.searchsorted(cumulative, 0.99))]
    return p50, p99


def test_noisy_neighbour_raises_p99_with_temperatures_in_their_normal_band() -> None:
    scenario = load_scenario("noisy_neighbour")
    fault = scenario.faults[0]
    sim = Simulation(scenario, start_unix=START)
    gpu = sim.fleet.gpu_index(fault.target.host, fault.target.gpu)
    service = next(s.index for s in sim.fleet.services if s.gpu == gpu)
    w = sim.workloads
    edges = tuple(w.buckets["ttft"])
    sim.advance_to(fault.onset - 300)
    c0 = w.counts["ttft"][service].copy()
    temps_before = []
    while sim.t < fault.onset:
        sim.step()
        temps_before.append(sim.physics.mem_temp[gpu])
    c1 = w.counts["ttft"][service].copy()
    temps_during = []
    sim.advance_to(fault.onset + 60)
    c2 = w.counts["ttft"][service].copy()
    while sim.t < fault.onset + 360:
        sim.step()
        temps_during.append(sim.physics.mem_temp[gpu])
    c3 = w.counts["ttft"][service].copy()
    p50_before, p99_before = _window_quantiles(c0, c1, edges)
    p50_during, p99_during = _window_quantiles(c2, c3, edges)
    assert p99_during >= 2 * p99_before
    assert p50_during == p50_before
    assert max(temps_during) - np.mean(temps_before) < 4  # within the normal band
    assert not sim.physics.active[gpu].any()


def test_power_cap_lowers_clocks_and_power_not_temperature() -> None:
    scenario = load_scenario("power_cap")
    fault = scenario.faults[0]
    sim = Simulation(scenario, start_unix=START)
    gpu = sim.fleet.gpu_index(fault.target.host, fault.target.gpu)
    sim.advance_to(fault.onset - 1)
    temp, clock = sim.physics.mem_temp[gpu], sim.physics.clock_factor[gpu]
    sim.advance_to(fault.onset + 120)
    p = sim.physics
    assert p.power[gpu] <= p.power_limit[gpu] * 1.02
    assert p.clock_factor[gpu] < 0.9 * clock
    assert p.mem_temp[gpu] <= temp
    assert p.active[gpu, 0]  # power reason


def test_degraded_stack_is_hotter_than_its_siblings() -> None:
    scenario = load_scenario("degraded_stack")
    fault = scenario.faults[0]
    sim = Simulation(scenario, start_unix=START)
    gpu = sim.fleet.gpu_index(fault.target.host, fault.target.gpu)
    sim.advance_to(fault.onset + 300)
    stacks = sim.physics.stack_temp[gpu]
    others = np.delete(stacks, fault.target.stack)
    assert stacks[fault.target.stack] - np.nanmax(others) > 8


def test_fabric_degradation_slows_the_training_job_and_counts_errors() -> None:
    scenario = load_scenario("fabric_degradation")
    fault = scenario.faults[0]
    sim = Simulation(scenario, start_unix=START)
    gpu = sim.fleet.gpu_index(fault.target.host, fault.target.gpu)
    sim.advance_to(fault.onset - 1)
    step_before = sim.workloads.job_last_step[0]
    errors_before = sim.physics.fabric_errors[gpu, fault.target.link].sum()
    sim.advance_to(fault.onset + 120)
    assert sim.workloads.job_last_step[0] > 1.3 * step_before
    assert sim.physics.fabric_errors[gpu, fault.target.link].sum() > errors_before + 100


def test_pcie_replay_counter_wraps_at_32_bits() -> None:
    scenario = scenario_from_dict(
        small(
            faults=[
                {
                    "kind": "pcie_replay_storm",
                    "magnitude": 1e6,
                    "target": {"host": "r1-node0", "gpu": 0},
                    "onset": 0,
                }
            ]
        )
    )
    sim = Simulation(scenario, start_unix=START)
    sim.physics.pcie_replays[8] = 2.0**32 - 5e5
    sim.step()
    assert sim.physics.pcie_replays[8] < 2e6  # wrapped past 2^32


def test_intensity_ramps_and_ends() -> None:
    scenario = load_scenario("coolant_loss")
    fault = scenario.faults[0]
    assert intensity(fault, fault.onset - 1) == 0
    assert intensity(fault, fault.onset + fault.ramp / 2) == pytest.approx(0.5)
    assert intensity(fault, fault.end) == 0


# -- scenarios and ground truth --------------------------------------------------------------
def test_bundled_scenarios_load_and_cover_every_fault_kind() -> None:
    from hbmwatch.simulator.scenario import FaultKind

    kinds = set()
    for name in bundled_scenarios():
        scenario = load_scenario(name)
        kinds |= {f.kind for f in scenario.faults}
    assert kinds == set(FaultKind)
    default = load_scenario("default")
    assert 60 <= default.gpus <= 80
    assert {SKUS[r.sku].vendor.value for r in default.racks} == {"amd", "nvidia"}
    assert all(f.onset < 15 * 60 for f in default.faults)


def test_ground_truth_names_what_where_when_and_cause(tmp_path: Path) -> None:
    sim = Simulation(load_scenario("default"), start_unix=START)
    path = tmp_path / "truth.json"
    sim.write_ground_truth(path)
    truth = json.loads(path.read_text())
    assert truth["scenario"] == "default" and truth["gpus"] == sim.fleet.size
    coolant = next(f for f in truth["faults"] if f["kind"] == "coolant_degradation")
    assert coolant["expected_root_cause"] == "cooling" and coolant["thermal_cause"]
    assert len(coolant["affected_gpus"]) == 16
    assert coolant["onset_unix"] == START + 180
    noisy = next(f for f in truth["faults"] if f["kind"] == "noisy_neighbour")
    assert noisy["expected_root_cause"] == "co_tenant" and not noisy["thermal_cause"]
    assert noisy["affected_services"] == ["r2-node0-gpu3"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"duration": "soon"}, "duration: 'soon' is not a duration"),
        ({"racks": [{"name": "r0", "nodes": 1, "sku": "B200"}]}, "unknown sku 'B200'"),
        ({"racks": [{"name": "r0", "nodes": 0, "sku": "H100"}]}, "racks[0].nodes"),
        (
            {"racks": [{"name": "r0", "nodes": 1, "sku": "H100", "colour": "red"}]},
            "racks[0].colour",
        ),
        ({"faults": [{"kind": "meteor", "target": {}, "onset": 0}]}, "faults[0].kind"),
        (
            {"faults": [{"kind": "coolant_degradation", "target": {"rack": "r9"}, "onset": 0}]},
            "faults[0].target.rack: unknown rack 'r9' (racks: r0, r1, r2, r3)",
        ),
        (
            {"faults": [{"kind": "power_cap", "target": {"host": "r0-node0"}, "onset": 0}]},
            "faults[0].target: a power_cap fault needs gpu",
        ),
        (
            {
                "faults": [
                    {
                        "kind": "degraded_stack",
                        "target": {"host": "r1-node0", "gpu": 0, "stack": 7},
                        "onset": 0,
                    }
                ]
            },
            "faults[0].target.stack: H200 has stacks 0-5",
        ),
        (
            {
                "faults": [
                    {
                        "kind": "power_cap",
                        "target": {"host": "r0-node0", "gpu": 0},
                        "onset": "10m",
                        "end": "5m",
                    }
                ]
            },
            "end (300 s) must come after",
        ),
        (
            {
                "faults": [
                    {"kind": "power_cap", "target": {"host": "r0-node0", "gpu": 0}, "onset": "2h"}
                ]
            },
            "faults[0].onset: 7200 s is after the scenario ends",
        ),
    ],
)
def test_bad_scenarios_name_the_field_and_the_problem(change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(small(**change))
    assert message in str(info.value)


def test_bad_scenario_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\nduration = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match=r"not found .* default"):
        load_scenario(tmp_path / "missing.toml")


# -- the server ------------------------------------------------------------------------------
def test_server_serves_every_target_and_503_while_target_down() -> None:
    faults = [{"kind": "target_down", "target": {"host": "r1-node0"}, "onset": 0}]
    sim = Simulation(scenario_from_dict(small(faults=faults)), start_unix=START)

    async def scenario() -> None:
        server = SimServer(sim, speed=100)
        targets = await server.start()
        sim.step()
        try:
            async with httpx.AsyncClient() as client:
                statuses = {}
                for t in targets:
                    r = await client.get(t.url)
                    statuses[t.url] = r.status_code
                    if r.status_code == 200:
                        list(text_string_to_metric_families(r.text))
                down = [
                    t.url for t in targets if t.labels["host"] == "r1-node0" and t.kind == "dcgm"
                ]
                assert statuses[down[0]] == 503
                assert sum(1 for s in statuses.values() if s == 200) == len(targets) - 1
                assert (
                    await client.get(targets[0].url.replace("/metrics", "/nope"))
                ).status_code == 404
                listed = (await client.get(targets[0].url.replace("/metrics", "/targets"))).json()
                assert len(listed) == len(targets)
        finally:
            await server.close()

    asyncio.run(scenario())


def test_fleet_identities_are_unique() -> None:
    fleet = Fleet.build(load_scenario("default"), seed=1)
    assert len({g.device.uuid for g in fleet.gpus}) == fleet.size
    assert len({(g.device.host, g.device.gpu) for g in fleet.gpus}) == fleet.size
