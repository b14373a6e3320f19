"""The ``hbmwatch`` command."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hbmwatch import cli_alerts, log, preflight
from hbmwatch.settings import Settings, load_settings
from hbmwatch.validation import HbmwatchError

app = typer.Typer(
    name="hbmwatch",
    help="HBM thermal and p99-latency telemetry, anomaly detection and alerting for GPU fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks: figures for docs/benchmarks.md.", no_args_is_help=True)
docs_app = typer.Typer(help="Generate documentation from the code.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
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
    from hbmwatch.service import migrate as run_migrate

    revision = run_migrate(settings)
    console.print(f"schema at revision {revision}")


@app.command()
def up(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default 8427).")] = None,
) -> None:
    """Migrate, then run the service: store maintenance and the HTTP API."""
    settings = _settings(config)
    if host is not None:
        settings.api.host = host
    if port is not None:
        settings.api.port = port
    try:  # before anything starts: a taken port or a missing database fails in one line
        preflight.before_up(settings)
    except HbmwatchError as exc:
        raise fail(exc) from None
    from hbmwatch import service

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(service.run(settings))


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
) -> None:
    """Run the collector alone: scrape the configured targets into the store."""
    settings = _settings(config)
    if targets is not None:
        settings.collector.target_file = str(targets)
    if not settings.collector.configured:
        console.print(
            "[red]error:[/red] no targets configured: set collector.targets, "
            "collector.target_file or collector.local_sources (or pass --targets FILE); "
            "`hbmwatch up` runs the simulated fleet instead"
        )
        raise typer.Exit(2)
    _check_store(settings)
    from hbmwatch import service

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
    from simulator.runner import Simulation
    from simulator.scenario import load_scenario
    from simulator.server import SimServer

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
) -> None:
    """Run scenarios through collector, store and detectors; score against ground truth."""
    from hbmwatch import evaluation, scoring

    log.configure("warning")
    seeds: list[int | None] = list(seed) if seed else [None]
    total = len(scenarios) * len(seeds)
    console.print(f"[bold]hbmwatch eval[/bold]: {total} run(s), {jobs} at a time")

    def done(r: evaluation.RunResult) -> None:
        console.print(
            f"  {r.scenario} seed {r.seed}: {r.simulated_seconds:.0f} simulated s in "
            f"{r.wall_seconds:.0f} s, {len(r.findings)} findings, {r.samples:,} samples"
        )

    try:
        results = evaluation.evaluate(scenarios, seeds, jobs=jobs, duration_s=duration, done=done)
    except (HbmwatchError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    report = scoring.score(results)
    Console(width=140).print(report.table())
    if json_out is not None:
        data = report.to_json() | {"runs": [evaluation.run_summary(r) for r in results]}
        json_out.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"report written to {json_out}")
    raise typer.Exit(0 if report.passed else 1)


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
) -> None:
    """Stream recorded traces through the detectors causally; write scores and findings."""
    from hbmwatch import offline

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
        result = offline.score_trace(trace, step_seconds=step)
        scores_path, findings_path = offline.write_outputs(result, out)
        for f in result.findings:
            cause = f" (cause: {f.top_cause})" if f.top_cause else ""
            console.print(f"  {f.kind} {dict(f.entity)}: {f.summary}{cause}")
        console.print(f"  {len(result.findings)} findings; wrote {scores_path} and {findings_path}")


@bench_app.command("store")
def bench_store(
    gpus: Annotated[int, typer.Option(help="GPUs written for the ingest figure.")] = 1024,
    seconds: Annotated[int, typer.Option(help="Seconds of telemetry to ingest.")] = 30,
    batch: Annotated[int, typer.Option(help="Samples per write.")] = 8000,
    size_gpus: Annotated[int, typer.Option(help="GPUs for the bytes-at-rest figure.")] = 64,
    size_minutes: Annotated[int, typer.Option(help="Minutes for bytes at rest.")] = 10,
    pg_url: Annotated[
        str | None,
        typer.Option(
            envvar="HBMWATCH_BENCH_PG_URL",
            help="PostgreSQL URL; the benchmark works in its own schema there.",
        ),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Ingest rate against the bare driver, bytes per sample at rest, a day-range query."""
    from hbmwatch import benchmarks

    log.configure("warning")
    console.print(f"[bold]hbmwatch bench store[/bold] on {benchmarks.machine()}")
    report = benchmarks.bench_store(
        gpus=gpus,
        seconds=seconds,
        batch=batch,
        size_gpus=size_gpus,
        size_minutes=size_minutes,
        pg_url=pg_url,
    )
    _print_store_report(report)
    benchmarks.write_json(report, json_out)


