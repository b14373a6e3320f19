"""The ``hbmwatch`` command."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hbmwatch import log
from hbmwatch.cli import alerts as cli_alerts
from hbmwatch.cli import bench as cli_bench
from hbmwatch.cli import nab as cli_nab
from hbmwatch.cli import processes
from hbmwatch.cli.common import ConfigOption, console, fail
from hbmwatch.cli.common import settings_from as _settings
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
app.command("nab")(cli_nab.nab)
for command in processes.app.registered_commands:  # migrate, up, serve, detect, collect, sim
    app.registered_commands.append(command)


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


@app.command("eval")
def eval_(
    scenarios: Annotated[
        list[str] | None, typer.Argument(help="Bundled scenario names or TOML files.")
    ] = None,
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
    exporter_refresh: Annotated[
        float | None,
        typer.Option(
            min=0, max=3600, help="Seconds between exporter page refreshes (overrides scenarios)."
        ),
    ] = None,
    random: Annotated[
        int | None,
        typer.Option(
            "--random",
            min=1,
            help="Draw this many scenarios from --seed instead (detection "
            "limits by magnitude and duration).",
        ),
    ] = None,
    save_scenarios: Annotated[
        Path | None,
        typer.Option(
            help="With --random: write each draw here as TOML (rerun: hbmwatch eval FILE)."
        ),
    ] = None,
) -> None:
    """Run scenarios through collector, store, detectors, alerting and delivery; score the
    findings and the incidents and pages against ground truth."""
    from hbmwatch.evaluation import incident_report, scoring
    from hbmwatch.evaluation import run as evaluation

    log.configure("warning")
    _check_eval_args(scenarios, random, seed, save_scenarios)
    seeds: list[int | None] = list(seed) if seed and random is None else [None]
    total = random or len(scenarios or []) * len(seeds)
    console.print(f"[bold]hbmwatch eval[/bold]: {total} run(s), {jobs} at a time")

    def done(r: evaluation.RunResult) -> None:
        console.print(
            f"  {r.scenario} seed {r.seed}: {r.simulated_seconds:.0f} simulated s in "
            f"{r.wall_seconds:.0f} s, {len(r.findings)} findings, {r.samples:,} samples"
        )

    if start_hour is not None and random_start:
        console.print("[red]error:[/red] --start-hour and --random-start: choose one")
        raise typer.Exit(2)
    options = dict(start_hour=start_hour, random_start=random_start, http_scrape=http_scrape,
                   exporter_refresh=exporter_refresh)  # fmt: skip
    if random is not None and seed:
        from hbmwatch.cli.eval_random import run_random

        try:
            passed = run_random(random, seed[0], jobs=jobs, duration=duration,
                                json_out=json_out, save_dir=save_scenarios, done=done,
                                **options)  # fmt: skip
        except (HbmwatchError, ValueError, OSError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from exc
        raise typer.Exit(0 if passed else 1)
    try:
        results = evaluation.evaluate(scenarios or [], seeds, jobs=jobs, duration_s=duration,
                                      done=done, start_hour=start_hour,
                                      random_start=random_start,
                                      http_scrape=http_scrape,
                                      exporter_refresh=exporter_refresh)  # fmt: skip
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


def _check_eval_args(scenarios: list[str] | None, random: int | None, seed: list[int] | None,
                     save_scenarios: Path | None) -> None:  # fmt: skip
    """Scenario names or ``--random``, not both nor neither; ``--random`` takes one seed."""
    problem = None
    if scenarios and random is not None:
        problem = "give scenario names or --random N, not both"
    elif not scenarios and random is None:
        problem = "give scenario names (or TOML files), or --random N --seed S"
    elif random is not None and len(seed or []) != 1:
        problem = "--random N needs exactly one --seed S (the draws come from it)"
    elif save_scenarios is not None and random is None:
        problem = "--save-scenarios goes with --random"
    if problem:
        console.print(f"[red]error:[/red] {problem}")
        raise typer.Exit(2)


@app.command("score-file")
def score_file(
    files: Annotated[
        list[Path],
        typer.Argument(help="CSV traces: wide or long layout, or plain timestamp,value."),
    ],
    out: Annotated[Path, typer.Option(help="Folder for <name>.scores.csv and .findings.json.")] = (
        Path("hbmwatch-scores")
    ),
    label: Annotated[
        list[str] | None,
        typer.Option(help="Label for bare column names, e.g. --label sku=H200 (repeatable)."),
    ] = None,
    series_name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Name of the one value column that is no canonical metric (a user series; "
            "default: its header, or the file's name for a column called value).",
        ),
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

    A column that is no canonical metric (a plain timestamp,value CSV) is a user series,
    scored sample by sample by the generic detector: one score column per series in
    [0, 1] at every input timestamp.

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
        if series_name is not None and not series_name.strip():
            raise HbmwatchError("--name: give a non-empty name")
        traces = [offline.read_trace(path, labels, series_name) for path in files]
        if merge:
            traces = [offline.merge_traces(traces)]
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    for trace in traces:
        path = trace.path
        console.print(f"{path}: {trace.count:,} samples, dropped {trace.dropped or 'none'}")
        for note in trace.notes:
            console.print(f"  note: {note}")
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


@docs_app.command("gpu-errors")
def docs_gpu_errors(
    output: Annotated[Path, typer.Option(help="Where to write it.")] = Path("docs/gpu-errors.md"),
) -> None:
    """Write docs/gpu-errors.md from the GPU error code table."""
    from hbmwatch.gpu_errors import render_markdown

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
