"""The long-running commands: ``migrate``, ``up``, ``serve``, ``detect``, ``collect``, ``sim``.

One process each (docs/scale.md): the single-process service, the API alone, detector and
collector shards, the simulated fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hbmwatch import log
from hbmwatch.cli.common import ConfigOption, bound, check_store, console, fail, first_error
from hbmwatch.cli.common import settings_from as _settings
from hbmwatch.runtime import preflight
from hbmwatch.settings import DetectionSettings
from hbmwatch.sharding import Shard
from hbmwatch.validation import HbmwatchError

app = typer.Typer()  # registered on the main app by hbmwatch.cli.main


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the database schema to the latest migration."""
    settings = _settings(config)
    check_store(settings)  # before the service's heavy imports: a bad URL fails at once
    from hbmwatch.runtime.service import migrate as run_migrate

    revision = run_migrate(settings)
    console.print(f"schema at revision {revision}")


@app.command()
def up(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default 8427).")] = None,
) -> None:
    """Migrate, then run the service: store maintenance and the HTTP API."""
    settings = bound(_settings(config), host, port)
    try:  # before anything starts: a taken port or a missing database fails in one line
        preflight.before_up(settings)
    except HbmwatchError as exc:
        raise fail(exc) from None
    from hbmwatch.runtime import service

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(service.run(settings))


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default 8427).")] = None,
) -> None:
    """Run the HTTP API alone over a migrated store others write (docs/scale.md)."""
    settings = bound(_settings(config), host, port)
    try:
        preflight.check_store(settings.store, must_exist=True)
        preflight.check_api_port(settings.api.host, settings.api.port)
    except HbmwatchError as exc:
        raise fail(exc) from None
    from hbmwatch.runtime import api_only

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(api_only.serve(settings))
    except HbmwatchError as exc:
        raise fail(exc) from None


@app.command()
def detect(
    config: ConfigOption = None,
    shard: Annotated[
        str | None, typer.Option(help="i/N: run the per-rack detectors on shard i of N racks.")
    ] = None,
    fleet_wide: Annotated[
        str | None,
        typer.Option(help="auto (shard 0), also, only or off: where the fleet-wide detectors run."),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Serve /metrics on this port.")
    ] = None,
) -> None:
    """Run detectors alone over a shared store (PostgreSQL), and stand for alert leader."""
    settings = _settings(config)
    given = {"shard": shard, "fleet_wide": fleet_wide}
    try:  # through the settings' own checks: "4/4" is as wrong here as in the file
        settings.detection = DetectionSettings.model_validate(
            {**settings.detection.model_dump(), **{k: v for k, v in given.items() if v}}
        )
    except ValueError as exc:
        console.print(f"[red]error:[/red] {first_error(exc)}")
        raise typer.Exit(2) from None
    check_store(settings)
    from hbmwatch.runtime import service

    try:
        asyncio.run(service.detect_only(settings, metrics_port))
    except KeyboardInterrupt:
        return
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@app.command()
def collect(
    config: ConfigOption = None,
    targets: Annotated[
        Path | None, typer.Option(help="A target file (JSON or TOML) to scrape, re-read on change.")
    ] = None,
    once: Annotated[bool, typer.Option(help="Scrape every target once and report.")] = False,
    seconds: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: run until ^C).")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="i/N (0-based): scrape only the targets whose URL hashes to shard i of N "
            "(collector.shard)."
        ),
    ] = None,
) -> None:
    """Run the collector alone: scrape the configured targets into the store."""
    settings = _settings(config)
    if targets is not None:
        settings.collector.target_file = str(targets)
    if shard is not None:
        try:
            settings.collector.shard = str(Shard.parse(shard))
        except ValueError as exc:
            console.print(f"[red]error:[/red] --shard: {exc}")
            raise typer.Exit(2) from None
    if not settings.collector.configured:
        console.print(
            "[red]error:[/red] no targets configured: set collector.targets, "
            "collector.target_file or collector.local_sources (or pass --targets FILE); "
            "`hbmwatch up` runs the simulated fleet instead"
        )
        raise typer.Exit(2)
    check_store(settings)
    from hbmwatch.runtime import service

    try:
        report = asyncio.run(service.collect(settings, once=once, seconds=seconds))
    except KeyboardInterrupt:
        return
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if once:
        table = Table(title="one scrape of every target")
        for column in ("target", "up", "samples", "dropped", "seconds", "error"):
            table.add_column(column)
        for r in report:
            dropped = ", ".join(f"{k} {v}" for k, v in sorted(r.dropped.items())) or "-"
            table.add_row(
                r.target,
                "yes" if r.up else "[red]no[/red]",
                str(r.samples),
                dropped,
                f"{r.duration_s:.3f}",
                r.error,
            )
        Console(width=160).print(table)
        if not all(r.up for r in report):
            raise typer.Exit(1)


@app.command()
def sim(
    scenario: Annotated[str, typer.Argument(help="A bundled scenario name or a TOML file.")],
    seed: Annotated[int | None, typer.Option(help="Overrides the scenario's seed.")] = None,
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second.")] = 1.0,
    port: Annotated[int, typer.Option(help="First node's port (0: any free ports).")] = 9500,
    truth: Annotated[Path, typer.Option(help="Where to write the ground truth JSON.")] = Path(
        "hbmwatch-sim-truth.json"
    ),
    targets_file: Annotated[
        Path | None, typer.Option("--targets", help="Also write the scrape targets (JSON).")
    ] = None,
    exporter_refresh: Annotated[
        float | None,
        typer.Option(help="Seconds between exporter page refreshes (overrides the scenario)."),
    ] = None,
) -> None:
    """Serve a simulated fleet's exporter, vLLM and training endpoints on 127.0.0.1."""
    from hbmwatch.runtime.supervise import stop_on_signals
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import load_scenario
    from hbmwatch.simulator.server import SimServer

    log.configure("info")
    if speed <= 0:
        console.print("[red]error:[/red] --speed must be positive")
        raise typer.Exit(2)
    if exporter_refresh is not None and not 0 <= exporter_refresh <= 3600:
        console.print("[red]error:[/red] --exporter-refresh must be between 0 and 3600 seconds")
        raise typer.Exit(2)
    try:
        loaded = load_scenario(scenario)
        if exporter_refresh is not None:
            loaded = loaded.with_exporter_refresh(exporter_refresh)
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    async def serve() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)  # SIGTERM and SIGINT, even one its parent ran with ignored
        simulation = Simulation(loaded, seed=seed)
        server = SimServer(simulation, base_port=port, speed=speed)
        targets = await server.start()
        simulation.write_ground_truth(truth)
        if targets_file is not None:
            targets_file.write_text(json.dumps([t.as_dict() for t in targets], indent=2))
        console.print(
            f"scenario [bold]{loaded.name}[/bold]: {simulation.fleet.size} GPUs on "
            f"{len(simulation.fleet.nodes)} nodes, {len(targets)} targets, "
            f"ports {server.ports[0]}-{server.ports[-1]}, speed {speed}x; "
            f"ground truth in {truth}"
        )
        for target in targets[:5]:
            console.print(f"  {target.kind:8s} {target.url}")
        if len(targets) > 5:
            console.print(f"  ... and {len(targets) - 5} more (GET /targets on any port)")
        running = asyncio.ensure_future(server.run())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                running.result()  # the scenario ended, or the server failed: say so
        finally:
            running.cancel()
            stopping.cancel()
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
