"""A real Prometheus Alertmanager for tests, and a webhook sink that records what it is sent.

Delivery is only proven against the real thing: ``running_alertmanager`` starts the
installed ``prometheus-alertmanager`` on free local ports, routing every notification to a
URL of the test's choosing (usually a ``WebhookSink``).  Without the binary the test skips,
or fails under ``HBMWATCH_REQUIRE_SERVICES=1`` (see ``tests.conftest.require_service``).

    with WebhookSink() as sink, running_alertmanager(tmp_path, sink.url + "/am") as am:
        ...  # post to am.url, read am.alerts(), wait on sink.wait_for(...)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import require_service

ALERTMANAGER_ENV = "HBMWATCH_ALERTMANAGER_BIN"
DEFAULT_ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
READY_SECONDS = 15.0


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; a race is unlikely on a test box)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alertmanager_binary() -> str:
    """``$HBMWATCH_ALERTMANAGER_BIN``, else the Debian package's binary; skip or fail without."""
    if os.environ.get(ALERTMANAGER_ENV) is None and os.access(DEFAULT_ALERTMANAGER, os.X_OK):
        return DEFAULT_ALERTMANAGER
    return require_service(
        ALERTMANAGER_ENV, "prometheus-alertmanager (apt install prometheus-alertmanager)"
    )


def alertmanager_config(
    webhook_url: str,
    *,
    group_by: Sequence[str] = ("...",),
    group_wait: str = "0s",
    group_interval: str = "1s",
) -> str:
    """One route to one webhook, resolved notifications on; JSON is valid YAML."""
    return json.dumps(
        {
            "route": {
                "receiver": "sink",
                "group_by": list(group_by),
                "group_wait": group_wait,
                "group_interval": group_interval,
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "sink", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
            ],
        },
        indent=2,
    )


@dataclass
class Alertmanager:
    """A running Alertmanager: its base URL and a few API v2 reads for assertions."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def alerts(self, *, active: bool = True, silenced: bool = True) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: the alerts it holds (resolved ones are not listed)."""
        params = {"active": str(active).lower(), "silenced": str(silenced).lower()}
        response = httpx.get(f"{self.url}/api/v2/alerts", params=params, timeout=5)
        response.raise_for_status()
        return response.json()

    def silences(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v2/silences", timeout=5)
        response.raise_for_status()
        return response.json()

    def silence(self, silence_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v2/silence/{silence_id}", timeout=5)
        response.raise_for_status()
        return response.json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_alertmanager(
    tmp_path: Path,
    webhook_url: str,
    *,
    port: int | None = None,
    group_by: Sequence[str] = ("...",),
    group_wait: str = "0s",
    group_interval: str = "1s",
) -> Iterator[Alertmanager]:
    """Start Alertmanager on 127.0.0.1 (``port``, else a free one), wait until ready, stop it.

    Clustering is off (an empty ``--cluster.listen-address``) so runs never gossip with one
    another.  ``port`` lets a test start it where a client already points, to show recovery.
    """
    binary = alertmanager_binary()
    port = port or free_port()
    folder = tmp_path / f"alertmanager-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "alertmanager.yml"
    config.write_text(
        alertmanager_config(
            webhook_url, group_by=group_by, group_wait=group_wait, group_interval=group_interval
        )
    )
    log_path = folder / "alertmanager.log"
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT)
    am = Alertmanager(f"http://127.0.0.1:{port}", port, process, log_path)
    try:
        _wait_ready(am)
        yield am
    finally:
        _stop(process)


def _wait_ready(am: Alertmanager) -> None:
    """Poll /-/ready; fail with its log if it exits or takes too long."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if am.process.poll() is not None:
            raise RuntimeError(f"alertmanager exited {am.process.returncode}:\n{am.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{am.url}/-/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"alertmanager not ready after {READY_SECONDS} s:\n{am.log()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate by PID, then kill if it lingers."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@dataclass(frozen=True)
class Received:
    """One request the sink took: the body parsed as JSON when it is JSON."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class WebhookSink:
    """A threaded HTTP server on 127.0.0.1 that records requests and answers ``status``.

    Serves as Alertmanager's webhook target, as hbmwatch's own webhook receiver, or as a
    stand-in Alertmanager API (any path, any of POST/PUT/DELETE).  Set ``status`` to make it
    fail requests, ``reply`` to choose what it answers.
    """

    status: int = 200
    reply: Any = field(default_factory=dict)  # the JSON body of every answer
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "use WebhookSink as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> WebhookSink:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, request: Received) -> None:
        with self._lock:
            self.received.append(request)

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path == path]

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r.body for r in self.requests(path)]

    def clear(self) -> None:
        with self._lock:
            self.received.clear()

    def wait_for(
        self, predicate: Callable[[list[Received]], bool], timeout: float = 10.0
    ) -> list[Received]:
        """Poll until ``predicate(requests)`` holds; AssertionError with what came, else."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.requests()
            if predicate(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"sink: condition not met in {timeout} s; got {got!r}")
            time.sleep(0.05)


def _handler(sink: WebhookSink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _take(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            sink.record(Received(self.command, self.path, headers, body))
            answer = json.dumps(sink.reply).encode()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gone
                self.send_response(sink.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        do_POST = do_PUT = do_DELETE = _take

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

    return Handler
