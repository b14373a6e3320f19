"""The simulated fleet in a process of its own, for ``hbmwatch up``.

Sharing the service's event loop (and its one core's worth of GIL), the simulator's steps and
page renders made its pages late: on a busy machine scrapes missed their deadline and the
fleet looked down at start-up.  In a child process the fleet keeps its own time, as a real
exporter would.  The child ends when told to, and when its parent goes away (the pipe
closes), so a killed service leaves no fleet behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hbmwatch import log
from hbmwatch.simulator.server import Target

logger = log.get("hbmwatch.simulator")

START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 10.0


class SimulatorFailed(RuntimeError):
    """The fleet could not start (a port taken, a bad scenario); the message says why."""


@dataclass(frozen=True)
class FleetSpec:
    """What the child needs to build and serve the fleet (picklable)."""

    scenario: str
    seed: int | None
    base_port: int
    speed: float
    truth_file: str
    log_level: str = "info"
    log_format: str = "console"


@dataclass(frozen=True)
class FleetInfo:
    """What the child reports once it serves."""

    scenario: str
    gpus: int
    nodes: int
    first_port: int
    targets: list[Target]


class SimProcess:
    """Start with ``await start()``, stop with ``await stop()``; ``alive`` says if it runs."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        context = multiprocessing.get_context("spawn")  # no inherited threads or loop
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_child_main, args=(spec, child_conn), name="hbmwatch-sim", daemon=True
        )
        self._child_conn = child_conn

    async def start(self, timeout: float = START_TIMEOUT_SECONDS) -> FleetInfo:
        self._process.start()
        self._child_conn.close()
        ready = await asyncio.to_thread(self._conn.poll, timeout)
        if not ready:
            await self.stop()
            raise SimulatorFailed(f"the simulated fleet did not start within {timeout:g} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            await self.stop()
            raise SimulatorFailed("the simulated fleet exited while starting") from None
        if kind != "ok":
            await self.stop()
            raise SimulatorFailed(str(payload))
        return payload

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    async def wait(self, stop: asyncio.Event) -> None:
        """Return when ``stop`` is set or the fleet's process ends (its scenario finished)."""
        while not stop.is_set() and self.alive:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        if not stop.is_set():  # its targets now read as down: say why once
            logger.error("the simulated fleet's process ended", exitcode=self._process.exitcode)

    async def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send("stop")
        if self._process.pid is not None:
            await asyncio.to_thread(self._process.join, STOP_TIMEOUT_SECONDS)
            if self._process.is_alive():
                self._process.kill()
                await asyncio.to_thread(self._process.join, STOP_TIMEOUT_SECONDS)
        self._conn.close()


def _child_main(spec: FleetSpec, conn: Connection) -> None:
    from hbmwatch import log

    log.configure(spec.log_level, spec.log_format)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole group
        asyncio.run(_serve(spec, conn))


async def _serve(spec: FleetSpec, conn: Connection) -> None:
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import load_scenario
    from hbmwatch.simulator.server import SimServer

    try:
        sim = Simulation(load_scenario(spec.scenario), seed=spec.seed)
        server = SimServer(sim, base_port=spec.base_port, speed=spec.speed)
        targets = await server.start()
        sim.write_ground_truth(Path(spec.truth_file))
    except Exception as exc:  # every start failure goes back to the parent as one line
        conn.send(("error", _start_error(spec, exc)))
        return
    info = FleetInfo(sim.scenario.name, sim.fleet.size, len(sim.fleet.nodes), server.ports[0],
                     targets)  # fmt: skip
    conn.send(("ok", info))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)  # "stop", or EOF when the parent is gone
    try:
        await server.run(stop)
        await stop.wait()  # a finished scenario keeps serving its last pages
    finally:
        loop.remove_reader(conn.fileno())
        await server.close()


def _start_error(spec: FleetSpec, exc: Exception) -> Any:
    if isinstance(exc, OSError):
        return (
            f"cannot serve the simulated fleet from port {spec.base_port}: {exc}; set "
            "simulator.base_port (HBMWATCH_SIMULATOR__BASE_PORT=0 picks free ports)"
        )
    return f"cannot start the simulated fleet: {type(exc).__name__}: {exc}"
