"""CPU per scrape of the collector's fetch path and of a whole engine round (issue 17).

    python scripts/bench_fetch.py [--gpus 256] [--rounds 20] [--fetch httpx-stream,...]

Serves a simulated fleet with one vLLM page a GPU (``hbmwatch sim`` in a subprocess, on a
slow simulated clock so that serving costs little and pages do not change), then times,
in this process only (``time.process_time``: the host is shared, wall time is noise):

- fetch only: every target's page fetched once a round by each client variant, all at
  once (``asyncio.gather``), as the engine does;
- engine: ``ScrapeEngine.scrape_round`` (fetch, limits, translation, health) into a sink
  that discards, i.e. the collector's whole per-scrape cost but the store's.

Each figure is the best (least CPU) of ``--rounds`` rounds after two warm-up rounds, in
microseconds a scrape and a 1,000 exposition lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from hbmwatch import log
from hbmwatch.bench.scale import simulated_fleet
from hbmwatch.bench.versus import inference_fleet_toml
from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.settings import CollectorSettings

ACCEPT = {"Accept": "text/plain;version=0.0.4"}
LIMIT = 10 * 2**20
Fetch = Callable[[str], Awaitable[bytes]]


@contextlib.contextmanager
def fleet(gpus: int) -> Iterator[list[dict[str, Any]]]:
    """The simulated fleet (``bench versus``' shape), serving; its targets."""
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        toml = inference_fleet_toml(gpus)
        with simulated_fleet(Path(tmp), gpus, toml=toml, speed=0.01) as (_, targets):
            yield targets


async def best_cpu(round_: Callable[[], Awaitable[object]], rounds: int) -> float:
    """The least CPU-seconds one round took, after two warm-up rounds."""
    for _ in range(2):
        await round_()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        await round_()
        best = min(best, time.process_time() - t0)
    return best


# -- fetch-only variants ------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def httpx_stream(urls: list[str]) -> Any:
    """The collector before issue 17: a client a target, ``stream``, the deadline's task."""
    from hbmwatch.collector.engine import _tls_context

    clients = {
        u: httpx.AsyncClient(
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
            verify=_tls_context(),
            headers=ACCEPT,
        )
        for u in urls
    }

    async def stream(url: str) -> bytes:
        async with clients[url].stream("GET", url, timeout=None) as r:
            chunks = [c async for c in r.aiter_bytes()]
        return b"".join(chunks)

    async def fetch(url: str) -> bytes:
        task = asyncio.ensure_future(stream(url))
        await asyncio.wait({task}, timeout=10)
        return task.result()

    yield fetch
    for c in clients.values():
        await c.aclose()


@contextlib.asynccontextmanager
async def httpx_get(urls: list[str]) -> Any:
    """A client a target, a plain ``get`` under ``asyncio.timeout``."""
    clients = {u: httpx.AsyncClient(headers=ACCEPT) for u in urls}

    async def fetch(url: str) -> bytes:
        async with asyncio.timeout(10):
            return (await clients[url].get(url, timeout=None)).content

    yield fetch
    for c in clients.values():
        await c.aclose()


def _aiohttp_session() -> Any:
    import aiohttp

    return aiohttp.ClientSession(
        headers=ACCEPT,
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=2),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )


async def _aiohttp_read(session: Any, url: str) -> bytes:
    async with asyncio.timeout(10), session.get(url) as r:
        return await r.content.read(LIMIT + 1)


@contextlib.asynccontextmanager
async def aiohttp_shared(urls: list[str]) -> Any:
    """One aiohttp session (and connection pool) for the engine."""
    session = _aiohttp_session()
    yield lambda url: _aiohttp_read(session, url)
    await session.close()


@contextlib.asynccontextmanager
async def aiohttp_per_target(urls: list[str]) -> Any:
    """One aiohttp session a target."""
    sessions = {u: _aiohttp_session() for u in urls}
    yield lambda url: _aiohttp_read(sessions[url], url)
    for s in sessions.values():
        await s.close()


