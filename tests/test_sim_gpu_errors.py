"""The simulator's GPU errors and pods: XIDs, AFIDs, row remapping, health, pod labels, moves.

Pages are read with prometheus_client's parser (the text format) and checked against what
the real exporters write (common.md's formats: dcgm-exporter's last-XID gauge with
err_code/err_msg, pod labels on every device line; DME's gpu_afid_errors and gpu_health).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.collector.spellings import dcgm
from hbmwatch.gpu_errors import Action, lookup
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import load_scenario, scenario_from_dict
from hbmwatch.taxonomy import Cause, FindingKind
from hbmwatch.validation import ConfigError

START = 1_800_000_000.0
Sample = tuple[str, dict[str, str], float]


def scenario(faults: list[dict[str, Any]], moves: list[dict[str, Any]] | None = None,
             pods: bool = True, per_node: int | None = None) -> dict[str, Any]:  # fmt: skip
    racks = [
        {"name": "r0", "nodes": 1, "sku": "H200", "pods": pods, "services_per_node": per_node},
        {"name": "r1", "nodes": 1, "sku": "MI300X", "pods": pods, "services_per_node": per_node},
    ]
    racks = [{k: v for k, v in r.items() if v is not None} for r in racks]
    return {"name": "t", "duration": "10m", "seed": 3, "racks": racks, "faults": faults,
            "moves": moves or []}  # fmt: skip


def sim_of(data: dict[str, Any]) -> Simulation:
    return Simulation(scenario_from_dict(data), start_unix=START)


def samples(sim: Simulation, node: int) -> list[Sample]:
    page = sim.node_page(node) or ""
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(page)
            for s in f.samples]  # fmt: skip


def dcgm_name(old: str) -> str:
    """A field as DCGM 4.6 spells it (the racks' default)."""
    return dcgm.RENAMED.get(old, old)


def value(sim: Simulation, node: int, name: str, **labels: str) -> float | None:
    name = dcgm_name(name)
    found = [v for n, lab, v in samples(sim, node) if n == name
             and all(lab.get(k) == x for k, x in labels.items())]  # fmt: skip
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def run_to(sim: Simulation, t: float, each: Callable[[Simulation], None] | None = None) -> None:
    while sim.t < t - 1e-9:
        sim.step()
        if each is not None:
            each(sim)


def xid_fatal(host: str = "r0-node0", gpu: int = 2, **extra: Any) -> dict[str, Any]:
    return {"kind": "xid_fatal", "target": {"host": host, "gpu": gpu}, "onset": "60s", **extra}


# -- xid_fatal ------------------------------------------------------------------------------
def test_xid_79_then_blank_fields_on_nvidia_and_only_that_gpu() -> None:
    sim = sim_of(scenario([xid_fatal()]))
    run_to(sim, 50)
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="2", err_code="0",
                 err_msg="No Error") == 0  # fmt: skip
    run_to(sim, 62)
    msg = lookup("xid", 79).meaning
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="2", err_code="79", err_msg=msg) == 79
    power = value(sim, 0, "DCGM_FI_DEV_POWER_USAGE", gpu="2")
    assert power is not None and power < 2000  # not blank yet
    run_to(sim, 75)  # the default magnitude: blank 10 s after the XID
    assert value(sim, 0, "DCGM_FI_DEV_POWER_USAGE", gpu="2") == dcgm.NOT_SUPPORTED
    assert value(sim, 0, "DCGM_FI_DEV_GPU_TEMP", gpu="2") == dcgm.NOT_SUPPORTED
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 79  # the event stays shown
    assert value(sim, 0, "DCGM_FI_DEV_POWER_USAGE", gpu="3") < 2000
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 0