def _print_store_report(report: dict) -> None:  # type: ignore[type-arg]
    backends = [b for b in ("sqlite", "postgresql") if f"ingest_{b}" in report]
    table = Table(title=f"hbmwatch bench store ({report['gpus']} GPUs x {report['seconds']} s)")
    table.add_column("measure")
    for backend in backends:
        table.add_column(backend, justify="right")
    measures = [
        (
            "ingest: store.write (SeriesKey samples), samples/s",
            "ingest",
            "store_samples_per_second",
            "{:,.0f}",
        ),
        (
            "ingest: store.write_rows (resolved ids), samples/s",
            "ingest",
            "store_ids_samples_per_second",
            "{:,.0f}",
        ),
        (
            "ingest: bare driver ceiling, samples/s",
            "ingest",
            "ceiling_samples_per_second",
            "{:,.0f}",
        ),
        ("ratio write / ceiling", "ingest", "ratio", "{:.2f}"),
        ("ratio write_rows / ceiling", "ingest", "ratio_ids", "{:.2f}"),
        ("series registration, s", "ingest", "register_seconds", "{:.1f}"),
        ("bytes per sample at rest, all tables", "size", "bytes_per_sample", "{:.2f}"),
        ("bytes per sample at rest, samples only", "size", "sample_bytes_per_sample", "{:.2f}"),
        ("compaction, samples/s", "size", "compaction_samples_per_second", "{:,.0f}"),
        ("1 series x 1 day at 1 s, 60 s step, median ms", "query", "median_ms", "{:.1f}"),
        ("same, p95 ms", "query", "p95_ms", "{:.1f}"),
        ("same at a 90 s step (raw samples), median ms", "query", "raw_step90_median_ms", "{:.1f}"),
    ]
    for title, section, key, fmt in measures:
        table.add_row(title, *(fmt.format(report[f"{section}_{b}"][key]) for b in backends))
    Console(width=120).print(table)


def _check_fleet_size(gpus: int) -> None:
    if gpus < 64 or gpus % 64:
        console.print("[red]error:[/red] --gpus must be a positive multiple of 64")
        raise typer.Exit(2)


