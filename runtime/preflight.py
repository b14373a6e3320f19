"""Checks run before anything starts, so a bad start fails in one line within a second.

Without them a taken API port surfaced only after the simulated fleet had started (37 s),
an unreachable PostgreSQL was a 161-line traceback, and a SQLite path in a missing
directory or a read command without a database quietly created files. Each check raises
a ConfigError naming the setting to change; the CLI prints it and exits 2.
"""

from __future__ import annotations

import socket
from pathlib import Path

from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.validation import ConfigError

PG_CONNECT_TIMEOUT_SECONDS = 5
_LOOPBACK_OR_ANY = {"127.0.0.1", "localhost", "0.0.0.0", "::", ""}  # share the fleet's 127.0.0.1


def before_up(settings: Settings) -> None:
    """``hbmwatch up``: the store, the API port and, if it will run, the simulator's ports."""
    check_store(settings.store)
    check_api_port(settings.api.host, settings.api.port)
    if simulator_will_run(settings):
        check_simulator(settings)


def check_store(store: StoreSettings, *, must_exist: bool = False) -> None:
    """The database can be opened: a SQLite file's folder exists, PostgreSQL answers.

    ``must_exist``: for commands that only read or add to a migrated database, whose
    first use must not create an empty one.
    """
    from hbmwatch.store.engine import is_sqlite, sqlite_path

    if is_sqlite(store.url):
        path = sqlite_path(store.url)
        if path is not None:
            _check_sqlite(path, must_exist=must_exist)
    else:
        _check_postgres(store.url)


def _check_sqlite(path: Path, *, must_exist: bool) -> None:
    if path.is_dir():
        raise ConfigError(f"store.url: {path} is a directory, not a SQLite file", field="store.url")
    if must_exist and not path.exists():
        raise ConfigError(
            f"no database at {path}; run hbmwatch migrate or hbmwatch up first", field="store.url"
        )
    if not path.parent.is_dir():
        raise ConfigError(
            f"store.url: no directory {path.parent} for the SQLite database {path.name}; "
            "create it first or point store.url elsewhere",
            field="store.url",
        )


def _check_postgres(url: str) -> None:
    """Connect once with a short timeout; the reason is libpq's first line, password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from hbmwatch.store.engine import create_store_engine

    parsed = make_url(url)
    if "connect_timeout" not in parsed.query:
        parsed = parsed.update_query_dict({"connect_timeout": str(PG_CONNECT_TIMEOUT_SECONDS)})
    where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
    engine = create_store_engine(parsed.render_as_string(hide_password=False))
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        reason = _first_line(str(getattr(exc, "orig", None) or exc), parsed.password)
        raise ConfigError(
            f"cannot reach PostgreSQL at {where}: {reason} "
            f"(store.url {make_url(url).render_as_string(hide_password=True)})",
            field="store.url",
        ) from None
    finally:
        engine.dispose()


def _first_line(message: str, password: str | None) -> str:
    """libpq's 'connection failed: connection to server at ..., port N failed: WHY' -> WHY."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "unknown error")
    line = line.rsplit(" failed: ", 1)[-1]
    return line.replace(password, "***") if password else line


def check_api_port(host: str, port: int) -> None:
    """uvicorn binds only once every other part has started: find a taken port first."""
    reason = bind_error(host, port)
    if reason:
        raise ConfigError(
            f"cannot listen on {host}:{port} (api.port): {reason}; stop what holds it or "
            "pick another port (--port, HBMWATCH_API__PORT)",
            field="api.port",
        )


def bind_error(host: str, port: int) -> str | None:
    """Why binding ``host:port`` as a server would fail (every address it resolves to), or None.

    Binds with SO_REUSEADDR as asyncio's servers do, so a port in TIME_WAIT is not "taken".
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                return (exc.strerror or str(exc)).lower()
    return None


def simulator_will_run(settings: Settings) -> bool:
    """The same rule as ``hbmwatch up``: when told to, or when no real targets are set."""
    enabled = settings.simulator.enabled
    return bool(enabled) or (enabled is None and not settings.collector.configured)


def check_simulator(settings: Settings) -> None:
    """The scenario loads, its ground-truth folder exists and its node ports are free."""
    from hbmwatch.simulator.scenario import load_scenario

    sim = settings.simulator
    scenario = load_scenario(sim.scenario)  # a ConfigError of its own when it is bad
    truth = Path(sim.truth_file)
    if not truth.parent.is_dir():
        raise ConfigError(
            f"simulator.truth_file: no directory {truth.parent} for {truth.name}",
            field="simulator.truth_file",
        )
    if sim.base_port == 0:
        return  # any free ports
    nodes = sum(rack.nodes for rack in scenario.racks)
    ports = range(sim.base_port, sim.base_port + nodes)
    span = f"{ports[0]}-{ports[-1]}"
    hint = "set simulator.base_port (HBMWATCH_SIMULATOR__BASE_PORT=0 picks free ports)"
    if ports[-1] > 65535:
        raise ConfigError(
            f"the simulated fleet's {nodes} nodes need ports {span}, past 65535; {hint}",
            field="simulator.base_port",
        )
    if settings.api.port in ports and settings.api.host in _LOOPBACK_OR_ANY:
        raise ConfigError(
            f"api.port {settings.api.port} is one of the simulated fleet's ports {span}; {hint}",
            field="simulator.base_port",
        )
    for port in ports:
        if reason := bind_error("127.0.0.1", port):
            raise ConfigError(
                f"cannot serve the simulated fleet on 127.0.0.1:{port} (of {span}): {reason}; "
                f"{hint}",
                field="simulator.base_port",
            )