def test_a_gpu_off_the_bus_stalls_its_service() -> None:
    sim = sim_of(scenario([xid_fatal(onset="120s")]))
    svc = next(s.index for s in sim.fleet.services if s.name == "r0-node0-gpu2")
    peer = next(s.index for s in sim.fleet.services if s.name == "r0-node0-gpu3")
    w = sim.workloads

    def window(t0: float, t1: float) -> dict[str, np.ndarray]:
        run_to(sim, t0)
        before = (w.requests.copy(), w.sums["e2e"].copy(), w.counts["e2e"].sum(axis=1).copy())
        run_to(sim, t1)
        n = w.counts["e2e"].sum(axis=1) - before[2]
        return {"requests": w.requests - before[0], "mean": (w.sums["e2e"] - before[1]) / n}

    healthy, stalled = window(30, 110), window(130, 210)
    assert stalled["requests"][svc] < 0.2 * healthy["requests"][svc]  # throughput falls
    assert stalled["mean"][svc] > 5 * healthy["mean"][svc]  # what finishes waited long
    assert stalled["requests"][peer] > 0.7 * healthy["requests"][peer]  # the peer is fine


def test_amd_fatal_ras_event_shows_afids_health_and_then_no_lines() -> None:
    sim = sim_of(scenario([xid_fatal(host="r1-node0", gpu=4)]))
    run_to(sim, 50)
    assert value(sim, 1, "gpu_health", gpu_id="4") == 1
    assert not [s for s in samples(sim, 1) if s[0] == "gpu_afid_errors"]
    run_to(sim, 62)
    afids = {(lab["afid_index"], lab["severity"], v) for n, lab, v in samples(sim, 1)
             if n == "gpu_afid_errors"}  # fmt: skip
    assert afids == {("0", "fatal", 30.0), ("1", "fatal", 25.0)}
    assert value(sim, 1, "gpu_health", gpu_id="4") == 0
    assert value(sim, 1, "gpu_health", gpu_id="5") == 1
    run_to(sim, 75)
    lines = {n for n, lab, _ in samples(sim, 1) if lab.get("gpu_id") == "4"}
    assert lines == {"gpu_afid_errors", "gpu_health"}  # DME cannot read the rest


# -- xid_storm ------------------------------------------------------------------------------
def test_storm_changes_the_last_xid_thirty_times_a_minute_with_benign_codes() -> None:
    storm = {"kind": "xid_storm", "target": {"host": "r0-node0", "gpu": 5}, "onset": "60s",
             "end": "180s"}  # fmt: skip
    sim = sim_of(scenario([storm]))
    seen: list[float] = []
    run_to(sim, 240, lambda s: seen.append(value(s, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="5")))
    changes = [(i, b) for i, (a, b) in enumerate(itertools.pairwise(seen)) if a != b]
    in_storm = [c for c in changes if 60 <= c[0] < 180]
    assert len(in_storm) == pytest.approx(60, abs=2)  # 30 a minute for two minutes
    assert {int(b) for _, b in changes} == {13, 31, 43}
    assert all(lookup("xid", c).action is Action.BENIGN for c in (13, 31, 43))
    assert not [c for c in changes if c[0] >= 181]  # the storm ended
    assert value(sim, 0, "DCGM_FI_DEV_POWER_USAGE", gpu="5") < 2000  # nothing physical


