"""The ``hbmwatch`` command."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hbmwatch import log
from hbmwatch.cli import alerts as cli_alerts
from hbmwatch.cli import bench as cli_bench
from hbmwatch.runtime import preflight
from hbmwatch.settings import DetectionSettings, Settings, load_settings
from hbmwatch.sharding import Shard
from hbmwatch.validation import HbmwatchError

app = typer.Typer(
    name="hbmwatch",
    help="HBM thermal and p99-latency telemetry, anomaly detection and alerting for GPU fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
docs_app = typer.Typer(help="Generate documentation from the code.", no_args_is_help=True)
app.add_typer(cli_bench.bench_app, name="bench")
app.add_typer(docs_app, name="docs")
app.add_typer(cli_alerts.silence_app, name="silence")

console = Console(stderr=True)
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML settings file (default: ./hbmwatch.toml if any)."),
]


def fail(message: object, code: int = 2) -> typer.Exit:
    """One ``error:`` line on stderr (never wrapped, brackets kept): ``raise fail(...)``."""
    console.print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("hbmwatch")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        print(f"hbmwatch {version}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """HBM thermal and p99-latency telemetry, anomaly detection and alerting for GPU fleets."""


def _settings(config: Path | None) -> Settings:
    try:
        settings = load_settings(config)
    except HbmwatchError as exc:  # one line naming the file or variable and the key
        raise fail(exc) from None
    log.configure(settings.log_level, settings.log_format)
    log.register_secrets(settings)  # tokens, the store URL's password: scrubbed from every line
    return settings


def _bound(settings: Settings, host: str | None, port: int | None) -> Settings:
    """``--host`` and ``--port`` over the settings' API address."""
    if host is not None:
        settings.api.host = host
    if port is not None:
        settings.api.port = port
    return settings


def _check_store(settings: Settings) -> None:
    try:
        preflight.check_store(settings.store)
    except HbmwatchError as exc:
        raise fail(exc) from None


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the database schema to the latest migration."""
    settings = _settings(config)
    _check_store(settings)  # before the service's heavy imports: a bad URL fails at once
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
    settings = _bound(_settings(config), host, port)
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
    settings = _bound(_settings(config), host, port)
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
        console.print(f"[red]error:[/red] {_first_error(exc)}")
        raise typer.Exit(2) from None
    _check_store(settings)
    from hbmwatch.runtime import service

    try:
        asyncio.run(service.detect_only(settings, metrics_port))
    except KeyboardInterrupt:
        return
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _first_error(exc: ValueError) -> str:
    """A pydantic error in one line: the field and what is wrong with it."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"{'.'.join(str(p) for p in first['loc'])}: {msg}"
    return str(exc)


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
    _check_store(settings)
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
) -> None:
    """Serve a simulated fleet's exporter, vLLM and training endpoints on 127.0.0.1."""
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import load_scenario
    from hbmwatch.simulator.server import SimServer

    log.configure("info")
    if speed <= 0:
        console.print("[red]error:[/red] --speed must be positive")
        raise typer.Exit(2)
    try:
        loaded = load_scenario(scenario)
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    async def serve() -> None:
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
        try:
            await server.run()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


@app.command("eval")
def eval_(
    scenarios: Annotated[list[str], typer.Argument(help="Bundled scenario names or TOML files.")],
    seed: Annotated[
        list[int] | None,
        typer.Option(help="Seed to run (repeat for several); default: each scenario's own."),
    ] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Runs at a time (worker processes).")] = 1,
    duration: Annotated[
        float | None, typer.Option(help="Simulated seconds per run (default: the scenario's).")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    start_hour: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=23.99,
            help="Start each run at this hour of the simulated "
            "day (14.83 = 14:50, the daily peak); default 09:00.",
        ),
    ] = None,
    random_start: Annotated[
        bool, typer.Option(help="Start each run at a random hour drawn from its scenario and seed.")
    ] = False,
    http_scrape: Annotated[
        bool,
        typer.Option(help="Scrape the simulated fleet over loopback HTTP (default: in-process)."),
    ] = False,
) -> None:
    """Run scenarios through collector, store, detectors, alerting and delivery; score the
    findings and the incidents and pages against ground truth."""
    from hbmwatch.evaluation import incident_report, scoring
    from hbmwatch.evaluation import run as evaluation

    log.configure("warning")
    seeds: list[int | None] = list(seed) if seed else [None]
    total = len(scenarios) * len(seeds)
    console.print(f"[bold]hbmwatch eval[/bold]: {total} run(s), {jobs} at a time")

    def done(r: evaluation.RunResult) -> None:
        console.print(
            f"  {r.scenario} seed {r.seed}: {r.simulated_seconds:.0f} simulated s in "
            f"{r.wall_seconds:.0f} s, {len(r.findings)} findings, {r.samples:,} samples"
        )

    if start_hour is not None and random_start:
        console.print("[red]error:[/red] --start-hour and --random-start: choose one")
        raise typer.Exit(2)
    try:
        results = evaluation.evaluate(scenarios, seeds, jobs=jobs, duration_s=duration,
                                      done=done, start_hour=start_hour,
                                      random_start=random_start,
                                      http_scrape=http_scrape)  # fmt: skip
    except (HbmwatchError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    report = scoring.score(results)
    paged = incident_report.score_incidents(results)
    Console(width=160).print(report.table())
    Console(width=160).print(paged.table())
    if json_out is not None:
        data = report.to_json() | {
            "incidents": paged.to_json(),
            "runs": [evaluation.run_summary(r) for r in results],
        }
        json_out.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"report written to {json_out}")
    raise typer.Exit(0 if report.passed and paged.passed else 1)