@contextlib.asynccontextmanager
async def own_client(urls: list[str]) -> Any:
    """hbmwatch's own HTTP/1.1 client, if this tree has one (collector/http.py)."""
    from hbmwatch.collector.engine import _tls_context
    from hbmwatch.collector.http import HttpClient

    clients = {u: HttpClient(_tls_context(), ACCEPT) for u in urls}

    async def fetch(url: str) -> bytes:
        async with asyncio.timeout(10):
            return await clients[url].get(url, LIMIT)

    yield fetch
    for c in clients.values():
        await c.aclose()


VARIANTS = {
    "httpx-stream": httpx_stream,
    "httpx-get": httpx_get,
    "aiohttp-shared": aiohttp_shared,
    "aiohttp-per-target": aiohttp_per_target,
    "own": own_client,
}


async def fetch_only(name: str, urls: list[str], rounds: int) -> dict[str, Any]:
    async with VARIANTS[name](urls) as fetch:
        sizes: list[int] = []

        async def round_() -> None:
            pages = await asyncio.gather(*(fetch(u) for u in urls))
            sizes[:] = [len(p) for p in pages]

        cpu = await best_cpu(round_, rounds)
    return {"variant": name, "round_cpu_s": cpu, "bytes": sum(sizes)}


# -- the whole engine ---------------------------------------------------------------------------
class Discard:
    """A sink that counts and forgets: the store's cost is not the collector's."""

    def __init__(self) -> None:
        self.samples = 0

    def add(self, samples: list[Any]) -> None:
        self.samples += len(samples)

    def due(self) -> bool:
        return False

    async def flush(self) -> None:
        return None


async def engine_rounds(targets: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    settings = CollectorSettings()
    chosen = [Target(t["kind"], t["url"], t["labels"], 1.0, 30.0) for t in targets]
    sink = Discard()
    engine = ScrapeEngine(TargetSet(settings, chosen), sink, settings)  # type: ignore[arg-type]
    ts = [1_800_000_000_000]
    ups: list[int] = []

    async def round_() -> None:
        ts[0] += 1000
        reports = await engine.scrape_round(ts[0])
        ups.append(sum(r.up for r in reports))

    async with engine:
        cpu = await best_cpu(round_, rounds)
    return {"round_cpu_s": cpu, "up": min(ups), "samples_per_round": sink.samples / len(ups)}


async def exposition_lines(urls: list[str]) -> int:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        pages = await asyncio.gather(*(client.get(u) for u in urls))
    return sum(1 for p in pages for line in p.text.splitlines() if line and line[0] != "#")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fetch", default="httpx-stream,httpx-get,aiohttp-shared,own")
    parser.add_argument("--no-engine", action="store_true")
    args = parser.parse_args()
    log.configure("warning")
    with fleet(args.gpus) as targets:
        urls = [t["url"] for t in targets]
        lines = asyncio.run(exposition_lines(urls))
        n = len(urls)
        print(f"{n} targets, {lines} exposition lines a round")

        def show(label: str, cpu: float) -> None:
            per_scrape, per_kline = cpu / n * 1e6, cpu / lines * 1e9
            print(f"{label:28s} {cpu * 1e3:8.1f} ms/round {per_scrape:7.0f} us/scrape "
                  f"{per_kline:7.0f} us/1k lines")  # fmt: skip

        for name in filter(None, args.fetch.split(",")):
            try:
                row = asyncio.run(fetch_only(name, urls, args.rounds))
            except ImportError as exc:
                print(f"{name:28s} unavailable ({exc})")
                continue
            show(f"fetch {name}", row["round_cpu_s"])
        if not args.no_engine:
            row = asyncio.run(engine_rounds(targets, args.rounds))
            show("engine scrape_round", row["round_cpu_s"])
            print(f"{'':28s} up {row['up']}/{n}, {row['samples_per_round']:.0f} samples/round")


if __name__ == "__main__":
    main()
