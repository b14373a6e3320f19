"""A real Prometheus (or VictoriaMetrics) of a test's own: started on a free port in a
temporary folder, ready when its readiness endpoint says so, stopped on leaving."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], T], what: str, deadline_s: float = 120.0) -> T:
    """``condition()``'s first truthy answer; HTTP errors count as not yet."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if result := condition():
                return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def serving(command: list[str], url: str, ready: str, log: Path) -> Iterator[str]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            what = f"{Path(command[0]).name} ready (log: {log})"
            wait_for(lambda: proc.poll() is None and httpx.get(url + ready).is_success, what)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(60)


@contextlib.contextmanager
def prometheus(tmp: Path, config: str) -> Iterator[str]:
    """A Prometheus running ``config`` (YAML); yields its URL."""
    port = free_port()
    (tmp / "prometheus.yml").write_text(config)
    command = [
        PROMETHEUS,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'prom-tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with serving(command, f"http://127.0.0.1:{port}", "/-/ready", tmp / "prometheus.log") as url:
        yield url


@contextlib.contextmanager
def victoria_metrics(tmp: Path, scrape_config: str) -> Iterator[str]:
    """A VictoriaMetrics scraping as ``scrape_config`` (Prometheus' YAML); yields its URL."""
    port = free_port()
    (tmp / "vm-scrape.yml").write_text(scrape_config)
    command = [
        VICTORIA_METRICS,
        f"-storageDataPath={tmp / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-promscrape.config={tmp / 'vm-scrape.yml'}",
        "-search.latencyOffset=0s",
    ]
    with serving(command, f"http://127.0.0.1:{port}", "/health", tmp / "vm.log") as url:
        yield url
