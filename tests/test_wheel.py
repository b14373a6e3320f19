"""The wheel as a user installs it: one top-level name, migrations inside, `up` works.

The wheel is built from a copy of the checkout, installed into a fresh virtual environment
in a temporary folder (dependencies pinned by ``requirements/run.lock``), and run from a
folder that is not the checkout, so nothing can be found by accident beside the code.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.test_service import clean_env, free_port

LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
    ".pytest_cache", ".ruff_cache", "test-artifacts", "*.db", "hbmwatch-data",
)  # fmt: skip


def venv_env(**extra: str) -> dict[str, str]:
    """The environment for the wheel's venv: bytecode is written there (a temp folder), as
    for a user, even where the run says not to (PYTHONDONTWRITEBYTECODE); else, installed with
    --no-compile, every process would compile each module it imports again."""
    env = clean_env(**extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(args: list[str], log: Path, **kw: object) -> None:
    with log.open("w") as out:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=900, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args[:4])} failed ({done.returncode}): {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=LEFT_OUT)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp / "dist"), str(source)],
         tmp / "build.log")  # fmt: skip
    (wheel,) = (tmp / "dist").glob("hbmwatch-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        top = next(n for n in whl.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert whl.read(top).decode().split() == ["hbmwatch"]
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp / "venv.log")
    lock = REPO / "requirements" / "run.lock"
    # --no-compile: pip would byte-compile every module of every dependency (numpy, scipy,
    # pandas...), 60% of the install's CPU; the processes compile what they import (venv_env).
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--no-compile", "-c", str(lock), str(wheel)], tmp / "install.log")
    return venv / "bin"


@pytest.mark.slow
def test_the_wheel_installs_hbmwatch_alone(installed: Path) -> None:
    site = subprocess.run(
        [str(installed / "python"), "-c", "import hbmwatch, sysconfig; "
         "print(hbmwatch.__file__); print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=120, cwd=installed, check=True, env=venv_env(),
    ).stdout.split()  # fmt: skip
    package, purelib = Path(site[0]).parent, Path(site[1])
    assert package == purelib / "hbmwatch"
    for room in ("api", "store", "collector", "alerts", "detectors", "simulator"):
        assert not (purelib / room).exists(), f"a top-level {room}/ was installed"
        assert (package / room / "__init__.py").is_file()
    assert (package / "migrations" / "env.py").is_file()
    assert (package / "dashboards" / "json" / "fleet-overview.json").is_file()


@pytest.mark.slow
def test_without_the_postgres_extra_a_postgres_url_is_one_line(
    installed: Path, tmp_path: Path
) -> None:
    """The wheel alone has no database driver: SQLite needs none, PostgreSQL names its extra."""
    env = venv_env(HBMWATCH_STORE__URL="postgresql://hbmwatch@127.0.0.1:1/hbmwatch")
    done = subprocess.run([str(installed / "hbmwatch"), "migrate"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0
    assert "pip install 'hbmwatch[postgres]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_installed_wheel_migrates_and_comes_up_ready(installed: Path, tmp_path: Path) -> None:
    hbmwatch = str(installed / "hbmwatch")
    port = free_port()
    env = venv_env(HBMWATCH_API__PORT=str(port), HBMWATCH_SIMULATOR__BASE_PORT="0",
                    PATH=f"{installed}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    _run([hbmwatch, "migrate"], tmp_path / "migrate.log", cwd=tmp_path, env=env)
    assert (tmp_path / "hbmwatch.db").is_file()
    rules = tmp_path / "rules"
    _run([hbmwatch, "rules", "--out", str(rules)], tmp_path / "rules.log", cwd=tmp_path, env=env)
    assert (rules / "hbmwatch-rules.yml").read_text().startswith("groups:")  # YAML, not JSON

    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen([hbmwatch, "up"], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, ready = time.monotonic() + 180, None
        while time.monotonic() < deadline and ready is None:
            if proc.poll() is not None:
                pytest.fail(f"hbmwatch up exited: {(tmp_path / 'up.log').read_text()[-3000:]}")
            try:
                r = httpx.get(f"{base}/readyz", timeout=5)
                ready = r if r.status_code == 200 else None
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert ready is not None, (tmp_path / "up.log").read_text()[-3000:]
        docs = httpx.get(f"{base}/docs", timeout=10)
        assert docs.status_code == 200 and "cdn." not in docs.text
        assert httpx.get(f"{base}/docs/static/swagger-ui-bundle.js", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "up.log").read_text()[-3000:]
