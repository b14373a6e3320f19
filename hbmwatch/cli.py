"""The ``hbmwatch`` command."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hbmwatch import log
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

console = Console(stderr=True)
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML settings file (default: ./hbmwatch.toml if any)."),
]


def _settings(config: Path | None) -> Settings:
    try:
        settings = load_settings(config)
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except ValueError as exc:  # pydantic's ValidationError names every bad field
        console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from None
    log.configure(settings.log_level, settings.log_format)
    return settings


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the database schema to the latest migration."""
    from hbmwatch.service import migrate as run_migrate

    settings = _settings(config)
    revision = run_migrate(settings)
    console.print(f"schema at revision {revision}")


@app.command()
def up(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8427).")] = None,
) -> None:
    """Migrate, then run the service: store maintenance and the HTTP API."""
    from hbmwatch import service

    settings = _settings(config)
    if host is not None:
        settings.api.host = host
    if port is not None:
        settings.api.port = port
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(service.run(settings))


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
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
