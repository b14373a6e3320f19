"""``hbmwatch bench versus``: the collector beside Prometheus on the same pages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hbmwatch import log

console = Console(stderr=True)


def bench_versus(
    gpus: Annotated[int, typer.Option(help="Simulated fleet (a multiple of 8).")] = 256,
    seconds: Annotated[float, typer.Option(min=1, help="Measured span of each phase, s.")] = 60,
    interval: Annotated[float, typer.Option(help="Scrape interval, s (both phases).")] = 1.0,
    warmup: Annotated[
        float, typer.Option(min=0, help="Seconds each phase runs before its span is measured.")
    ] = 15.0,
    exporter_refresh: Annotated[
        float,
        typer.Option(
            min=0, max=3600, help="Node exporters' pages change only this often, s (0: each s)."
        ),
    ] = 0.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """CPU-s per 1M samples, 1 s rounds kept, scrape p50/p99, bytes per sample at rest and a
    range query: hbmwatch's collector into SQLite, then Prometheus on the same pages."""
    from hbmwatch.bench import benchmarks
    from hbmwatch.bench.versus import VersusSpec
    from hbmwatch.bench.versus import bench_versus as run_bench
    from hbmwatch.cli.bench import staged_progress

    if gpus < 8 or gpus % 8 or not 0 < interval <= 60:
        console.print(
            "[red]error:[/red] --gpus must be a positive multiple of 8, --interval in (0, 60] s"
        )
        raise typer.Exit(2)
    log.configure("warning")
    spec = VersusSpec(gpus=gpus, seconds=seconds, interval_s=interval, warmup_s=warmup,
                      exporter_refresh_s=exporter_refresh)  # fmt: skip
    console.print(
        f"[bold]hbmwatch bench versus[/bold] on {benchmarks.machine()}: {gpus} GPUs with an "
        f"inference page each at {interval:g} s; two phases of {warmup:g} s warm-up + "
        f"{seconds:g} s measured"
        + (f"; node exporters refresh every {exporter_refresh:g} s" if exporter_refresh else "")
    )
    with staged_progress() as progress:
        report = run_bench(spec, progress=progress)
    print_report(report)
    benchmarks.write_json(report, json_out)


def print_report(report: dict[str, Any]) -> None:
    table = Table(
        title=f"hbmwatch bench versus ({report['gpus']} GPUs, {report['targets']} targets at "
        f"{report['interval_s']:g} s, {report['seconds']:g} s measured a phase"
        + (
            f", exporters refresh every {refresh:g} s"
            if (refresh := report.get("exporter_refresh_s"))
            else ""
        )
        + ")"
    )
    columns = ("system", "samples stored", "cores", "CPU-s / 1M stored", "CPU-s / 1M page",
               "rounds kept", "scrape p50 ms", "p99 ms", "bytes/sample", "with a day",
               "range query ms")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "system" else "right")
    for phase in report["phases"].values():
        page = phase.get("cpu_per_million_page_samples")
        day = phase.get("bytes_per_sample_day")
        table.add_row(
            phase["title"], f"{phase['samples']:,.0f}", f"{phase['cores']:.2f}",
            f"{phase['cpu_per_million']:.1f}", f"{page:.1f}" if page is not None else "-",
            f"{phase['rounds_kept']:.1%}", f"{phase['scrape']['p50_ms']:.1f}",
            f"{phase['scrape']['p99_ms']:.1f}", f"{phase['bytes_per_sample']:.2f}",
            f"{day:.2f}" if day is not None else "-",
            f"{phase['range_query']['median_ms']:.1f}",
        )  # fmt: skip
    Console(width=200).print(table)
    ratios = report.get("ratios")
    if ratios:
        console.print(
            "hbmwatch / Prometheus: CPU per sample stored "
            f"{ratios['cpu_per_sample_stored']:.2f}x, per page sample "
            f"{ratios['cpu_per_page_sample']:.2f}x; bytes per sample "
            f"{ratios['bytes_per_sample']:.2f}x ({ratios['bytes_per_sample_day']:.2f}x with the "
            f"registry over a day); range query {ratios['range_query_median']:.2f}x"
        )
    ours = report["phases"]["hbmwatch"]
    block = ours.get("prometheus_block_same_data", {})
    if "bytes_per_sample" in block:
        console.print(
            f"the same {block['samples']:,} samples hbmwatch stored, as a Prometheus block "
            f"(promtool): {block['bytes_per_sample']:.2f} bytes/sample against hbmwatch's "
            f"{ours['bytes_per_sample']:.2f}"
        )
    elif "skipped" in block:
        console.print(f"no Prometheus block of the same samples: {block['skipped']}")
    if ours.get("spooled"):
        console.print(f"hbmwatch: {ours['spooled']:,} samples went through the disk spool")
    console.print(f"the simulated fleet used {report['fleet_cpu_s']:.1f} CPU-s (not counted)")
    for item in report["skipped"]:
        console.print(f"skipped {item['phase']}: {item['why']}")
