"""Real engines beside hbmwatch, for benchmarks and tests: VictoriaMetrics, Prometheus.

Each runs as its own process on a free loopback port in a folder of its own, is waited for
by polling its readiness endpoint under a deadline, and is stopped by its PID alone.  A
binary that is not installed is a one-line ``EngineUnavailable`` naming the package.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from hbmwatch.validation import HbmwatchError

#: Debian's package of each binary (apt-get install --no-install-recommends ...).
PACKAGES = {
    "victoria-metrics": "victoria-metrics",
    "prometheus": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
}


class EngineUnavailable(HbmwatchError):
    """The engine is not installed, or did not become ready."""


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EngineUnavailable(
            f"{name} not found on PATH: apt-get install --no-install-recommends "
            f"{PACKAGES.get(name, name)}"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineProcess:
    """One server process; ``args`` may hold ``{port}`` and ``{folder}``."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        folder: Path,
        *,
        ready_path: str,
        ready_timeout_s: float = 120.0,
        port: int | None = None,
    ) -> None:
        self.name = name
        self._binary = binary(name)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._args = list(args)
        self._ready_path = ready_path
        self._log = (folder / f"{name}.log").open("w")
        # A free port is free when asked, not always when the server binds it: try again.
        for attempt in range(3):
            self._start(port or free_port())
            try:
                self._wait_ready(ready_timeout_s)
                return
            except EngineUnavailable:
                exited = self.process.poll() is not None
                self.stop(close_log=False)
                if not exited or attempt == 2:
                    self._log.close()
                    raise
            except BaseException:
                self.stop()
                raise

    def _start(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        args = [a.format(port=port, folder=self.folder) for a in self._args]
        self.process = subprocess.Popen(
            [self._binary, *args], stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 1) -> str:
        self._log.flush()
        text = (self.folder / f"{self.name}.log").read_text(errors="replace").strip()
        return "\n".join(text.splitlines()[-lines:]) or "no output"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineUnavailable(
                    f"{self.name} exited with {self.process.returncode} before it was ready: "
                    f"{self.log_tail()[:300]}"
                )
            try:
                if httpx.get(self.url + self._ready_path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a condition, with a deadline
        raise EngineUnavailable(
            f"{self.name} not ready after {timeout_s:g} s; see {self._log.name}"
        )

    def stop(self, *, close_log: bool = True) -> None:
        """Terminate the server (its own PID only), then kill it if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if close_log:
            self._log.close()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VictoriaMetrics(EngineProcess):
    """Single-node VictoriaMetrics; remote-write at ``write_url``, Prometheus API at ``url``.

    Instant queries see the newest samples (``-search.latencyOffset=0s``; its default hides
    the newest 30 s from them) and the scrape config, when given, makes it scrape like
    Prometheus.
    """

    def __init__(
        self,
        folder: Path,
        *,
        scrape_config: str | None = None,
        extra: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        args = [
            "-storageDataPath={folder}/data",
            "-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=0s",
            "-search.disableCache",
            "-loggerLevel=WARN",
        ]
        if scrape_config is not None:
            (folder / "scrape.yml").parent.mkdir(parents=True, exist_ok=True)
            (folder / "scrape.yml").write_text(scrape_config)
            args += ["-promscrape.config={folder}/scrape.yml"]
        super().__init__("victoria-metrics", [*args, *extra], folder, ready_path="/health",
                         port=port)  # fmt: skip

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"


class PrometheusServer(EngineProcess):
    """Prometheus with its remote-write receiver on, scraping what ``config`` says."""

    def __init__(self, folder: Path, *, config: str = "global: {}\n",
                 extra: Sequence[str] = ()) -> None:  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(config)
        args = ["--storage.tsdb.path={folder}/data", "--config.file={folder}/prometheus.yml",
                "--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                "--storage.tsdb.retention.time=100y"]  # fmt: skip
        super().__init__("prometheus", [*args, *extra], folder, ready_path="/-/ready")

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"
