"""Serve a simulation over HTTP on 127.0.0.1: one port per simulated node.

On each node's port: ``/metrics`` is the node's exporter page (AMD Device Metrics Exporter
or dcgm-exporter; 503 while a ``target_down`` fault holds), ``/services/NAME/metrics`` each
inference service's vLLM page, ``/jobs/NAME/metrics`` each training job's step times.
The simulated clock runs ``speed`` times faster than the wall clock, in fixed steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from hbmwatch import log
from hbmwatch.simulator.runner import Simulation

logger = log.get("hbmwatch.simulator")
MAX_REQUEST_BYTES = 16_384


@dataclass(frozen=True)
class Target:
    """A scrape target the simulation serves (the collector's target format)."""

    kind: str  # dme | dcgm | vllm | training
    url: str
    labels: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "labels": self.labels}


class SimServer:
    def __init__(
        self, sim: Simulation, *, host: str = "127.0.0.1", base_port: int = 0, speed: float = 1.0
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.sim = sim
        self.host = host
        self.base_port = base_port
        self.speed = speed
        self.ports: list[int] = []
        self._servers: list[asyncio.Server] = []
        self._routes: list[dict[str, Any]] = []
        self._started_wall = 0.0
        self._connections: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._pages: dict[tuple[str, int], tuple[int, bytes]] = {}  # one render a step

    async def start(self) -> list[Target]:
        fleet = self.sim.fleet
        for node in fleet.nodes:
            routes = self.routes_of(node.index)
            port = self.base_port + node.index if self.base_port else 0
            server = await asyncio.start_server(
                lambda r, w, routes=routes: self._handle(r, w, routes),
                self.host,
                port,
                reuse_address=True,
            )
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])
            self._routes.append(routes)
        self._started_wall = time.monotonic()
        return self.targets()

    def routes_of(self, node: int) -> dict[str, Any]:
        """A node's pages: its exporter's, then one per service and training job on it."""
        fleet = self.sim.fleet
        routes: dict[str, Any] = {"/metrics": ("node", node)}
        for s in fleet.services:
            if s.node == node:
                routes[f"/services/{s.name}/metrics"] = ("service", s.index)
        for j in fleet.jobs:
            if j.node == node:
                routes[f"/jobs/{j.name}/metrics"] = ("job", j.index)
        return routes

    def targets(self) -> list[Target]:
        fleet = self.sim.fleet
        out = []
        for node, port in zip(fleet.nodes, self.ports, strict=True):
            base = f"http://{self.host}:{port}"
            labels = {"cluster": node.cluster, "rack": node.rack_name, "host": node.host}
            out.append(Target(node.exporter, f"{base}/metrics", labels))
            for s in fleet.services:
                if s.node == node.index:
                    gpu = fleet.gpus[s.gpu].device
                    svc_labels = {**labels, "gpu": gpu.gpu, "service": s.name}
                    if fleet.gpus[s.gpu].partitions > 1:
                        svc_labels["partition"] = str(s.partition)
                    out.append(Target("vllm", f"{base}/services/{s.name}/metrics", svc_labels))
            for j in fleet.jobs:
                if j.node == node.index:
                    out.append(
                        Target(
                            "training",
                            f"{base}/jobs/{j.name}/metrics",
                            {**labels, "service": j.name},
                        )
                    )
        return out

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Advance the simulated clock with the wall clock until the scenario ends."""
        stop = stop or asyncio.Event()
        sim = self.sim
        while not sim.finished and not stop.is_set():
            target = (time.monotonic() - self._started_wall) * self.speed
            while sim.t + sim.scenario.step <= target and not sim.finished:
                sim.step()
                if sim.steps % 200 == 0:
                    await asyncio.sleep(0)  # let scrapes in during catch-up
            wait = max(0.0, (sim.t + sim.scenario.step - target) / self.speed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(wait, 1.0))
        logger.info("scenario finished", scenario=sim.scenario.name, simulated_s=sim.t)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._connections):  # as a stopped process, drop keep-alives
            writer.close()
        if self._handlers:  # let each connection's handler see its EOF and finish
            await asyncio.wait(list(self._handlers), timeout=5)
        for server in self._servers:
            await server.wait_closed()

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: dict[str, Any]
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if len(head) > MAX_REQUEST_BYTES:
                    await self._respond(writer, 431, b"request header too large\n")
                    break
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = line.split(" ")
                if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
                    await self._respond(writer, 405, b"only GET is served\n")
                    break
                path = parts[1].split("?", 1)[0]
                status, body, ctype = self._route(path, routes)
                await self._respond(writer, status, b"" if parts[0] == "HEAD" else body, ctype)
                if b"connection: close" in head.lower():
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _route(self, path: str, routes: dict[str, Any]) -> tuple[int, bytes, str]:
        text_type = "text/plain; version=0.0.4; charset=utf-8"
        if path == "/targets":
            body = json.dumps([t.as_dict() for t in self.targets()]).encode()
            return 200, body, "application/json"
        if path == "/healthz":
            return 200, b"ok\n", "text/plain"
        route = routes.get(path)
        if route is None:
            return 404, f"no such path {path}; try /metrics\n".encode(), "text/plain"
        kind, index = route
        cached = self._pages.get(route)
        if cached is not None and cached[0] == self.sim.steps:
            return 200, cached[1], text_type
        if kind == "node":
            page = self.sim.node_page(index)
            if page is None:
                return 503, b"exporter unavailable (simulated target_down fault)\n", "text/plain"
        elif kind == "service":
            page = self.sim.service_page(index)
        else:
            page = self.sim.job_page(index)
        body = page.encode()
        self._pages[route] = (self.sim.steps, body)
        return 200, body, text_type

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain"
    ) -> None:
        reason = {
            200: "OK",
            404: "Not Found",
            405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
            503: "Service Unavailable",
        }.get(status, "OK")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
