"""``hbmwatch nab``: the Numenta Anomaly Benchmark's data through the generic series model."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from hbmwatch.cli.common import console, fail
from hbmwatch.validation import HbmwatchError


def nab(
    data_dir: Annotated[Path, typer.Argument(help="NAB's data/: category folders of CSVs.")],
    out: Annotated[Path, typer.Option(help="Results folder (NAB's results/ layout).")] = Path(
        "nab-results"
    ),
    nab_dir: Annotated[
        Path | None,
        typer.Option(help="A NAB checkout: run its scorer on the results and print the scores."),
    ] = None,
    half: Annotated[
        str | None,
        typer.Option(help="Only the files of even or odd sorted index (development, held out)."),
    ] = None,
) -> None:
    """Score every NAB file with one fixed SeriesModel(); write OUT/hbmwatch/<category>/...

    No per-file settings and no labels: each file gets a fresh model in the one default
    configuration.  With --nab-dir, NAB's own run.py (--optimize --score --normalize)
    scores the results and the three normalised scores are printed.
    """
    from hbmwatch.evaluation import nab as bench

    started = time.process_time()
    try:
        written = bench.run(data_dir, out, lambda m: print(m, file=sys.stderr), half)
    except HbmwatchError as exc:
        raise fail(exc) from exc
    cpu = time.process_time() - started
    console.print(f"{len(written)} result files under {out / bench.DETECTOR} ({cpu:.1f} CPU-s)")
    if nab_dir is None:
        return
    try:
        scores = bench.nab_scores(nab_dir, data_dir, out, half)
    except HbmwatchError as exc:
        raise fail(exc) from exc
    for profile, value in scores.items():
        console.print(f"NAB {profile}: {value:.2f}")
