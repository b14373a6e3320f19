"""Shared fixtures: real backends (SQLite file, PostgreSQL from .ci), a store with a clock.

PostgreSQL comes from ``HBMWATCH_TEST_PG_URL`` (``.ci/run`` starts one).  Without it the
PostgreSQL cases skip, unless ``HBMWATCH_REQUIRE_SERVICES=1``, when they fail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from sqlalchemy import text

from hbmwatch.settings import StoreSettings
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store, open_store

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"  # upstream captures, with their sources (README)
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z, minute-aligned


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """A test that runs a command in-process (``hbmwatch eval`` configures logging at
    warning) must not silence the info events the next test in that worker captures."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT handled, not ignored, in this process and so in every process it starts.

    A run started in the background (``.ci/run &``, nohup) inherits SIGINT ignored; a child
    started with it ignored keeps it ignored (``hbmwatch sim`` then runs to its scenario's
    end), so every test that stops a process with SIGINT would wait out its timeout and kill
    it. A handler, unlike SIG_IGN, is reset to the default by exec: children get SIGINT."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The suite starts over a hundred hbmwatch processes; with PYTHONDONTWRITEBYTECODE (set
    # on some CI images) each compiles the package anew, about 1 CPU-s a start.  Written once
    # into the checkout's __pycache__, as any run of Python would, they reuse it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


#: The CPU dispatch golden values were recorded under: numpy's AVX-512 loops and OpenBLAS'
#: SkylakeX kernels round some results differently in the last bit than the x86-64-v3 and
#: Haswell ones, enough to change a page digest or an isolation forest's split.  A test
#: marked ``reference_dispatch`` compares such golden values: it runs in a child pytest
#: pinned to this dispatch (a no-op on a CPU without AVX-512), so it holds on any x86 CI host.
REFERENCE_DISPATCH = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    pinned = all(os.environ.get(k) == v for k, v in REFERENCE_DISPATCH.items())
    if pyfuncitem.get_closest_marker("reference_dispatch") is None or pinned:
        return None
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
         "-p", "no:cacheprovider", "--no-header", pyfuncitem.nodeid],
        cwd=pyfuncitem.config.rootpath, env={**os.environ, **REFERENCE_DISPATCH},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert child.returncode == 0, f"under the reference CPU dispatch:\n{child.stdout[-4000:]}"
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (a timeout over the default, then ``slow``): ``-n auto
    --dist loadfile`` hands out files in this order, so a file of minutes starts while the
    short ones fill the other worker, not after them."""

    def weight(item: pytest.Item) -> tuple[float, int]:
        timeout = item.get_closest_marker("timeout")
        seconds = float(timeout.args[0]) if timeout and timeout.args else 0.0
        return (-seconds, 0 if item.get_closest_marker("slow") else 1)

    by_file: dict[str, tuple[float, int]] = {}
    for item in items:  # a file weighs what its heaviest test does; its own order stays
        by_file[item.location[0]] = min(by_file.get(item.location[0], (0.0, 1)), weight(item))
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (by_file[item.location[0]], order[id(item)]))


def require_service(env: str, what: str) -> str:
    value = os.environ.get(env)
    if value:
        return value
    message = f"{what} not available: set {env} (.ci/run starts one)"
    if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"test fixtures missing at {FIXTURES}")
    return FIXTURES


class Clock:
    """A settable clock for the store: tests move time instead of sleeping."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pg_url() -> str:
    return require_service("HBMWATCH_TEST_PG_URL", "PostgreSQL")


@contextlib.contextmanager
def private_schema(pg_url: str) -> Iterator[str]:
    """A URL of a private schema on the test server, dropped on leaving."""
    from sqlalchemy.engine import make_url

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_store_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    """A private schema on the test server, dropped afterwards."""
    with private_schema(pg_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    return request.getfixturevalue("pg_schema_url")


def make_store(url: str, clock: Clock, **settings: object) -> Store:
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    return open_store(StoreSettings(url=url, **settings), clock=clock)  # type: ignore[arg-type]


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[Store]:
    s = make_store(store_url, clock)
    yield s
    s.close()


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def private_pg() -> Iterator[dict]:
    """A PostgreSQL server of the test's own, so the test may stop and start it."""
    import shutil
    import socket
    import subprocess

    if not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None or os.geteuid() != 0:
        require_service(
            "HBMWATCH_TEST_PRIVATE_PG",
            "a PostgreSQL server this test may restart (needs root, runuser and postgresql-15)",
        )
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="hbmwatch-test-pg-"))  # postgres must reach it
    os.chmod(folder, 0o755)
    shutil.chown(folder, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def as_postgres(*args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120
        )

    as_postgres(str(PG_BIN / "initdb"), "-D", str(folder / "data"), "-A", "trust", "-U", "postgres")
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off"

    def start() -> None:
        as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(folder / "data"),
            "-l",
            str(folder / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def stop() -> None:
        as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast", "-w", "stop")

    start()
    try:
        yield {
            "url": f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
            "start": start,
            "stop": stop,
        }
    finally:
        with contextlib.suppress(Exception):
            stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, as a cluster's CA would sign the API's."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1"]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return cert, key
