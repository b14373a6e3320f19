#!/usr/bin/env python3
"""Probe: 8 unauthenticated 57 MiB POSTs against a real server; its peak RSS and the answers.

The server runs in a child process (``ApiServer`` over a fresh SQLite store, 127.0.0.1) so its
RSS is its own.  Prints RSS before, peak RSS (VmHWM) and each POST's status and seconds.
Usage: .venv/bin/python scripts/api-body-probe.py [--root CHECKOUT]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIG = 57 * 2**20
POSTS = 8


def serve(port: int) -> None:
    from hbmwatch.api.main import create_app
    from hbmwatch.api.server import ApiServer
    from hbmwatch.settings import Settings
    from hbmwatch.store.migrate import upgrade
    from hbmwatch.store.store import create_store_engine, open_store

    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'probe.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    settings = Settings(store={"url": url}, api={"write_token": "w" * 20})  # type: ignore[arg-type]
    server = ApiServer(create_app(settings, open_store(settings.store)), "127.0.0.1", port)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes it
    server.stop()


def post(port: int, body: bytes, answers: list[tuple[str, float]]) -> None:
    started = time.monotonic()
    head = (f"POST /api/v1/ingest/samples HTTP/1.1\r\nHost: probe\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head.encode())
        with contextlib.suppress(OSError):  # the server may answer and close first
            sock.sendall(body)
        try:
            status = sock.recv(64).split(b"\r\n", 1)[0].decode()
        except OSError as exc:
            status = repr(exc)
    answers.append((status, round(time.monotonic() - started, 2)))


def status_kib(pid: int, key: str) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    line = next(x for x in lines if x.startswith(key))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port)
        return
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(args.port)],
        cwd=args.root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={"PYTHONPATH": args.root, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        before = status_kib(child.pid, "VmRSS:") // 1024
        body, answers = b" " * BIG, []
        threads = [threading.Thread(target=post, args=(args.port, body, answers))
                   for _ in range(POSTS)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = status_kib(child.pid, "VmHWM:") // 1024
        print({"rss_before_mb": before, "peak_rss_mb": peak, "answers": sorted(answers)})
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(60)


if __name__ == "__main__":
    main()