@app.command("score-file")
def score_file(
    files: Annotated[list[Path], typer.Argument(help="CSV traces: wide or long layout.")],
    out: Annotated[Path, typer.Option(help="Folder for <name>.scores.csv and .findings.json.")] = (
        Path("hbmwatch-scores")
    ),
    label: Annotated[
        list[str] | None,
        typer.Option(help="Label for bare column names, e.g. --label sku=H200 (repeatable)."),
    ] = None,
    step: Annotated[float, typer.Option(min=0.05, help="The detectors' time grid, s.")] = 1.0,
    merge: Annotated[
        bool, typer.Option(help="Score the files as one trace (e.g. NVML beside latencies).")
    ] = False,
    warmup: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds the latency and thermal baselines learn before judging "
            "(default 180; a short capture wants less).",
        ),
    ] = None,
    hold: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds a p99 regression up to 2x must last to count "
            "(default 75; larger ones need less).",
        ),
    ] = None,
    min_hold: Annotated[
        float | None,
        typer.Option(
            min=0, help="Seconds a very large (10x) p99 regression must last (default 5)."
        ),
    ] = None,
) -> None:
    """Stream recorded traces through the detectors causally; write scores and findings.

    For a short capture, shorten --warmup (and --hold): by default a baseline learns 180 s
    and a regression up to 2x must last 75 s (3x: 20 s; 10x: 5 s).
    """
    from hbmwatch.runtime import offline

    log.configure("warning")
    labels = {}
    for item in label or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            console.print(f"[red]error:[/red] --label {item!r}: use NAME=VALUE")
            raise typer.Exit(2)
        labels[name.strip()] = value.strip()
    try:
        traces = [offline.read_trace(path, labels) for path in files]
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if merge:
        traces = [offline.merge_traces(traces)]
    for trace in traces:
        path = trace.path
        console.print(f"{path}: {len(trace.samples):,} samples, dropped {trace.dropped or 'none'}")
        options = offline.DetectorOptions(warmup, hold, min_hold)
        result = offline.score_trace(trace, step_seconds=step, options=options)
        scores_path, findings_path = offline.write_outputs(result, out)
        for f in result.findings:
            cause = f" (cause: {f.top_cause})" if f.top_cause else ""
            console.print(f"  {f.kind} {dict(f.entity)}: {f.summary}{cause}")
        console.print(f"  {len(result.findings)} findings; wrote {scores_path} and {findings_path}")


@app.command()
def incidents(
    config: ConfigOption = None,
    all_: cli_alerts.AllOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=5000)] = 200,
) -> None:
    """List incidents, newest first (open ones unless --all)."""
    cli_alerts.list_incidents(_settings(config), all_=all_, as_json=as_json, limit=limit)


@cli_alerts.silence_app.command("add")
def silence_add(
    matchers: Annotated[list[str], typer.Argument(help='Label matchers: host=n1 rack=~"r[0-3]"')],
    duration: Annotated[str, typer.Option("--for", help="How long: 90m, 2h, 3600.")] = "2h",
    by: Annotated[str, typer.Option("--by", help="Who silences.")] = "cli",
    comment: Annotated[str, typer.Option(help="Why.")] = "",
    config: ConfigOption = None,
) -> None:
    """Silence alerts matching every matcher; prints the silence id."""
    cli_alerts.add_silence(_settings(config), matchers, duration=duration, by=by, comment=comment)


@cli_alerts.silence_app.command("list")
def silence_list(config: ConfigOption = None, all_: cli_alerts.AllOption = False) -> None:
    """Active silences (every stored one with --all)."""
    cli_alerts.list_silences(_settings(config), all_=all_)


@cli_alerts.silence_app.command("expire")
def silence_expire(silence_id: str, config: ConfigOption = None) -> None:
    """End a silence now."""
    cli_alerts.expire_silence(_settings(config), silence_id)


@app.command()
def rules(
    out: Annotated[Path, typer.Option(help="Directory to write them to.")] = Path("."),
) -> None:
    """Write a Prometheus rules file over hbmwatch's /metrics, and its promtool tests."""
    cli_alerts.write_rules(out)


@docs_app.command("metrics")
def docs_metrics(
    output: Annotated[Path, typer.Option(help="Where to write it.")] = Path("docs/metrics.md"),
) -> None:
    """Write docs/metrics.md from the canonical metric model."""
    from hbmwatch.metrics import render_markdown

    output.write_text(render_markdown())
    console.print(f"wrote {output}")


@docs_app.command("skus")
def docs_skus(
    output: Annotated[Path, typer.Option(help="Where to write it.")] = Path("docs/skus.md"),
) -> None:
    """Write docs/skus.md from the SKU table."""
    from hbmwatch.skus import render_markdown

    output.write_text(render_markdown())
    console.print(f"wrote {output}")


def main() -> None:
    try:
        app()
    except HbmwatchError as exc:
        fail(exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
