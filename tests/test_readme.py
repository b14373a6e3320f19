"""The README starts with the two commands, and CI runs the same test command."""

from __future__ import annotations

import re

from tests.conftest import REPO


def commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", readme)


def test_readme_opens_with_run_then_test() -> None:
    run, test = commands()[:2]
    assert run.endswith("hbmwatch up") and "pip install -e ." in run
    assert "pytest" in test and "pip install -e '.[test]'" in test


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test = commands()[1]
    ci = (REPO / ".ci" / "run").read_text()
    assert test in ci
    assert "HBMWATCH_REQUIRE_SERVICES=1" in ci
    assert "services_stop" in ci  # stops what it started, by PID


def test_documented_commands_exist() -> None:
    from typer.main import get_command

    from hbmwatch.cli import app

    names = set(get_command(app).commands)  # type: ignore[attr-defined]
    for command in ("up", "migrate", "collect", "sim", "bench", "docs"):
        assert command in names


def test_readme_configuration_example_is_valid(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from hbmwatch.settings import load_settings

    readme = (REPO / "README.md").read_text()
    example = re.search(r"```toml\n(.+?)\n```", readme, re.S)
    assert example is not None
    (tmp_path / "hbmwatch.toml").write_text(example.group(1))
    settings = load_settings(tmp_path / "hbmwatch.toml")
    assert settings.collector.targets[0].kind == "dme"
    assert settings.collector.local_sources == ["nvml"]
