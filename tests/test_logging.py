"""Issue 12 point 3: no secret in any log line, tracebacks without locals, repeats counted."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hbmwatch import log
from hbmwatch.logfilters import RateLimiter, register_secrets, scrub_text
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import Settings
from hbmwatch.store.guard import StoreUnavailable
from tests.conftest import Clock, make_store


@pytest.fixture(autouse=True)
def _log_to_the_real_stderr_afterwards() -> Iterator[None]:
    """Each test logs into capsys' stream, closed after the test: later tests must not."""
    yield
    log.configure("info", "console", stream=sys.__stderr__)


PASSWORD = "Pg-s3cret-q7Zx"  # never registered: patterns and no-locals must hide it alone
LOCAL_MARKER = "local-value-7f3a"


def connect_like_sqlalchemy() -> None:
    """Raises with the connect arguments in its locals, as psycopg's connect does."""
    cparams = {"host": "db", "user": "app", "password": PASSWORD}  # noqa: F841 (a local)
    marker = LOCAL_MARKER  # noqa: F841
    raise ConnectionError("connection to server at db failed: Connection refused")


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_traceback_kept_without_locals_or_password(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log.configure("info", fmt)
    logger = log.get("hbmwatch.test")
    try:
        connect_like_sqlalchemy()
    except ConnectionError:
        logger.exception("store down", url=f"postgresql+psycopg://app:{PASSWORD}@db/hbm")
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert LOCAL_MARKER not in err and "cparams =" not in err
    assert "postgresql+psycopg://app:***@db/hbm" in err
    text = json.loads(err)["exception"] if fmt == "json" else err
    assert "Traceback (most recent call last)" in text
    assert "in connect_like_sqlalchemy" in text and "Connection refused" in text


def test_password_keyvalues_and_registered_secrets_are_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(
        store={"url": "postgresql+psycopg://app:p%40ss-Word9@db/hbm"},  # type: ignore[arg-type]
        api={"write_token": "wtok-5ecret-71"},  # type: ignore[arg-type]
    )
    log.configure("info", "json")
    register_secrets(settings)
    logger = log.get("hbmwatch.test")
    logger.info("dsn", dsn="host=db user=app password=p@ss-Word9 dbname=hbm")
    logger.info("token seen", header="Authorization: Bearer wtok-5ecret-71", admin_token="x1")
    logger.info("raw", text="the password is p@ss-Word9 and the token wtok-5ecret-71")
    logging.getLogger("sqlalchemy.pool").warning("reset failed for %s", "password=p@ss-Word9")
    err = capsys.readouterr().err
    for secret in ("p@ss-Word9", "p%40ss-Word9", "wtok-5ecret-71", '"x1"'):
        assert secret not in err
    assert err.count("***") >= 6 and len(err.splitlines()) == 4


def test_a_thousand_identical_warnings_are_one_line_then_a_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log.configure("info", "json", repeat_seconds=3.0)  # room for a busy machine
    logger = log.get("hbmwatch.collector")
    started = time.monotonic()
    for i in range(1000):
        logger.warning("writing samples failed", batch=i)
        logging.getLogger("sqlalchemy.pool").error("connection %d lost", i)
    assert time.monotonic() - started < 3.0, "too slow to test within one window"
    deadline = started + 3.05
    while time.monotonic() < deadline:  # the window has to end before the count is shown
        time.sleep(0.01)
    logger.warning("writing samples failed", batch=1000)
    logging.getLogger("sqlalchemy.pool").error("connection %d lost", 1000)
    logger.warning("target down", target="http://a/metrics")
    logger.warning("target down", target="http://b/metrics")  # another target: its own line
    logger.info("not limited")
    logger.info("not limited")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    ours = [x for x in lines if x["event"] == "writing samples failed"]
    theirs = [x for x in lines if x["logger"] == "sqlalchemy.pool"]
    assert [x.get("repeated") for x in ours] == [None, 999]
    assert [x.get("repeated") for x in theirs] == [None, 999]
    assert len(lines) == 8


def test_rate_limiter_windows_per_key() -> None:
    clock = Clock(0.0)
    limiter = RateLimiter(10.0, clock=clock, max_keys=2)
    assert limiter.allow("a") == 0 and limiter.allow("b") == 0
    assert [limiter.allow("a") for _ in range(3)] == [None, None, None]
    clock.advance(10.0)
    assert limiter.allow("a") == 3 and limiter.allow("a") is None
    limiter.allow("c")  # evicts b, the oldest
    assert limiter.allow("b") == 0


@pytest.mark.postgres
def test_postgres_outage_never_logs_the_password(
    private_pg: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real PostgreSQL (trust auth ignores the password in the URL), stopped mid-run."""
    url = private_pg["url"].replace("postgres@", f"postgres:{PASSWORD}@", 1)
    clock = Clock()
    store = make_store(url, clock)
    key = SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "0"})
    sample = Sample(key, int(clock.now * 1000), 1.0)
    for fmt in ("console", "json"):
        log.configure("debug", fmt)
        logging.getLogger("sqlalchemy").setLevel(logging.DEBUG)  # its own records too
        private_pg["stop"]()
        failures = 0
        for _ in range(3):
            try:
                store.write([sample])
            except StoreUnavailable:
                failures += 1
                log.get("hbmwatch.store").exception("writing samples failed", store=url)
        private_pg["start"]()
        err = capsys.readouterr().err
        assert failures == 3
        assert PASSWORD not in err
        assert "Traceback (most recent call last)" in err and "psycopg" in err
        assert f"postgres:{PASSWORD}" not in err and "postgres:***@" in err
    store.close()


def test_scrubbing_a_long_hostile_line_stays_linear() -> None:
    """A 200 KB exception message (a bad page echoed back) must not stall the event loop."""
    for line in ("a." * 100_000, "ab://x:" * 30_000, "password=" * 20_000):
        started = time.monotonic()
        scrub_text(line)
        assert time.monotonic() - started < 5.0  # about 20 ms here; quadratic took minutes


def test_before_configure_tracebacks_have_no_locals() -> None:
    """An app that embeds hbmwatch and never calls configure still renders no locals."""
    code = (
        "from hbmwatch import log\n"
        "def connect():\n"
        "    dsn = 'postgresql://u:hunter2-in-a-local@db/x'\n"
        "    raise OSError('refused')\n"
        "try:\n"
        "    connect()\n"
        "except OSError:\n"
        "    log.get('t').exception('failed')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    text = out.stdout + out.stderr
    assert "OSError: refused" in text and "Traceback" in text
    assert "hunter2" not in text and "dsn =" not in text
