"""The README starts with the two commands, and CI runs the same test command."""

from __future__ import annotations

import re

from tests.conftest import REPO


def commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", readme)


def test_readme_opens_with_run_then_test() -> None:
    run, test = commands()[:2]
    assert run.endswith("hbmwatch up") and "pip install -r requirements/run.lock -e ." in run
    assert "pytest" in test
    assert "pip install -r requirements/test.lock -e '.[postgres,test]'" in test


def test_the_locks_pin_every_dependency_the_project_declares() -> None:
    """requirements/*.lock (pip-compile) hold an exact pin for each declared dependency."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {
        "run.lock": project["dependencies"] + extras["postgres"] + extras["nvidia"],
        "test.lock": project["dependencies"] + extras["postgres"] + extras["test"],
    }
    for name, requirements in wanted.items():
        text = (REPO / "requirements" / name).read_text()
        lines = [ln for ln in text.splitlines() if "==" in ln and not ln.startswith("#")]
        pins = {_name(ln.split("==")[0]): ln.split("==")[1].split()[0] for ln in lines}
        for req in map(Requirement, requirements):
            key = _name(req.name)
            assert key in pins, f"{name} does not pin {req.name}"
            assert req.specifier.contains(pins[key]), f"{name}: {req.name}=={pins[key]} vs {req}"
        assert "file://" not in text and "hbmwatch" not in pins


def _name(name: str) -> str:
    return name.strip().lower().replace("_", "-")


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
    for command in ("up", "migrate", "collect", "detect", "sim", "bench", "docs"):
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
