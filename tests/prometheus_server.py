"""A real Prometheus (or VictoriaMetrics) of a test's own, as the context managers the BYO
and shard tests use; the engines themselves are ``hbmwatch.bench.engines``' (free port,
readiness polled under a deadline, stopped by PID)."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

from hbmwatch.bench.engines import PrometheusServer, VictoriaMetrics

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, deadline_s: float = 120.0) -> T:
    """``condition()``'s first truthy answer; HTTP errors count as not yet."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if result := condition():
                return result
        time.sleep(0.2)  # polling a condition, with a deadline
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def prometheus(tmp: Path, config: str) -> Iterator[str]:
    """A Prometheus running ``config`` (YAML); yields its URL."""
    with PrometheusServer(tmp / "prometheus", config=config) as server:
        yield server.url


@contextlib.contextmanager
def victoria_metrics(tmp: Path, scrape_config: str) -> Iterator[str]:
    """A VictoriaMetrics scraping as ``scrape_config`` (Prometheus' YAML); yields its URL."""
    with VictoriaMetrics(tmp / "victoria-metrics", scrape_config=scrape_config) as server:
        yield server.url
