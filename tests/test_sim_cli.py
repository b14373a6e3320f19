"""`hbmwatch sim`, `hbmwatch bench sim`, and `hbmwatch up` running the default scenario."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.settings import StoreSettings
from hbmwatch.store.store import open_store
from tests.test_service import HBMWATCH, clean_env, free_port


def _wait_for(
    path: Path, proc: subprocess.Popen[str], seconds: float = 120, log: Path | None = None
) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None:
            said = log.read_text() if log else proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the simulator exited: {said}")
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.2)


def test_sim_serves_targets_and_writes_ground_truth(tmp_path: Path) -> None:
    targets, truth = tmp_path / "targets.json", tmp_path / "truth.json"
    log = tmp_path / "sim.log"  # a file: a pipe nobody reads fills and blocks the simulator
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*HBMWATCH, "sim", "noisy_neighbour", "--seed", "4", "--speed", "30", "--port", "0",
             "--truth", str(truth), "--targets", str(targets)],
            cwd=tmp_path,
            env=clean_env(),
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(targets, proc, log=log)
        listed = json.loads(targets.read_text())
        assert {t["kind"] for t in listed} == {"dme", "dcgm", "vllm"}
        for target in listed[:3]:
            page = httpx.get(target["url"], timeout=10).text
            assert list(text_string_to_metric_families(page))
        ground = json.loads(truth.read_text())
        assert ground["seed"] == 4 and ground["faults"][0]["kind"] == "noisy_neighbour"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


def test_sim_stops_on_sigint_even_when_started_with_it_ignored(tmp_path: Path) -> None:
    """A simulator started in the background (SIGINT ignored, as ``cmd &`` does) still stops
    at SIGINT, as the service's processes do, instead of serving to its scenario's end."""
    targets = tmp_path / "targets.json"
    log = tmp_path / "sim.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*HBMWATCH, "sim", "noisy_neighbour", "--port", "0", "--truth",
             str(tmp_path / "truth.json"), "--targets", str(targets)],
            cwd=tmp_path, env=clean_env(), text=True, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
    try:
        _wait_for(targets, proc, log=log)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=45) == 0, log.read_text()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_sim_rejects_a_bad_scenario_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nduration = "1h"\n[[racks]]\nname = "r0"\nnodes = 1\nsku = "Z9"\n')
    out = subprocess.run(
        [*HBMWATCH, "sim", str(bad)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "racks[0]" in out.stderr and "unknown sku 'Z9'" in out.stderr
    assert "Traceback" not in out.stderr


def test_bench_sim_reports(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [*HBMWATCH, "bench", "sim", "--gpus", "64", "--steps", "20", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["gpus"] == 64 and report["faster_than_real_time"] > 0
    assert "faster than real time" in done.stdout


def _wait_until_collected(db: Path, hosts: int, seconds: float = 60) -> None:
    """The service scrapes the simulated fleet into its own store: every node's GPUs."""
    from hbmwatch.query import parse_selector

    store = open_store(StoreSettings(url=f"sqlite:///{db}"))
    try:
        deadline = time.monotonic() + seconds
        seen: set[str] = set()
        while len(seen) < hosts and time.monotonic() < deadline:
            latest = store.latest(parse_selector("gpu_power_watts"))
            seen = {value.series.label("host") for value in latest}
            time.sleep(1)
        assert len(seen) == hosts, seen
    finally:
        store.close()


def _wait_until_detected(base: str, seconds: float = 120) -> None:
    """Until a detection cycle has seen temperatures (its thermal margins are exported)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:  # the API's own process may still be starting on a loaded machine
            text = httpx.get(f"{base}/metrics", timeout=30).text
        except httpx.ConnectError:
            time.sleep(1)
            continue
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        if families.get("hbmwatch_gpu_thermal_margin_celsius"):
            return
        time.sleep(1)
    raise AssertionError(f"no detection cycle over the collected temperatures in {seconds} s")


def test_up_without_targets_runs_the_default_scenario(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "up.log"  # a file: a pipe nobody reads would fill and block the service
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*HBMWATCH, "up"],
            cwd=tmp_path,
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(
                HBMWATCH_API__PORT=str(port),
                HBMWATCH_SIMULATOR__BASE_PORT="0",
                HBMWATCH_ALERTS__RECEIVERS='[{"name": "hook", "kind": "webhook", '
                '"url": "http://127.0.0.1:9/hook"}]',
            ),
        )
    try:
        deadline = time.monotonic() + 120
        text = ""
        while "alert delivery starting" not in text or "first_port=" not in text:
            assert time.monotonic() < deadline and proc.poll() is None, text
            time.sleep(0.2)
            text = log.read_text()
        first_port = int(re.search(r"first_port=(\d+)", text).group(1))  # type: ignore[union-attr]
        assert "running the bundled simulated fleet" in text and "scenario=default" in text
        assert "alerting ready" in text and "receivers=['webhook:hook']" in text
        listed = httpx.get(f"http://127.0.0.1:{first_port}/targets", timeout=10).json()
        assert len({t["labels"]["host"] for t in listed}) == 9  # 72 GPUs on 9 nodes
        truth = json.loads((tmp_path / "hbmwatch-sim-truth.json").read_text())
        assert truth["scenario"] == "default" and len(truth["faults"]) == 5
        _wait_until_collected(tmp_path / "hbmwatch.db", hosts=9)
        _wait_until_detected(f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    # The detectors ran inside `up` and left their state in the store on the way out.
    store = open_store(StoreSettings(url=f"sqlite:///{tmp_path / 'hbmwatch.db'}"))
    try:
        thermal = store.get_state("detector:thermal")
        assert thermal and thermal["temps"]["keys"], thermal
        assert store.get_state("detection:runner")["frame_end_ms"] > 0
    finally:
        store.close()
