#!/usr/bin/env python
"""Measure what hbmwatch loses across kill -9, SIGTERM and a PostgreSQL outage (issue 12).

The probe serves its own exporter pages (DCGM format, 8 GPUs, 40 samples a page) and counts
every page it hands out.  Every scrape writes one ``hbmwatch_target_up`` sample, so

    scrapes lost = pages served - target_up 1s stored - target_up 1s still spooled

(a spooled batch is replayed by the next start, so it is not lost; a scrape that failed,
its deadline passed on a busy host, is stored as ``up 0`` and reported apart: it counts as
lost here if the page was sent).  A scrape lost costs its page's 40 samples plus 3 health
samples.  Cases:

* ``kill9-up``, ``kill9-collect``: run, then SIGKILL.
* ``sigterm-up``, ``sigterm-collect``: run, then SIGTERM; the process must exit 0.
* ``pg-outage``: ``hbmwatch up`` on a private PostgreSQL server that is stopped for
  ``--outage`` seconds (needs root, runuser and postgresql-15, as tests/conftest.py).

Usage: ``.venv/bin/python scripts/outage-probe.py [CASE ...] [--seconds 20] [--outage 60]``.
Prints one line per case and a JSON summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hbmwatch.collector.spool import decode_batch  # noqa: E402
from hbmwatch.query import Aggregation, parse_selector  # noqa: E402
from hbmwatch.settings import StoreSettings  # noqa: E402
from hbmwatch.store.store import open_store  # noqa: E402

HBMWATCH = [sys.executable, "-m", "hbmwatch.cli"]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_MEMORY_TEMP",
           "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL"]  # fmt: skip
SAMPLES_PER_SCRAPE = len(METRICS) * 8 + 3
CASES = ["kill9-collect", "kill9-up", "sigterm-collect", "sigterm-up", "pg-outage"]


def page(node: int) -> bytes:
    lines = []
    for m in METRICS:
        lines.append(f"# TYPE {m} gauge")
        for g in range(8):
            uuid = f"GPU-{node:04d}{g:04d}-0000-0000-0000-000000000000"
            labels = f'gpu="{g}",UUID="{uuid}",Hostname="node{node}",modelName="NVIDIA H100"'
            lines.append(f"{m}{{{labels}}} {40 + g}")
    return ("\n".join(lines) + "\n").encode()


class Exporter:
    """``targets`` pages on one port, each GET counted by path."""

    def __init__(self, targets: int) -> None:
        self.served: Counter[str] = Counter()
        pages = {f"/node{i}/metrics": page(i) for i in range(targets)}
        served, lock = self.served, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with lock:
                    served[self.path] += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.paths = list(pages)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def target_file(self, folder: Path) -> Path:
        path = folder / "targets.json"
        path.write_text(json.dumps([
            {"kind": "dcgm", "url": self.base + p, "labels": {"cluster": "probe", "rack": "r0",
                                                            "host": p.split("/")[1]}}
            for p in self.paths
        ]))  # fmt: skip
        return path

    def total(self) -> int:
        return sum(self.served.values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what: str, check: object, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"outage-probe: no {what} within {seconds:.0f} s")
        time.sleep(0.2)


def stored_scrapes(url: str) -> tuple[int, int]:
    """Scrapes in the store: (all of them, those that got a page) by ``hbmwatch_target_up``."""
    store = open_store(StoreSettings(url=url))
    try:
        now = time.time()
        selector = parse_selector('hbmwatch_target_up{cluster="probe"}')
        found = [
            sum(p.value for s in q.series for p in s.points)
            for q in (
                store.range_query(selector, now - 7200, now + 600, 3600, agg)
                for agg in (Aggregation.COUNT, Aggregation.SUM)
            )
        ]
        return int(found[0]), int(found[1])
    finally:
        store.close()


def spooled_scrapes(spool: Path) -> int:
    """Scrapes that got a page, still in the spool (the next start replays them)."""
    return sum(
        sum(
            1
            for s in decode_batch(f.read_bytes())
            if s.series.metric == "hbmwatch_target_up" and s.value == 1
        )
        for f in spool.glob("*.batch")
    )


def start(command: str, folder: Path, url: str, targets: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HBMWATCH_")}
    env.update(HBMWATCH_STORE__URL=url, HBMWATCH_SIMULATOR__ENABLED="false",
               HBMWATCH_COLLECTOR__TARGET_FILE=str(targets),
               HBMWATCH_API__PORT=str(free_port()), PYTHONPATH=str(REPO))  # fmt: skip
    subprocess.run([*HBMWATCH, "migrate"], cwd=folder, env=env, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    log = (folder / f"{command}.log").open("ab")
    return subprocess.Popen([*HBMWATCH, command], cwd=folder, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def measure(case: str, exporter: Exporter, folder: Path, url: str, seconds: float,
            stopper: str, command: str, during: object = None) -> dict:  # fmt: skip
    targets = exporter.target_file(folder)
    proc = start(command, folder, url, targets)
    try:
        wait("scrapes", lambda: len(exporter.served) == len(exporter.paths))
        first, t_first = exporter.total(), time.monotonic()
        extra = during() if during else {}  # type: ignore[operator]
        time.sleep(seconds)  # the run being measured, not a wait for a condition
        started = time.monotonic()
        pages_before_stop = exporter.total() - first
        proc.send_signal(signal.SIGKILL if stopper == "kill9" else signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:  # the probe failed: leave nothing running
            proc.kill()
            proc.wait(30)
    exit_s = time.monotonic() - started
    time.sleep(1.5)  # let the exporter finish any page it was writing when the process died
    served = exporter.total()
    (scrapes, stored), spooled = stored_scrapes(url), spooled_scrapes(folder / "hbmwatch-spool")
    lost = max(served - stored - spooled, 0)
    return {
        "case": case, "exit_code": code, "exit_seconds": round(exit_s, 2),
        "pages_served": served, "scrapes_stored": stored, "scrapes_spooled": spooled,
        "failed_scrapes_stored": scrapes - stored,
        "scrapes_lost": lost, "samples_lost": lost * SAMPLES_PER_SCRAPE,
        "samples_per_second": round(pages_before_stop * SAMPLES_PER_SCRAPE / (started - t_first)),
        **extra,
    }  # fmt: skip


@contextlib.contextmanager
def private_pg() -> Iterator[dict]:
    """A PostgreSQL server of the probe's own, to stop and start (as tests/conftest.py)."""
    if not (PG_BIN / "initdb").exists() or os.geteuid() != 0 or not shutil.which("runuser"):
        raise SystemExit("outage-probe: pg-outage needs root, runuser and postgresql-15")
    folder = Path(tempfile.mkdtemp(prefix="hbmwatch-probe-pg-"))
    os.chmod(folder, 0o755)
    shutil.chown(folder, "postgres")
    port = free_port()

    def pg(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, timeout=120)  # fmt: skip

    data = str(folder / "data")
    pg(str(PG_BIN / "initdb"), "-D", data, "-A", "trust", "-U", "postgres")
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}"
    ctl = str(PG_BIN / "pg_ctl")
    log = str(folder / "log")
    server = {
        "url": f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
        "start": lambda: pg(ctl, "-D", data, "-l", log, "-w", "-o", options, "start"),
        "stop": lambda: pg(ctl, "-D", data, "-m", "fast", "-w", "stop"),
    }
    server["start"]()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server["stop"]()
        shutil.rmtree(folder, ignore_errors=True)


