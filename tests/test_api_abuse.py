"""The API under abuse, over a real uvicorn server: unauthenticated bodies are never read,
admission limits and deadlines hold, and the server runs on its own thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hbmwatch.api.main import create_app
from hbmwatch.api.server import ApiServer, ApiServerError
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_api import READ, TEMP, WRITE, bearer, settings_for

DEADLINE_S = 60.0
BIG = 57 * 2**20  # the body size


class Counting:
    """Counts the body bytes the app pulls from the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.read = app, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.read += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


@pytest.fixture
def sqlite_store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    s = make_store(f"sqlite:///{tmp_path / 'hbmwatch.db'}", clock)
    yield s
    s.close()


@contextmanager
def serve(app: ASGIApp) -> Iterator[ApiServer]:
    server = ApiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.running


def raw_post(port: int, path: str, length: int, sent: int, token: str | None = None) -> bytes:
    """Headers declaring ``length`` body bytes, ``sent`` of them, then whatever comes back."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        sock.sendall(head)
        with suppress(OSError):  # the server may answer and close before taking it all
            sock.sendall(b" " * sent)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_unauthenticated_bodies_are_refused_before_they_are_read(sqlite_store: Store) -> None:
    app = Counting(create_app(settings_for(sqlite_store), sqlite_store))
    with serve(app) as server:
        answers: list[bytes] = []
        posts = [threading.Thread(target=lambda t=t: answers.append(
            raw_post(server.port, "/api/v1/ingest/samples", BIG, 2**20, t)))
            for t in (None, "wrong") * 4]  # fmt: skip
        for p in posts:
            p.start()
        for p in posts:
            p.join(DEADLINE_S)
        assert len(answers) == 8 and all(a.startswith(b"HTTP/1.1 401") for a in answers), answers
        assert app.read == 0  # not one byte of the 8 x 57 MiB was read into the app
        read_only = raw_post(server.port, "/api/v1/silences", BIG, 2**20, READ)
        assert read_only.startswith(b"HTTP/1.1 403") and app.read == 0
        url = f"http://127.0.0.1:{server.port}"
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as client:
            # a read without a token may carry 64 KiB at most; a valid token lifts the cap
            r = client.request("GET", "/api/v1/devices", content=b"x" * 2**20)
            assert r.status_code == 413 and "65536" in r.json()["error"]["message"]
            sample = {"metric": TEMP, "labels": {"host": "n", "gpu": "0"},
                      "timestamp": sqlite_store.now_ms() / 1000, "value": 1.0}  # fmt: skip
            batch = {"samples": [sample] * 2000}  # ~200 KiB
            ok = client.post("/api/v1/ingest/samples", json=batch, headers=bearer(WRITE))
            assert ok.status_code == 200, ok.text


class Gate:
    """A route that holds its worker thread until the test opens the gate."""

    def __init__(self) -> None:
        self.entered, self.open = threading.Event(), threading.Event()

    def handler(self) -> dict[str, str]:
        self.entered.set()
        self.open.wait(DEADLINE_S)
        return {"done": "yes"}


def gated_app(store: Store, **api: object) -> tuple[ASGIApp, Gate]:
    app = create_app(settings_for(store, **api), store)
    gate = Gate()
    app.add_api_route("/slow", gate.handler)
    return app, gate


def test_admission_limit_sheds_load_and_probes_still_pass(sqlite_store: Store) -> None:
    app, gate = gated_app(sqlite_store, max_concurrent_requests=1, max_queued_requests=1,
                          queue_timeout_seconds=0.2)  # fmt: skip
    with serve(app) as server:
        url = f"http://127.0.0.1:{server.port}"
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as client:
            slow = threading.Thread(target=client.get, args=("/slow",))
            slow.start()
            assert gate.entered.wait(DEADLINE_S)
            busy = client.get("/api/v1/devices")  # waits 0.2 s in the queue, then gives up
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "overloaded"
            assert "api.max_concurrent_requests" in busy.json()["error"]["message"]
            assert client.get("/healthz").status_code == 200  # the probes' own lane
            gate.open.set()
            slow.join(DEADLINE_S)
            assert client.get("/api/v1/devices").status_code == 200


def test_a_request_past_its_deadline_gets_a_503_and_keeps_its_slot(sqlite_store: Store) -> None:
    app, gate = gated_app(sqlite_store, max_concurrent_requests=1, max_queued_requests=0,
                          request_timeout_seconds=0.3)  # fmt: skip
    with serve(app) as server:
        url = f"http://127.0.0.1:{server.port}"
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as client:
            late = client.get("/slow")
            assert late.status_code == 503 and late.json()["error"]["code"] == "request_timeout"
            assert "api.request_timeout_seconds" in late.json()["error"]["message"]
            # the abandoned handler still runs, so its slot is still taken
            assert client.get("/api/v1/devices").json()["error"]["code"] == "overloaded"
            gate.open.set()
            deadline = time.monotonic() + DEADLINE_S
            while client.get("/api/v1/devices").status_code != 200:
                assert time.monotonic() < deadline, "the slot was never given back"


def test_api_server_runs_on_its_own_thread_and_stops_cleanly(sqlite_store: Store) -> None:
    app = create_app(settings_for(sqlite_store), sqlite_store)
    server = ApiServer(app, "127.0.0.1", 0)

    async def main() -> tuple[int, str]:
        stop = asyncio.Event()
        serving = asyncio.create_task(server.serve(stop))
        deadline = time.monotonic() + DEADLINE_S
        while not server.server.started:  # the loop stays free while the thread starts
            assert time.monotonic() < deadline and not serving.done()
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
            r = await client.get(f"http://127.0.0.1:{server.port}/healthz")
        stop.set()
        await serving
        return r.status_code, server.thread.name if server.thread else ""

    assert asyncio.run(main()) == (200, "hbmwatch-api")
    assert not server.running
    taken = ApiServer(app, "127.0.0.1", 0)
    taken.start()
    try:
        with pytest.raises(ApiServerError, match=r"cannot serve the API on 127\.0\.0\.1"):
            ApiServer(app, "127.0.0.1", taken.port).start()
    finally:
        taken.stop()
