"""The Numenta Anomaly Benchmark (NAB) through the generic series model.

NAB's data layout is a folder of category folders of ``timestamp,value`` CSVs; its scorer
(``run.py --optimize --score --normalize`` in a NAB checkout) reads
``<results>/<detector>/<category>/<detector>_<file>.csv`` with the columns
``timestamp,value,anomaly_score,label``.  Every file is scored by one fresh ``SeriesModel()``
in its one fixed configuration: no per-file settings, and labels are never read.  The
``label`` column is written as 0: NAB's scorer takes the labels from its own windows file
(``labels/combined_windows.json``), not from the results file.

All files step together (one model row per file, each with its own timestamps), which
gives exactly the scores of ``score_series`` on each file alone, far faster.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from hbmwatch.detectors.generic_model import SeriesModel
from hbmwatch.validation import HbmwatchError

DETECTOR = "hbmwatch"
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")


@dataclass(frozen=True)
class NabFile:
    """One NAB data file: its category folder, name, timestamps (text and ms) and values."""

    category: str
    name: str
    stamps: list[str]
    t_ms: np.ndarray
    values: np.ndarray

    @property
    def relative(self) -> str:
        return f"{self.category}/{self.name}"


HALVES = ("even", "odd")


def find_files(data_dir: Path, half: str | None = None) -> list[tuple[str, Path]]:
    """``(category, path)`` of every CSV one folder below ``data_dir``, sorted; or an error.

    ``half`` keeps the files of even or odd index in that order: the development and the
    held-out halves (docs/detection.md), so a tuned configuration can be checked on files
    it was not tuned on.
    """
    if not data_dir.is_dir():
        raise HbmwatchError(f"{data_dir}: not a folder (NAB's data/: category folders of CSVs)")
    if half is not None and half not in HALVES:
        raise HbmwatchError(f"half {half!r}: use one of {', '.join(HALVES)}")
    found = sorted((p.parent.name, p) for p in data_dir.glob("*/*.csv") if p.is_file())
    if not found:
        raise HbmwatchError(f"{data_dir}: no <category>/<file>.csv inside; not NAB's data layout")
    return found if half is None else found[HALVES.index(half) :: 2]


def read_file(category: str, path: Path) -> NabFile:
    """A ``timestamp,value`` CSV with NAB's ``YYYY-MM-DD HH:MM:SS`` timestamps (UTC)."""
    stamps: list[str] = []
    values: list[float] = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["timestamp", "value"]:
            raise HbmwatchError(f"{path}: the header is not 'timestamp,value'")
        for line, row in enumerate(reader, start=2):
            try:
                stamps.append(row[0])
                values.append(float(row[1]))
            except (IndexError, ValueError):
                raise HbmwatchError(f"{path}:{line}: not a 'timestamp,value' row: {row}") from None
    return NabFile(category, path.name, stamps, _parse_ms(stamps, path), np.array(values))


def _parse_ms(stamps: list[str], path: Path) -> np.ndarray:
    try:
        return np.array(
            [datetime.fromisoformat(s).replace(tzinfo=UTC).timestamp() * 1000 for s in stamps]
        )
    except ValueError as e:
        raise HbmwatchError(f"{path}: a timestamp NAB would not write: {e}") from None


def score_files(files: list[NabFile], model: SeriesModel | None = None) -> list[np.ndarray]:
    """Every file through one model, one row each, stepping all files together."""
    model = model or SeriesModel()
    rows = model.rows([f.relative for f in files])
    length = max((len(f.values) for f in files), default=0)
    t = np.zeros((len(files), length))
    x = np.full((len(files), length), np.nan)
    for i, f in enumerate(files):
        t[i, : len(f.values)] = f.t_ms
        x[i, : len(f.values)] = f.values
    scores = np.empty_like(x)
    for step in range(length):
        scores[:, step] = model.update(rows, t[:, step], x[:, step])
    return [scores[i, : len(f.values)] for i, f in enumerate(files)]


def write_result(out_dir: Path, f: NabFile, scores: np.ndarray) -> Path:
    """``<out>/hbmwatch/<category>/hbmwatch_<file>.csv`` in NAB's result columns."""
    target = out_dir / DETECTOR / f.category / f"{DETECTOR}_{f.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["timestamp", "value", "anomaly_score", "label"])
        for stamp, value, score in zip(f.stamps, f.values.tolist(), scores.tolist(), strict=True):
            w.writerow([stamp, repr(value), f"{score:.6f}", 0])
    return target


def run(
    data_dir: Path,
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
    half: str | None = None,
) -> list[Path]:
    """Score every NAB file in ``data_dir`` (or one ``half``) and write NAB's result files
    under ``out_dir``."""
    files = []
    for n, (category, path) in enumerate(find_files(data_dir, half), start=1):
        files.append(read_file(category, path))
        if progress:
            progress(f"read {n} files ({files[-1].relative})")
    written = []
    for n, (f, scores) in enumerate(zip(files, score_files(files), strict=True), start=1):
        written.append(write_result(out_dir, f, scores))
        if progress:
            progress(f"{n}/{len(files)} files scored and written ({f.relative})")
    return written


_FINAL = re.compile(r"Final score for '(\w+)' detector on '(\w+)' profile = (-?[\d.]+)")


def nab_scores(
    nab_dir: Path, data_dir: Path, results_dir: Path, half: str | None = None
) -> dict[str, float]:
    """NAB's own scorer on ``results_dir``: the three normalised scores, by profile.

    Copies NAB's null-detector results for the files of ``data_dir`` beside ours (the
    normalisation's baseline), keeps only those files' windows (with ``half``, only that
    half's files, copied to ``results_dir/data``: NAB scores a folder), and runs ``run.py``
    with ``nab_dir/.venv/bin/python`` if there is one (NAB wants pandas < 2), else this one.
    ``--optimize`` picks one threshold per detector and profile over the whole corpus, as
    for every entry of NAB's scoreboard.
    """
    if not (nab_dir / "run.py").is_file():
        raise HbmwatchError(f"{nab_dir}: no run.py; not a NAB checkout")
    chosen = find_files(data_dir, half)
    if half is not None:
        data_dir = results_dir / "data"
        for category, path in chosen:
            (data_dir / category).mkdir(parents=True, exist_ok=True)
            (data_dir / category / path.name).write_bytes(path.read_bytes())
    relative = [f"{c}/{p.name}" for c, p in chosen]
    for rel in relative:
        category, name = rel.split("/")
        null = nab_dir / "results" / "null" / category / f"null_{name}"
        target = results_dir / "null" / category / f"null_{name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(null.read_bytes())
    every = json.loads((nab_dir / "labels" / "combined_windows.json").read_text())
    windows = results_dir / "windows.json"
    windows.write_text(json.dumps({rel: every.get(rel, []) for rel in relative}))
    thresholds = results_dir / "thresholds.json"
    thresholds.write_text(json.dumps({}))
    venv = nab_dir / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    cmd = [
        python, "run.py", "-d", "null", DETECTOR, "--optimize", "--score", "--normalize",
        "--skipConfirmation", "-n", "1", "--dataDir", str(data_dir.resolve()),
        "--resultsDir", str(results_dir.resolve()), "--windowsFile", str(windows.resolve()),
        "-t", str(thresholds.resolve()),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=nab_dir, capture_output=True, text=True, check=False)
    found = {p: float(v) for d, p, v in _FINAL.findall(done.stdout) if d == DETECTOR}
    if done.returncode or set(found) != set(PROFILES):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise HbmwatchError(f"NAB's scorer failed: {' '.join(tail) or done.returncode}")
    return found