# -- row_remap_failure ----------------------------------------------------------------------
def test_row_remap_failure_rows_rise_pending_then_failure_and_xid_64() -> None:
    remap = {"kind": "row_remap_failure", "target": {"host": "r0-node0", "gpu": 1},
             "onset": "60s", "ramp": "60s"}  # fmt: skip
    sim = sim_of(scenario([remap]))
    run_to(sim, 50)
    assert value(sim, 0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS_total", gpu="1") == 0
    run_to(sim, 90)
    rows = value(sim, 0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS_total", gpu="1")
    assert rows is not None and 1 <= rows < 4
    assert value(sim, 0, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 1
    assert value(sim, 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 0
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    run_to(sim, 125)
    assert value(sim, 0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS_total", gpu="1") == 4
    assert value(sim, 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 1
    assert value(sim, 0, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 0
    assert value(sim, 0, "DCGM_FI_DEV_XID_ERRORS", gpu="1", err_code="64") == 64
    assert value(sim, 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="0") == 0


# -- pods -----------------------------------------------------------------------------------
def test_pods_on_every_device_line_as_the_exporters_write_them() -> None:
    sim = sim_of(scenario([], per_node=6))
    sim.step()
    for node, expected in ((0, {"container", "namespace", "pod", "pod_uid"}),
                           (1, {"container", "namespace", "pod", "job_id"})):  # fmt: skip
        for name, labels, _ in samples(sim, node):
            gpu = labels.get("gpu", labels.get("gpu_id"))
            if gpu is None:
                continue
            if int(gpu) < 6:
                assert expected <= set(labels), (name, labels)
                assert labels["pod"].startswith(f"{sim.fleet.nodes[node].host}-gpu{gpu}-")
                assert labels["namespace"] == "inference" and labels["container"] == "vllm"
            else:  # an idle GPU: no pod uses it, so no pod labels
                assert "pod" not in labels, (name, labels)


def test_without_pods_or_error_faults_no_new_lines_or_labels() -> None:
    sim = sim_of(scenario([], pods=False))
    sim.step()
    for node in (0, 1):
        for name, labels, _ in samples(sim, node):
            assert "pod" not in labels and "XID" not in name and "REMAP" not in name
            assert name not in ("gpu_afid_errors", "gpu_health")
    assert "moves" not in sim.ground_truth()
    assert all("affected_pods" not in f for f in sim.ground_truth()["faults"])


def test_a_pod_move_renames_the_pod_and_the_load_follows() -> None:
    move = {"at": "60s", "from": {"host": "r0-node0", "gpu": 1},
            "to": {"host": "r0-node0", "gpu": 7}}  # fmt: skip
    sim = sim_of(scenario([], moves=[move], per_node=6))
    run_to(sim, 55)
    before = value(sim, 0, "DCGM_FI_DEV_GPU_UTIL", gpu="1")
    pod = next(lab["pod"] for n, lab, _ in samples(sim, 0) if lab.get("gpu") == "1")
    assert value(sim, 0, "DCGM_FI_DEV_GPU_UTIL", gpu="7") < 10 < (before or 0)
    run_to(sim, 120)
    labels = {lab.get("gpu"): lab.get("pod") for n, lab, _ in samples(sim, 0)}
    assert labels["1"] is None and labels["7"] not in (None, pod)
    assert labels["7"].rsplit("-", 1)[0] == pod.rsplit("-", 1)[0]  # same ReplicaSet
    assert value(sim, 0, "DCGM_FI_DEV_GPU_UTIL", gpu="1") < 10
    assert (value(sim, 0, "DCGM_FI_DEV_GPU_UTIL", gpu="7") or 0) > 10
    truth = sim.ground_truth()
    assert truth["faults"] == [] and truth["moves"][0]["affected_gpus"][1]["gpu"] == "7"


def test_a_move_onto_a_busy_gpu_swaps_the_two() -> None:
    move = {"at": "30s", "from": {"host": "r0-node0", "gpu": 0},
            "to": {"host": "r0-node0", "gpu": 1}}  # fmt: skip
    sim = sim_of(scenario([], moves=[move]))
    sim.step()
    first = {lab.get("gpu"): lab.get("pod") for n, lab, _ in samples(sim, 0)}
    run_to(sim, 40)
    then = {lab.get("gpu"): lab.get("pod") for n, lab, _ in samples(sim, 0)}
    assert then["0"].startswith("r0-node0-gpu1-") and then["1"].startswith("r0-node0-gpu0-")
    assert {then["0"], then["1"]}.isdisjoint({first["0"], first["1"]})
    assert then["2"] == first["2"]


# -- ground truth and scenarios -------------------------------------------------------------
def test_ground_truth_names_the_cause_findings_and_pods_on_the_gpu() -> None:
    sim = sim_of(scenario([xid_fatal()]))
    sim.step()
    pod = next(lab["pod"] for n, lab, _ in samples(sim, 0) if lab.get("gpu") == "2")
    (fault,) = sim.ground_truth()["faults"]
    assert fault["expected_root_cause"] == Cause.GPU_ERROR
    assert fault["expected_findings"] == [FindingKind.GPU_ERRORS, FindingKind.P99_REGRESSION]
    assert fault["affected_pods"] == [pod] and fault["affected_services"] == ["r0-node0-gpu2"]


@pytest.mark.parametrize("name", ["xid_fatal", "xid_storm", "row_remap_failure", "pods_moving"])
def test_bundled_scenarios_put_faults_on_gpus_that_run_pods(name: str) -> None:
    sim = Simulation(load_scenario(name), start_unix=START)
    sim.step()
    truth = sim.ground_truth()
    for fault in truth["faults"]:
        assert fault["affected_services"] and fault["affected_pods"], fault
    assert bool(truth.get("moves")) == (name == "pods_moving")
    assert (truth["faults"] == []) == (name == "pods_moving")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"faults": [{"kind": "row_remap_failure", "target": {"host": "r1-node0", "gpu": 0},
                      "onset": 10}]}, "NVIDIA GPUs only"),
        ({"faults": [{"kind": "xid_storm", "target": {"host": "r1-node0", "gpu": 0},
                      "onset": 10}]}, "needs codes"),
        ({"faults": [{"kind": "xid_fatal", "target": {"host": "r0-node0"}, "onset": 10}]},
         "xid_fatal fault needs gpu"),
        ({"moves": [{"at": 10, "from": {"host": "r9-node0", "gpu": 0},
                     "to": {"host": "r0-node0", "gpu": 1}}]}, "unknown host 'r9-node0'"),
        ({"moves": [{"at": 10, "from": {"host": "r0-node0", "gpu": 0},
                     "to": {"host": "r1-node0", "gpu": 1}}]}, "one vendor"),
        ({"moves": [{"at": 9999, "from": {"host": "r0-node0", "gpu": 0},
                     "to": {"host": "r0-node0", "gpu": 1}}]}, "not within the run"),
    ],
)  # fmt: skip
def test_bad_error_faults_and_moves_say_what_is_wrong(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        scenario_from_dict({**scenario([]), **change})
    assert "\n" not in str(err.value)


# -- through the real collector -------------------------------------------------------------
class _ListSink:
    """The part of a BatchingSink that a scrape round uses."""

    def __init__(self) -> None:
        self.samples: list[Any] = []

    def add(self, samples: list[Any]) -> None:
        self.samples.extend(samples)


async def _collect(sim: Simulation, steps: int, last_round: bool = False) -> list[Any]:
    """The samples the real collector writes from the fleet's exporter pages over ``steps``
    lockstep rounds (only the last round's with ``last_round``)."""
    from hbmwatch.collector.engine import ScrapeEngine
    from hbmwatch.collector.targets import Target, TargetSet
    from hbmwatch.settings import CollectorSettings
    from hbmwatch.simulator.inprocess import InProcessServer

    server = InProcessServer(sim)
    served = await server.start()
    settings = CollectorSettings()
    targets = [Target(t.kind, t.url, dict(t.labels), 1.0, 60.0) for t in served
               if t.kind in ("dcgm", "dme")]  # fmt: skip
    sink = _ListSink()
    engine = ScrapeEngine(TargetSet(settings, targets), sink, settings,  # type: ignore[arg-type]
                          clock=lambda: sim.now_unix, transport=server.transport())  # fmt: skip
    try:
        for _ in range(steps):
            sim.step()
            if last_round:
                sink.samples.clear()
            await engine.scrape_round(round(sim.now_unix * 1000))
    finally:
        await engine.close()
    return sink.samples


async def _scrape(
    sim: Simulation, steps: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The last value of every series the collector wrote, by metric and a few labels."""
    keep = ("host", "gpu", "scheme", "code", "check", "severity", "reason")
    return {(s.series.metric, tuple((k, v) for k, v in sorted(s.series.labels) if k in keep)):
            s.value for s in await _collect(sim, steps)}  # fmt: skip


def test_the_collector_reads_the_simulated_errors_as_canonical_series() -> None:
    import asyncio

    faults = [
        xid_fatal(onset="20s"),
        {"kind": "xid_storm", "target": {"host": "r0-node0", "gpu": 3}, "onset": "10s",
         "end": "60s"},
        {"kind": "row_remap_failure", "target": {"host": "r0-node0", "gpu": 4}, "onset": "10s",
         "ramp": "20s"},
        xid_fatal(host="r1-node0", gpu=1, onset="20s"),
    ]  # fmt: skip
    got = asyncio.run(_scrape(sim_of(scenario(faults)), 70))

    def events(host: str, gpu: str, scheme: str, code: int) -> float | None:
        key = (("code", str(code)), ("gpu", gpu), ("host", host), ("scheme", scheme))
        return got.get(("gpu_error_events_total", key))

    assert events("r0-node0", "2", "xid", 79) == 1
    assert events("r0-node0", "4", "xid", 64) == 1
    assert events("r1-node0", "1", "afid", 30) == events("r1-node0", "1", "afid", 25) == 1
    storm = sum(events("r0-node0", "3", "xid", c) or 0 for c in (13, 31, 43))
    assert storm == pytest.approx(25, abs=1)  # 50 s at 30 a minute, every one seen
    remap = (("gpu", "4"), ("host", "r0-node0"))
    assert got[("gpu_row_remap_failed", remap)] == 1
    assert got[("gpu_row_remaps_total", (*remap, ("severity", "uncorrectable")))] == 4
    health = ("gpu_health_status", (("check", "overall"), ("gpu", "1"), ("host", "r1-node0")))
    assert got[health] == 2  # fail
    sentinels = ("hbmwatch_scrape_dropped_total", (("host", "r0-node0"), ("reason", "sentinel")))
    assert got[sentinels] > 0  # the GPU off the bus


def test_the_collector_reads_the_simulated_pods_and_follows_a_move() -> None:
    import asyncio

    move = {"at": "20s", "from": {"host": "r0-node0", "gpu": 1},
            "to": {"host": "r0-node0", "gpu": 7}}  # fmt: skip
    sim = sim_of(scenario([], moves=[move], per_node=6))
    before = asyncio.run(_scrape_pods(sim, 10))
    after = asyncio.run(_scrape_pods(sim, 20))
    assert before[("r0-node0", "1")][0].startswith("r0-node0-gpu1-")
    assert ("r0-node0", "7") not in before and ("r0-node0", "6") not in before
    assert ("r0-node0", "1") not in after
    pod, namespace, container = after[("r0-node0", "7")]
    assert pod.startswith("r0-node0-gpu1-") and pod != before[("r0-node0", "1")][0]
    assert (namespace, container) == ("inference", "vllm")
    assert before[("r1-node0", "0")][1:] == ("inference", "vllm")  # DME's labels too


async def _scrape_pods(sim: Simulation, steps: int) -> dict[tuple[str, str], tuple[str, ...]]:
    """(host, gpu) -> (pod, namespace, container) of the last round's gpu_workload_info."""
    samples = await _collect(sim, steps, last_round=True)
    out = {}
    for s in samples:
        labels = dict(s.series.labels)
        if s.series.metric == "gpu_workload_info":
            key = (labels["host"], labels["gpu"])
            out[key] = (labels.get("pod", ""), labels.get("namespace", ""),
                        labels.get("container", ""))  # fmt: skip
        else:
            assert "pod" not in labels, (s.series.metric, labels)  # device series: identity only
    return out