@bench_app.command("sim")
def bench_sim(
    gpus: Annotated[int, typer.Option(help="Fleet size (a multiple of 64).")] = 1024,
    steps: Annotated[int, typer.Option(help="1 s steps to time.")] = 300,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """How much faster than real time the simulator runs a fleet at 1 s steps."""
    from hbmwatch import benchmarks

    _check_fleet_size(gpus)
    log.configure("warning")
    report = benchmarks.bench_sim(gpus=gpus, steps=steps)
    table = Table(title=f"hbmwatch bench sim ({report['gpus']} GPUs, {steps} x 1 s steps)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("inference services", f"{report['services']}")
    table.add_row("build and thermal warm-up, s", f"{report['build_and_warm_up_seconds']:.2f}")
    table.add_row("one 1 s step, ms", f"{report['step_milliseconds']:.1f}")
    table.add_row(
        "faster than real time (physics and workloads)", f"{report['faster_than_real_time']:.0f}x"
    )
    table.add_row("render every page once, s", f"{report['render_all_pages_seconds']:.2f}")
    table.add_row("lines on those pages", f"{report['page_lines']:,}")
    table.add_row(
        "faster than real time, every page scraped each second",
        f"{report['faster_than_real_time_with_1s_scrapes']:.1f}x",
    )
    Console(width=120).print(table)
    benchmarks.write_json(report, json_out)


@bench_app.command("collect")
def bench_collect(
    gpus: Annotated[int, typer.Option(help="Fleet scraped into SQLite (multiple of 64).")] = 1024,
    page_gpus: Annotated[int, typer.Option(help="GPUs on the page the parsers read.")] = 64,
    rounds: Annotated[int, typer.Option(help="Scrape rounds to time.")] = 10,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Parser lines/s beside prometheus_client's, and scrape-to-store samples/s."""
    from hbmwatch import benchmarks

    if gpus < 64 or gpus % 64 or page_gpus % 8:
        console.print("[red]error:[/red] --gpus must be a multiple of 64, --page-gpus of 8")
        raise typer.Exit(2)
    log.configure("warning")
    report = benchmarks.bench_collect(gpus=gpus, page_gpus=page_gpus, rounds=rounds)
    table = Table(title=f"hbmwatch bench collect ({page_gpus}-GPU pages; {gpus}-GPU fleet)")
    table.add_column("measure")
    table.add_column("DME page", justify="right")
    table.add_column("DCGM page", justify="right")
    dme, dcgm = report["parse_dme"], report["parse_dcgm"]
    for title, key, fmt in (
        ("sample lines on the page", "lines", "{:,}"),
        ("hbmwatch page -> canonical samples, lines/s", "translate_lines_per_second", "{:,.0f}"),
        ("hbmwatch generic parser (cached series), lines/s", "parse_lines_per_second", "{:,.0f}"),
        ("hbmwatch first scrape (cold cache), lines/s", "first_scrape_lines_per_second", "{:,.0f}"),
        ("prometheus_client parser, lines/s", "prometheus_client_lines_per_second", "{:,.0f}"),
        ("page -> canonical, speed-up over prometheus_client", "speedup_translate", "{:.1f}x"),
        ("generic parser, speed-up over prometheus_client", "speedup_parse", "{:.1f}x"),
    ):
        table.add_row(title, fmt.format(dme[key]), fmt.format(dcgm[key]))
    Console(width=120).print(table)
    e2e = report["scrape_to_store"]
    console.print(
        f"scrape-to-store: {e2e['samples']:,} samples from {e2e['targets']} targets in "
        f"{e2e['seconds']:.1f} s = [bold]{e2e['samples_per_second']:,.0f} samples/s[/bold] "
        f"into SQLite ({e2e['round_seconds']:.2f} s a round of {gpus} GPUs)"
    )
    benchmarks.write_json(report, json_out)


@bench_app.command("detect")
def bench_detect(
    gpus: Annotated[int, typer.Option(help="Fleet size (a multiple of 64).")] = 1024,
    minutes: Annotated[int, typer.Option(min=2, help="Simulated minutes (a cycle each).")] = 4,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Seconds a detection cycle takes over a fleet's newest minute (target: under 1 s)."""
    from hbmwatch import benchmarks

    _check_fleet_size(gpus)
    log.configure("warning")
    console.print(
        f"[bold]hbmwatch bench detect[/bold] on {benchmarks.machine()}: {gpus} GPUs for "
        f"{minutes} simulated minutes (scraping them takes a few minutes)"
    )
    report = benchmarks.bench_detect(gpus=gpus, minutes=minutes)
    table = Table(title=f"hbmwatch bench detect ({gpus} GPUs, one cycle per simulated minute)")
    for col in ("cycle", "seconds", "samples", "GPUs", "workloads", "opened", "slowest detector"):
        table.add_column(col, justify="right")
    for i, c in enumerate(report["cycles"], 1):
        name, secs = max(c["detectors"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        table.add_row(str(i), f"{c['seconds']:.3f}", f"{c['samples']:,}", str(c["gpus"]),
                      str(c["workloads"]), str(c["opened"]), f"{name} {secs:.3f}")  # fmt: skip
    Console(width=120).print(table)
    console.print(
        f"warm cycles: median [bold]{report['warm_cycle_median_seconds']:.3f} s[/bold], "
        f"max {report['warm_cycle_max_seconds']:.3f} s (first, cold: "
        f"{report['first_cycle_seconds']:.3f} s)"
    )
    benchmarks.write_json(report, json_out)


@bench_app.command("api")
def bench_api(
    gpus: Annotated[int, typer.Option(help="Fleet size (a multiple of 8).")] = 1024,
    hours: Annotated[int, typer.Option(min=1, help="Hours of data loaded.")] = 24,
    db: Annotated[
        Path, typer.Option(help="SQLite file; reused while its .json sidecar matches.")
    ] = Path("hbmwatch-bench-api.db"),
    requests: Annotated[int, typer.Option(min=1, help="Timed requests of each kind.")] = 1000,
    rebuild: Annotated[bool, typer.Option(help="Load the day again even if it matches.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """p99 of a one-GPU-day range query and an incident detail over HTTP (target: 100 ms)."""
    from rich.progress import MofNCompleteColumn, Progress, TimeRemainingColumn

    from hbmwatch import bench_api as api_bench
    from hbmwatch import benchmarks
    from hbmwatch.service import tune_gc

    if gpus < 8 or gpus % 8:
        console.print("[red]error:[/red] --gpus must be a positive multiple of 8")
        raise typer.Exit(2)
    log.configure("warning")
    tune_gc()
    console.print(
        f"[bold]hbmwatch bench api[/bold] on {benchmarks.machine()}: {gpus} GPUs x {hours} h "
        f"in {db} (the first load takes a while; later runs reuse it)"
    )
    columns = (*Progress.get_default_columns()[:2], MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        report = api_bench.bench_api(gpus=gpus, hours=hours, db=db, requests=requests,
                                     rebuild=rebuild, progress=progress)  # fmt: skip
    _print_api_report(report)
    benchmarks.write_json(report, json_out)
    if report["http"] is None:
        console.print(f"[red]error:[/red] {report['http_error']}: the API routes are missing")
        raise typer.Exit(1)


def _print_api_report(report: dict[str, Any]) -> None:
    load, http, local = report["load"], report["http"] or {}, report["in_process"]
    table = Table(title=f"hbmwatch bench api ({report['gpus']} GPUs x {report['hours']} h, "
                        f"{report['requests']} requests each)")  # fmt: skip
    for col in ("read", "p50 ms", "p95 ms", "p99 ms", "max ms", "bytes"):
        table.add_column(col, justify="left" if col == "read" else "right")
    day = f"one GPU x {report['hours']} h at 60 s"
    rows = [(f"{day}, first read, HTTP", http.get("first_read")),
            ("  same, store.range_query in-process", local["first_read"]),
            (f"{day}, repeated, HTTP", http.get("query_range")),
            ("  same, store.range_query in-process", local["query_range"]),
            ("incident detail, HTTP", http.get("incident")),
            ("  same, store reads in-process", local["incident"])]  # fmt: skip
    for name, s in rows:
        if s:
            cells = [f"{s[k]:.1f}" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
            table.add_row(name, *cells, f"{s['bytes']:,.0f}" if "bytes" in s else "-")
    Console(width=120).print(table)
    loaded = "reused" if report["reused"] else "loaded"
    console.print(
        f"{loaded}: {load['series']:,} series, {load['samples']:,} samples at "
        f"{report['interval_s']} s in {load['load_seconds']:.0f} s; "
        f"{report['db_bytes'] / 2**30:.2f} GiB; incident of {report['incident']['alerts']} alerts"
    )
    if report["met"] is not None:
        verdict = "[green]met[/green]" if report["met"] else "[red]not met[/red]"
        console.print(f"target: p99 under {report['target_ms']} ms for both reads: {verdict}")


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
