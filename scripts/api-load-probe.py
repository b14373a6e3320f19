#!/usr/bin/env python3
"""Probe: 200 concurrent API clients against one process that also ingests.

The server process holds a SQLite store, the API and a stand-in collector: every
``--interval`` seconds it parses an exposition page on the event loop and writes the samples
(as the collector does), counting rounds that finished.  A child process runs ``--clients``
async clients reading one GPU's range query for ``--seconds`` (127.0.0.1 only).

  --mode plain    the API as it was: uvicorn on the collector's loop, no admission limit
  --mode guarded  ApiServer on its own thread, admission limits and deadlines (the defaults)
  --mode up       a real ``hbmwatch up`` (the simulated fleet, 122 targets at 1 s) in a
                  subprocess; ``--root DIR`` runs another checkout's code (the old one, say).
                  Kept rounds: scrapes done / scrapes due over the clients' seconds.

Prints p50/p99 of the read, 200s/503s/timeouts, and ingest rounds done vs due.
Usage: .venv/bin/python scripts/api-load-probe.py --mode guarded
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

GPUS = 64
HISTORY_S = 600


def fill(store, now_ms: int) -> None:  # type: ignore[no-untyped-def]
    """Ten minutes of one metric for 64 GPUs at 1 s: reads have real work to do."""
    from hbmwatch.records import Sample, SeriesKey

    for g in range(GPUS):
        key = SeriesKey("gpu_memory_temperature_celsius", {"host": f"n{g // 8}", "gpu": str(g % 8)})
        store.write([Sample(key, now_ms - i * 1000, 60.0 + i % 7) for i in range(HISTORY_S)])


def page(round_no: int) -> str:
    lines = [f'DCGM_FI_DEV_MEMORY_TEMP{{gpu="{g}",Hostname="ingest"}} {60 + round_no % 9}'
             for g in range(GPUS * 8)]  # fmt: skip
    return "\n".join(lines)


async def ingest(store, interval: float, seconds: float) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Rounds finished within their interval, and rounds due: what the collector would do."""
    from hbmwatch.records import Sample, SeriesKey

    done, due, started = 0, int(seconds / interval), time.monotonic()
    for n in range(due):
        tick = started + n * interval
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
        now_ms = store.now_ms()
        samples = []
        for line in page(n).splitlines():  # the parse runs on the loop, as scrapes do
            name, _, value = line.rpartition(" ")
            gpu = name.split('gpu="', 1)[1].split('"', 1)[0]
            key = SeriesKey("gpu_memory_temperature_celsius", {"host": "ingest", "gpu": gpu})
            samples.append(Sample(key, now_ms, float(value)))
        await asyncio.to_thread(store.write, samples)
        done += time.monotonic() - tick < interval
    return done, due


async def serve(args: argparse.Namespace) -> dict[str, object]:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from hbmwatch.api.main import create_app
    from hbmwatch.api.server import ApiServer
    from hbmwatch.settings import Settings
    from hbmwatch.store.migrate import upgrade
    from hbmwatch.store.store import create_store_engine, open_store

    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'probe.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    api = {"port": args.port}
    if args.concurrency:
        api["max_concurrent_requests"] = args.concurrency
    settings = Settings(store={"url": url}, api=api)  # type: ignore[arg-type]
    if args.mode == "plain":  # no admission limit, no deadline: what 200 clients met before
        settings = settings.model_copy(
            update={"api": settings.api.model_copy(update={
                "max_concurrent_requests": 1024, "request_timeout_seconds": 600})}
        )  # fmt: skip
    store = open_store(settings.store)
    fill(store, store.now_ms())
    registry = CollectorRegistry()
    app = create_app(settings, store, registry=registry)
    stop = asyncio.Event()
    if args.mode == "plain":
        server = uvicorn.Server(uvicorn.Config(app, port=args.port, log_config=None))
        serving = asyncio.create_task(server.serve())
    else:
        api_server = ApiServer(app, "127.0.0.1", args.port)
        serving = asyncio.create_task(api_server.serve(stop))
    await asyncio.sleep(1.0)  # a probe, not a test: let the server bind
    clients = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "clients", "--port", str(args.port),
        "--clients", str(args.clients), "--seconds", str(args.seconds),
        stdout=subprocess.PIPE,
    )  # fmt: skip
    done, due = await ingest(store, args.interval, args.seconds)
    out, _ = await clients.communicate()
    stop.set()
    if args.mode == "plain":
        server.should_exit = True
    await serving
    store.close()
    route = {"method": "GET", "route": "/api/v1/query_range"}
    total = registry.get_sample_value("hbmwatch_http_request_duration_seconds_sum", route)
    count = registry.get_sample_value("hbmwatch_http_request_duration_seconds_count", route)
    return {
        "mode": args.mode,
        **json.loads(out),
        "server_mean_s": round((total or 0) / (count or 1), 3),  # queue wait included
        "ingest_rounds_on_time": f"{done}/{due}",
    }


