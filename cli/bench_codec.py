"""``hbmwatch bench codec``: bytes per sample at rest for each chunk format and length."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hbmwatch import log


def bench_codec(
    gpus: Annotated[int, typer.Option(help="GPUs of the store benchmark's telemetry.")] = 16,
    nodes: Annotated[int, typer.Option(help="Simulated H100 nodes (8 vLLM pages each).")] = 1,
    minutes: Annotated[int, typer.Option(help="Minutes of 1 s samples (60: one hour).")] = 60,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Bytes per sample at rest: zlib (v1) vs pcodec (v2) chunks, a minute vs an hour long."""
    from hbmwatch.bench import benchmarks, codecs

    log.configure("warning")
    report = codecs.bench_codec(gpus=gpus, nodes=nodes, minutes=minutes)
    for name in ("telemetry", "simulated"):
        if name in report:
            _print_codec_report(name, report[name])
    benchmarks.write_json(report, json_out)


def _print_codec_report(name: str, r: dict) -> None:  # type: ignore[type-arg]
    table = Table(
        title=f"{name}: {r['series']:,} series, {r['samples']:,} samples; registry "
        f"{r['registry_bytes_per_series']:.0f} B a series = "
        f"{r['registry_bytes_per_sample_day']:.3f} B a sample over a day"
    )
    columns = {
        "blob B/sample": "blob_bytes_per_sample",
        "rows B/sample": "rows_bytes_per_sample",
        "+ minute stats": "rows_with_stats_bytes_per_sample",
        "+ registry, day": "day_bytes_per_sample",
        "encode CPU-s/M": "encode_cpu_s_per_million",
        "decode CPU-s/M": "decode_cpu_s_per_million",
    }
    table.add_column("codec, chunk")
    for title in columns:
        table.add_column(title, justify="right")
    for variant, got in r["variants"].items():
        table.add_row(variant, *(f"{got[key]:.2f}" for key in columns.values()))
    Console(width=140).print(table)
    block = r.get("prometheus_block", {})
    if "bytes_per_sample" in block:
        Console(stderr=True).print(
            f"baseline, the same samples as a Prometheus block (promtool): "
            f"{block['bytes_per_sample']:.2f} B a sample ({block['chunk_bytes_per_sample']:.2f} "
            f"chunks, index {block['index_bytes_per_series']:.0f} B a series)"
        )
    elif "skipped" in block:
        Console(stderr=True).print(f"no Prometheus baseline: {block['skipped']}")
