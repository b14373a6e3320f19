"""``hbmwatch bench``: the commands behind the figures in docs/benchmarks.md."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hbmwatch import log
from hbmwatch.cli.bench_codec import bench_codec
from hbmwatch.cli.bench_versus import bench_versus

bench_app = typer.Typer(help="Benchmarks: figures for docs/benchmarks.md.", no_args_is_help=True)
bench_app.command("versus")(bench_versus)
bench_app.command("codec")(bench_codec)
console = Console(stderr=True)


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
    from hbmwatch.bench import benchmarks

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
    from hbmwatch.bench import benchmarks

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
    pods: Annotated[
        bool, typer.Option(help="Pod labels on every device line, as on Kubernetes.")
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Parser lines/s beside prometheus_client's, and scrape-to-store samples/s."""
    from hbmwatch.bench import benchmarks

    if gpus < 64 or gpus % 64 or page_gpus % 8:
        console.print("[red]error:[/red] --gpus must be a multiple of 64, --page-gpus of 8")
        raise typer.Exit(2)
    log.configure("warning")
    report = benchmarks.bench_collect(gpus=gpus, page_gpus=page_gpus, rounds=rounds, pods=pods)
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
    from hbmwatch.bench import benchmarks

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

    from hbmwatch.bench import api as api_bench
    from hbmwatch.bench import benchmarks
    from hbmwatch.runtime.service import tune_gc

    if gpus < 8 or gpus % 8:
        console.print("[red]error:[/red] --gpus must be a positive multiple of 8")
        raise typer.Exit(2)
    log.configure("warning")
    tune_gc()
    console.print(
        f"[bold]hbmwatch bench api[/bold] on {benchmarks.machine()}: {gpus} GPUs x {hours} h "
        f"in {db} (the first load takes a while; later runs reuse it)"
    )
    with staged_progress() as progress:
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