def pg_outage(exporter: Exporter, folder: Path, outage: float, targets: int) -> dict:
    with private_pg() as pg:

        def during() -> dict:
            pg["stop"]()
            before, t0 = exporter.total(), time.monotonic()
            time.sleep(outage)  # the outage being measured
            served = exporter.total() - before
            rate = served / (targets * (time.monotonic() - t0))
            pg["start"]()
            spool = folder / "hbmwatch-spool"
            wait("the spool to drain", lambda: not list(spool.glob("*.batch")), 300)
            return {"outage_seconds": outage, "scrapes_during_outage": served,
                    "scrape_rate_during_outage": round(rate, 3)}  # fmt: skip

        return measure("pg-outage", exporter, folder, pg["url"], 5, "sigterm", "up", during)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--seconds", type=float, default=20.0, help="run length before the stop")
    parser.add_argument("--outage", type=float, default=60.0, help="PostgreSQL outage length")
    parser.add_argument("--targets", type=int, default=20, help="exporter pages, 1 s interval")
    args = parser.parse_args()
    if unknown := set(args.cases) - set(CASES):
        parser.error(f"unknown case {sorted(unknown)[0]!r}; choose from {', '.join(CASES)}")
    args.cases = args.cases or CASES
    results = []
    for case in args.cases:
        exporter = Exporter(args.targets)
        with tempfile.TemporaryDirectory(prefix="hbmwatch-probe-") as tmp:
            folder = Path(tmp)
            if case == "pg-outage":
                result = pg_outage(exporter, folder, args.outage, args.targets)
            else:
                stopper, command = case.split("-")
                url = f"sqlite:///{folder / 'hbmwatch.db'}"
                result = measure(case, exporter, folder, url, args.seconds, stopper, command)
        exporter.server.shutdown()
        print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)
        results.append(result)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
