"""The service as people run it: ``hbmwatch migrate`` and ``hbmwatch up`` in a subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.api.main import create_app
from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import head_revision
from hbmwatch.store.store import SchemaOutdated, Store, open_store

HBMWATCH = [sys.executable, "-m", "hbmwatch.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HBMWATCH_")}
    env.update(extra)
    return env


def test_migrate_creates_sqlite_file_in_working_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [*HBMWATCH, "migrate"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    from hbmwatch.store.migrate import head_revision

    assert f"schema at revision {head_revision()}" in out.stderr
    assert (tmp_path / "hbmwatch.db").exists()


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "hbmwatch.toml").write_text("[store]\nurl = 'mysql://nope'\n")
    out = subprocess.run(
        [*HBMWATCH, "migrate"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "store.url" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def running(tmp_path: Path, store_url: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    # The log goes to a file: a pipe nobody reads fills up and blocks the service's logging.
    log_file = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [*HBMWATCH, "up"],
        cwd=tmp_path,
        text=True,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=clean_env(
            HBMWATCH_API__PORT=str(port),
            HBMWATCH_STORE__URL=store_url,
            HBMWATCH_SIMULATOR__BASE_PORT="0",
        ),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            if proc.poll() is not None:
                pytest.fail(f"hbmwatch up exited: {(tmp_path / 'up.log').read_text()}")
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("hbmwatch up did not answer /healthz within 60 s")
    yield base, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    log_file.close()


def test_up_serves_health_and_readiness(
    running: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    base, proc = running
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{base}/readyz")
    deadline = time.monotonic() + 120  # ready once a scrape completed (no start-up grace)
    while ready.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.3)
        ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"store": "ok", "schema": "ok", "collector": "ok",
                                      "detection": "ok"}  # fmt: skip
    # The simulated fleet is scraped, detected on and exported: margins per GPU on /metrics,
    # every inventoried GPU among them and every target up at once (on a busy machine a
    # scrape may miss its deadline and a frame a node; both recover).
    deadline = time.monotonic() + 120
    families, gpus, margin_gpus = _exported(base)
    while time.monotonic() < deadline and not (
        gpus
        and margin_gpus == gpus
        and all(s.value == 1 for s in families.get("hbmwatch_target_up", []))
    ):
        time.sleep(1)
        families, gpus, margin_gpus = _exported(base)
    margins = families["hbmwatch_gpu_thermal_margin_celsius"]
    assert margins and all(0 < s.value < 80 for s in margins)
    assert {s.labels["sensor"] for s in margins} == {"memory", "hotspot"}
    assert families["hbmwatch_detection_cycle_seconds"][0].value > 0
    assert all(s.value == 1 for s in families["hbmwatch_target_up"])
    assert families["hbmwatch_store_samples_written"][0].value > 0
    assert gpus and margin_gpus == gpus
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    output = (tmp_path / "up.log").read_text()
    assert "127.0.0.1" in output  # bound to loopback by default


def _exported(base: str) -> tuple[dict[str, list], set, set]:
    """/metrics by family, the inventoried GPUs, and the GPUs /metrics has margins for."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    devices = httpx.get(f"{base}/api/v1/devices", params={"limit": 1000}, timeout=30)
    gpus = {(d["host"], d["gpu"]) for d in devices.json()["items"]}
    margins = families.get("hbmwatch_gpu_thermal_margin_celsius", [])
    return families, gpus, {(s.labels["host"], s.labels["gpu"]) for s in margins}


def test_readyz_reports_an_unreachable_store(tmp_path: Path) -> None:
    db = tmp_path / "hbmwatch.db"
    settings = Settings(store=StoreSettings(url=f"sqlite:///{db}"))
    store = Store(create_store_engine(settings.store.url), settings.store)  # not migrated
    with TestClient(create_app(settings, store)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "not ready"
    assert f"expected {head_revision()}" in response.json()["checks"]["schema"]
    store.close()


def test_open_store_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    with pytest.raises(SchemaOutdated, match="run hbmwatch migrate"):
        open_store(StoreSettings(url=f"sqlite:///{tmp_path / 'x.db'}"))