@bench_app.command("promql")
def bench_promql(
    gpus: Annotated[int, typer.Option(help="Fleet size (a multiple of 8).")] = 1024,
    hours: Annotated[int, typer.Option(min=1, help="Hours of data (a day: 24).")] = 24,
    interval: Annotated[
        int, typer.Option(help="Scrape interval of the generated day, s (divides an hour).")
    ] = 300,
    step: Annotated[int, typer.Option(min=1, help="Range-query step, s (Grafana-like).")] = 300,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs of each query per server.")] = 20,
    query_seconds: Annotated[
        float, typer.Option(help="A query stops after 3 runs once it has taken this long.")
    ] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated values.")] = 1,
    folder: Annotated[
        Path, typer.Option("--dir", help="Where the day lives; reused while day.json matches.")
    ] = Path("hbmwatch-bench-promql"),
    dashboards: Annotated[
        Path | None, typer.Option(help="Grafana dashboards whose queries run (default: ours).")
    ] = None,
    resolution: Annotated[
        str, typer.Option(help="hbmwatch's tier: auto (as Grafana gets it), raw, 1m or 1h.")
    ] = "auto",
    rebuild: Annotated[bool, typer.Option(help="Generate the day again, even if it matches.")] = (
        False
    ),
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """p50/p99 of each dashboard query over a fleet day, hbmwatch beside a real Prometheus."""

    from hbmwatch.bench import benchmarks
    from hbmwatch.bench.promql import DASHBOARDS
    from hbmwatch.bench.promql import bench_promql as run_bench
    from hbmwatch.bench.promql_day import DaySpec
    from hbmwatch.runtime.service import tune_gc
    from hbmwatch.validation import HbmwatchError

    log.configure("warning")
    tune_gc()
    spec = DaySpec(gpus=gpus, hours=hours, interval_s=interval, seed=seed)
    console.print(
        f"[bold]hbmwatch bench promql[/bold] on {benchmarks.machine()}: {gpus} GPUs x {hours} h "
        f"at a {interval} s scrape interval in {folder}, queried at step {step} s, {runs} runs "
        "(the first run generates the day; later runs reuse it)"
    )
    try:
        with staged_progress() as progress:
            report = run_bench(folder=folder, spec=spec, step=step, runs=runs, rebuild=rebuild,
                               budget_s=query_seconds, dashboards=dashboards or DASHBOARDS,
                               resolution=resolution, progress=progress)  # fmt: skip
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    _print_promql_report(report)
    benchmarks.write_json(report, json_out)


def _print_promql_report(report: dict[str, Any]) -> None:
    p = report["params"]
    table = Table(
        title=f"hbmwatch bench promql ({p['gpus']} GPUs x {p['hours']} h at {p['interval_s']} s, "
        f"range queries at step {report['step_s']} s, {report['runs']} runs each)"
    )
    for col in ("query", "runs", "hbmwatch p50 ms", "p99 ms", "CPU s", "Prometheus p50 ms",
                "p99 ms", "CPU s", "ratio p50", "series"):  # fmt: skip
        table.add_column(col, justify="left" if col == "query" else "right")
    for row in report["queries"]:
        cells = []
        for name in ("hbmwatch", "prometheus"):
            s = row[name]
            cells += [f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['cpu_s_per_run']:.3f}"]
        h, pr = row["hbmwatch"], row["prometheus"]
        ratio = f"{row['ratio_p50']:.1f}x" if "ratio_p50" in row else "-"
        if "error" in h or "error" in pr:
            series = "error: " + (h.get("error") or pr.get("error") or "")[:40]
        else:
            same = "" if row.get("same_series") else " (differ)"
            points = "" if row.get("same_points") else ", points differ"
            points += "" if row.get("same_values") else ", values differ"
            series = f"{h['series']}/{pr['series']}{same}{points}"
        table.add_row(row["query"][:48], str(row["runs"]), *cells, ratio, series)
    Console(width=160).print(table)
    load = report["load"]
    verb = "reused" if report["reused"] else "generated"
    console.print(
        f"{verb}: {load['series']:,} series, {load['samples']:,} samples; SQLite "
        f"{load['sqlite_bytes'] / 2**20:,.0f} MiB, Prometheus TSDB "
        f"{load['tsdb_bytes'] / 2**20:,.0f} MiB. hbmwatch: {report['hbmwatch_server']}; "
        f"Prometheus: {report['prometheus_server']}."
    )
    for item in report["skipped"]:
        console.print(f"skipped {item['query']}: {item['why']}")


@contextlib.contextmanager
def staged_progress() -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar per stage of a long benchmark; yields the ``progress`` callback."""
    from rich.progress import MofNCompleteColumn, Progress, TimeRemainingColumn

    columns = (*Progress.get_default_columns()[:2], MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        yield progress


@bench_app.command("scale")
def bench_scale(
    gpus: Annotated[int, typer.Option(help="Simulated fleet (a multiple of 8).")] = 256,
    seconds: Annotated[float, typer.Option(min=1, help="Measured span of each phase, s.")] = 60,
    interval: Annotated[float, typer.Option(help="Scrape interval, s (all phases).")] = 1.0,
    warmup: Annotated[
        float, typer.Option(min=0, help="Seconds each phase runs before its span is measured.")
    ] = 10.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Samples/s and CPU-s per 1M samples: 1 and 2 collectors into VictoriaMetrics, and
    Prometheus scraping the same fleet (the baseline), one phase after another."""
    from hbmwatch.bench import benchmarks
    from hbmwatch.bench.scale import ScaleSpec
    from hbmwatch.bench.scale import bench_scale as run_bench

    if gpus < 8 or gpus % 8 or not 0 < interval <= 60:
        console.print(
            "[red]error:[/red] --gpus must be a positive multiple of 8, --interval in (0, 60] s"
        )
        raise typer.Exit(2)
    log.configure("warning")
    spec = ScaleSpec(gpus=gpus, seconds=seconds, interval_s=interval, warmup_s=warmup)
    console.print(
        f"[bold]hbmwatch bench scale[/bold] on {benchmarks.machine()}: {gpus} GPUs at "
        f"{interval:g} s; three phases of {warmup:g} s warm-up + {seconds:g} s measured"
    )
    with staged_progress() as progress:
        report = run_bench(spec, progress=progress)
    _print_scale_report(report)
    benchmarks.write_json(report, json_out)
    if any(not p.get("all_counted", True) for p in report["phases"]):
        raise typer.Exit(1)


def _print_scale_report(report: dict[str, Any]) -> None:
    table = Table(
        title=f"hbmwatch bench scale ({report['gpus']} GPUs, {report['targets']} targets at "
        f"{report['interval_s']:g} s, {report['seconds']:g} s measured a phase)"
    )
    for col in ("phase", "samples", "samples/s", "rounds kept", "CPU s collectors",
                "CPU s engine", "CPU s / 1M: collectors", "engine", "total", "vs Prometheus",
                "fleet CPU s"):  # fmt: skip
        table.add_column(col, justify="left" if col == "phase" else "right")
    for p in report["phases"]:
        cpu, per = p["cpu_s"], p["cpu_per_million"]
        ratio = p.get("ratio_to_prometheus")
        table.add_row(
            f"{p['name']}  {p['title']}", f"{p['samples']:,.0f}",
            f"{p['samples_per_second']:,.0f}", f"{p['rounds_kept']:.1%}",
            f"{cpu['collector']:.1f}" if "collector" in cpu else "-", f"{cpu['engine']:.1f}",
            f"{per['collector']:.1f}" if per["collector"] is not None else "-",
            f"{per['engine']:.1f}", f"{per['total']:.1f}",
            f"{ratio:.2f}x" if ratio is not None else "-", f"{cpu['fleet']:.1f}",
        )  # fmt: skip
    Console(width=180).print(table)
    for p in report["phases"]:
        _print_checks(p, report["targets"])
    for item in report["skipped"]:
        console.print(f"skipped {item['phase']} ({item['title']}): {item['why']}")


def _print_checks(p: dict[str, Any], targets: int) -> None:
    """The honesty lines under the table: written against counted, the shards' partition."""
    if "page_samples" in p:
        console.print(
            f"{p['name']}: prometheus_tsdb_head_samples_appended_total rose "
            f"{p['samples']:,.0f} in the span, {p['page_samples']:,.0f} of them from the "
            "pages (the rest: up and scrape_* series)"
        )
    if "written" not in p:
        return
    verdict = (
        "[green]all counted[/green]"
        if p["all_counted"]
        else "[bold red]MISMATCH: samples written but not counted[/bold red]"
    )
    console.print(
        f"{p['name']}: the collectors wrote {p['written']:,} samples in all, VictoriaMetrics "
        f"counts {p['stored']:,}: {verdict}"
    )
    if p["spooled"]:
        console.print(
            f"{p['name']}: {p['spooled']:,} samples went through the disk spool (the writer "
            f"behind: the first round's series, or a busy host), {p['left_in_spool']:,} still "
            "there at the stop"
        )
    if not p["shards_partition"]:
        console.print(
            f"[bold red]{p['name']}: the collectors scraped {p['targets_scraped']} targets of "
            f"{targets}: the shards do not partition the fleet (collector.shard ignored?)"
            "[/bold red]"
        )
