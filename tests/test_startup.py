"""Start-up as people meet it: the real CLI in a subprocess, refusing bad starts in one line.

Each case asserts the exit code, exactly one line on stderr (no traceback) and that nothing
started or was created: no simulated fleet, no ground truth, no database file or folder.
"""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hbmwatch.settings import StoreSettings
from hbmwatch.validation import ConfigError
from tests.test_service import HBMWATCH, clean_env

TRUTH = "hbmwatch-sim-truth.json"


def hbmwatch(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI; the generous timeout only bounds a regression that starts everything."""
    return subprocess.run([*HBMWATCH, *args], cwd=cwd, env=clean_env(**env), text=True,
                          capture_output=True, timeout=120)  # fmt: skip


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The run failed with exit 2 and said why in one line, with no traceback."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in out.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other server listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def closed_port() -> int:
    """A local port nothing listens on (bound, read, closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    out = hbmwatch(tmp_path, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"hbmwatch {importlib.metadata.version('hbmwatch')}"


def test_unknown_key_in_the_file_names_file_section_key_and_fix(tmp_path: Path) -> None:
    (tmp_path / "hbmwatch.toml").write_text('[store]\nurll = "sqlite:///x.db"\n')
    line = one_error_line(hbmwatch(tmp_path, "up"))
    assert line == "error: hbmwatch.toml: [store] urll: unknown key; did you mean url?"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hbmwatch.toml"]


def test_unknown_key_in_the_environment_names_the_variable(tmp_path: Path) -> None:
    line = one_error_line(hbmwatch(tmp_path, "migrate", HBMWATCH_STORE__URLL="sqlite:///x.db"))
    assert "HBMWATCH_STORE__URLL" in line and "did you mean HBMWATCH_STORE__URL?" in line
    line = one_error_line(hbmwatch(tmp_path, "migrate", HBMWATCH_STOR__URL="sqlite:///x.db"))
    assert "HBMWATCH_STOR__URL: unknown section stor" in line
    assert not list(tmp_path.iterdir())


def test_invalid_toml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "hbmwatch.toml").write_text("[store\nurl = 1\n")
    assert "hbmwatch.toml: not valid TOML" in one_error_line(hbmwatch(tmp_path, "migrate"))


def test_taken_api_port_fails_before_the_fleet_starts(tmp_path: Path, taken_port: int) -> None:
    out = hbmwatch(tmp_path, "up", HBMWATCH_API__PORT=str(taken_port),
                   HBMWATCH_SIMULATOR__BASE_PORT="0")  # fmt: skip
    line = one_error_line(out)
    assert f"cannot listen on 127.0.0.1:{taken_port} (api.port): address already in use" in line
    assert "simulated fleet serving" not in out.stdout + out.stderr
    assert not (tmp_path / TRUTH).exists() and not (tmp_path / "hbmwatch.db").exists()


def test_taken_port_from_the_command_line_too(tmp_path: Path, taken_port: int) -> None:
    line = one_error_line(hbmwatch(tmp_path, "up", "--port", str(taken_port)))
    assert f"127.0.0.1:{taken_port}" in line and not (tmp_path / TRUTH).exists()


def test_taken_simulator_port_fails_before_anything_starts(tmp_path: Path, taken_port: int) -> None:
    out = hbmwatch(tmp_path, "up", HBMWATCH_API__PORT=str(closed_port()),
                   HBMWATCH_SIMULATOR__BASE_PORT=str(taken_port - 1))  # fmt: skip
    line = one_error_line(out)
    assert f"cannot serve the simulated fleet on 127.0.0.1:{taken_port}" in line
    assert "simulator.base_port" in line
    assert not (tmp_path / TRUTH).exists() and not (tmp_path / "hbmwatch.db").exists()


def test_unreachable_postgres_is_one_line_with_the_password_hidden(tmp_path: Path) -> None:
    port = closed_port()
    url = f"postgresql+psycopg://hbm:s3cret-pw@127.0.0.1:{port}/hbmwatch"
    for command in (["up"], ["migrate"], ["incidents"]):
        line = one_error_line(hbmwatch(tmp_path, *command, HBMWATCH_STORE__URL=url))
        assert line.startswith(f"error: cannot reach PostgreSQL at 127.0.0.1:{port}: ")
        assert "refused" in line.lower() and "s3cret-pw" not in line
    assert not list(tmp_path.iterdir())


def test_sqlite_in_a_missing_folder_is_refused_not_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'typo' / 'hbmwatch.db'}"
    for command in ("migrate", "up"):
        line = one_error_line(hbmwatch(tmp_path, command, HBMWATCH_STORE__URL=url))
        assert f"no directory {tmp_path / 'typo'}" in line
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["incidents"],
        ["incidents", "--all", "--json"],
        ["silence", "list"],
        ["silence", "expire", "abc"],
        ["silence", "add", "host=n1"],
    ],
)
def test_read_commands_without_a_database_create_none(tmp_path: Path, command: list[str]) -> None:
    line = one_error_line(hbmwatch(tmp_path, *command))
    assert line == "error: no database at hbmwatch.db; run hbmwatch migrate or hbmwatch up first"
    assert not list(tmp_path.iterdir())


def test_read_commands_work_once_migrated(tmp_path: Path) -> None:
    assert hbmwatch(tmp_path, "migrate").returncode == 0
    out = hbmwatch(tmp_path, "incidents", "--json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_preflight_passes_a_free_port_and_a_reachable_postgres(pg_url: str) -> None:
    from hbmwatch.runtime import preflight

    assert preflight.bind_error("127.0.0.1", closed_port()) is None
    preflight.check_store(StoreSettings(url=pg_url))  # no error: the server answers


def test_preflight_reports_a_postgres_that_stopped(private_pg: dict) -> None:
    """A real server, stopped: the same one line as a port that was never served."""
    from hbmwatch.runtime import preflight

    url = private_pg["url"]
    preflight.check_store(StoreSettings(url=url))
    private_pg["stop"]()
    with pytest.raises(ConfigError, match=r"^cannot reach PostgreSQL at 127\.0\.0\.1:\d+: "):
        preflight.check_store(StoreSettings(url=url))