def scrape_counters(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=60).text
    wanted = ("hbmwatch_collector_scrapes_total", "hbmwatch_target_up")
    out = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] += 1.0 if sample.name == "hbmwatch_target_up" else sample.value
    return out


async def against_up(args: argparse.Namespace) -> dict[str, object]:
    """A real ``hbmwatch up`` on the simulated fleet, read by the clients meanwhile."""
    import os

    work = Path(tempfile.mkdtemp(prefix="hbmwatch-load-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HBMWATCH_")}
    env.update(HBMWATCH_API__PORT=str(args.port), HBMWATCH_SIMULATOR__BASE_PORT="0",
               HBMWATCH_STORE__URL=f"sqlite:///{work / 'hbmwatch.db'}")  # fmt: skip
    env.update(pair.split("=", 1) for pair in args.env)  # type: ignore[misc]
    if args.root:
        env["PYTHONPATH"] = str(Path(args.root).resolve())
    cli = [sys.executable, "-m", "hbmwatch.cli"]
    subprocess.run([*cli, "migrate"], cwd=work, env=env, check=True, capture_output=True)
    log = (work / "up.log").open("w")
    up = subprocess.Popen([*cli, "up"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)
        else:
            raise SystemExit(f"hbmwatch up was not ready within 300 s: see {work / 'up.log'}")
        await asyncio.sleep(10.0)  # a probe, not a test: past start-up's first rounds
        before, t0 = scrape_counters(base), time.monotonic()
        clients = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--role", "clients", "--port", str(args.port),
            "--clients", str(args.clients), "--seconds", str(args.seconds),
            "--host-prefix", "r0-node", stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await clients.communicate()
        after, t1 = scrape_counters(base), time.monotonic()
    finally:
        up.terminate()
        up.wait(60)
        log.close()
    targets = after["hbmwatch_target_up"]
    done = after["hbmwatch_collector_scrapes_total"] - before["hbmwatch_collector_scrapes_total"]
    due = targets * (t1 - t0)
    return {"mode": "up", "root": args.root or ".", "env": args.env, **json.loads(out),
            "scrapes_kept": f"{done:.0f}/{due:.0f} ({done / due:.0%})"}  # fmt: skip


async def hammer(args: argparse.Namespace) -> dict[str, object]:
    """``--clients`` loops reading a range query until ``--seconds`` are up."""
    latencies: list[float] = []
    codes: dict[str, int] = {}
    end = time.monotonic() + args.seconds
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    base = f"http://127.0.0.1:{args.port}"
    async with httpx.AsyncClient(base_url=base, timeout=10.0, limits=limits) as client:

        async def one(i: int) -> None:
            host = f"{args.host_prefix}{i % args.hosts}"
            params = {"query": f'gpu_memory_temperature_celsius{{host="{host}"}}', "step": 10}
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    r = await client.get("/api/v1/query_range", params=params)
                    key = str(r.status_code)
                except httpx.TimeoutException:
                    key = "timeout"
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                codes[key] = codes.get(key, 0) + 1
                if key == "200":
                    latencies.append(time.monotonic() - t0)
                elif key == "503":
                    await asyncio.sleep(1.0)  # Retry-After

        await asyncio.gather(*(one(i) for i in range(args.clients)))
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"clients": args.clients, "seconds": args.seconds, "codes": codes,
            "p50_s": round(q[49], 3), "p99_s": round(q[98], 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("plain", "guarded", "up"), default="guarded")
    parser.add_argument("--root", help="--mode up: the checkout whose code runs")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="HBMWATCH_X=V",
        help="--mode up: a setting for the service (HBMWATCH_API__NICE=0)",
    )
    parser.add_argument("--host-prefix", default="n", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("server", "clients"), default="server")
    parser.add_argument("--port", type=int, default=18427)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, help="api.max_concurrent_requests (guarded)")
    args = parser.parse_args()
    runs = {"plain": serve, "guarded": serve, "up": against_up}
    run = hammer if args.role == "clients" else runs[args.mode]
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
