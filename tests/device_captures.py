"""The device-run captures' declarations: each folder's ``expected.toml``, validated.

Every folder under ``docs/device-runs/`` declares what scoring its capture must show (the
schema below, documented in ``docs/device-runs/README.md``), or says why it has no trace to
score.  A file that does not fit fails with one line naming it and the field;
``tests/device_capture_checks.py`` turns a declaration into named checks.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hbmwatch.runtime.offline import DetectorOptions
from hbmwatch.taxonomy import Cause, FindingKind

RUNS = Path(__file__).parent.parent / "docs" / "device-runs"
EXPECTED = "expected.toml"
WHOLE = "whole"
#: Cause families an expectation may name beside single causes.
FAMILIES: dict[str, frozenset[Cause]] = {
    "heat": frozenset(c for c in Cause if c.is_thermal),
    "bandwidth": frozenset({Cause.CO_TENANT, Cause.MEMORY_BANDWIDTH}),
}


class CaptureError(ValueError):
    """An expected.toml that cannot be read or does not fit the schema (one line)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def causes(names: list[str]) -> frozenset[Cause]:
    """The causes named, families expanded."""
    out: set[Cause] = set()
    for name in names:
        out |= FAMILIES.get(name) or {Cause(name)}
    return frozenset(out)


def _known(names: list[str]) -> list[str]:
    """Every name a Cause value or a family of FAMILIES."""
    bad = [n for n in names if n not in FAMILIES and n not in set(Cause)]
    if bad:
        known = ", ".join([*FAMILIES, *(c.value for c in Cause)])
        raise ValueError(f"unknown cause or family {bad[0]!r} (one of: {known})")
    return names


class Options(_Strict):
    """DetectorOptions for the capture (score-file --warmup --hold --min-hold)."""

    warmup_s: float | None = Field(default=None, ge=0)
    hold_s: float | None = Field(default=None, ge=0)
    min_hold_s: float | None = Field(default=None, ge=0)

    def detector_options(self) -> DetectorOptions:
        return DetectorOptions(self.warmup_s, self.hold_s, self.min_hold_s)


class Cut(_Strict):
    """Score the capture again from ``offset_s`` around a phase's start: a cold start."""

    name: str = Field(min_length=1)
    phase: str
    occurrence: int = Field(default=1, ge=1)
    offset_s: float


class Expect(_Strict):
    """One finding a load phase must raise, as the user sees it (times from the phase start)."""

    kind: FindingKind
    started_s: tuple[float, float] = (-5.0, 5.0)
    raised_within_s: float | None = Field(default=None, gt=0)
    still_open: bool = False
    entity: dict[str, str] = {}
    first_cause: list[str] = []
    not_first_cause: list[str] = []
    no_cause: list[str] = []
    late_causes: list[str] = []
    first_cause_evidenced: bool = False
    peak_at_least: float | None = Field(default=None, gt=0)
    known_gap: dict[str, str] = {}

    @model_validator(mode="after")
    def _valid(self) -> Expect:
        for names in (self.first_cause, self.not_first_cause, self.no_cause, self.late_causes):
            _known(names)
        if self.started_s[0] > self.started_s[1]:
            raise ValueError(f"started_s {list(self.started_s)}: the first bound is the later")
        if self.still_open and self.raised_within_s is None:
            raise ValueError("still_open needs raised_within_s: when the finding must be open")
        return self


class Phase(_Strict):
    """A load phase of load_phases.txt (the n-th of that name) and the findings it raises."""

    name: str
    occurrence: int = Field(default=1, ge=1)
    expect: list[Expect] = []
    note: str | None = None

    @model_validator(mode="after")
    def _said_why(self) -> Phase:
        if not self.expect and not self.note:
            raise ValueError(f"phase {self.name!r} expects nothing: say why in `note`")
        return self


class Capture(_Strict):
    """One folder's expected.toml."""

    trace: list[str] | Literal[False]
    reason: str | None = None
    phases_file: str = "load_phases.txt"
    quiet: list[str] = ["idle", "rest", "done"]
    options: Options | None = None
    cuts: list[Cut] = []
    no_heat_blamed: bool | None = None
    lead_s: float = Field(default=5.0, ge=0)
    tail_s: float | None = Field(default=None, ge=0)
    totals: dict[FindingKind, Annotated[int, Field(ge=0)]] = {}
    phases: list[Phase] = []

    @model_validator(mode="after")
    def _complete(self) -> Capture:
        if self.trace is False:
            if not self.reason:
                raise ValueError("trace = false needs a `reason`: why there is nothing to score")
            return self
        if not self.trace:
            raise ValueError("trace: name the files that form the trace, or say trace = false")
        if self.no_heat_blamed is None or self.tail_s is None:
            raise ValueError("a trace states `no_heat_blamed` and `tail_s`")
        return self


@dataclass(frozen=True)
class Window:
    name: str
    occurrence: int
    start_s: float
    end_s: float

    @property
    def label(self) -> str:
        return self.name if self.occurrence == 1 else f"{self.name}#{self.occurrence}"


@dataclass(frozen=True)
class Declared:
    """A validated expected.toml with its folder and load phases."""

    folder: Path
    capture: Capture
    windows: tuple[Window, ...]
    source: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def scorings(self) -> list[str]:
        return [WHOLE, *(c.name for c in self.capture.cuts)]

    def starts_s(self, scoring: str) -> float:
        """Where a scoring's trace begins (Unix seconds): a cut's start, or the beginning."""
        for cut in self.capture.cuts:
            if cut.name == scoring:
                return self.window(cut.phase, cut.occurrence).start_s + cut.offset_s
        return float("-inf")

    def window(self, name: str, occurrence: int) -> Window:
        for w in self.windows:
            if w.name == name and w.occurrence == occurrence:
                return w
        raise CaptureError(
            f"{self.source}: no phase {name!r} (occurrence {occurrence}) in "
            f"{self.capture.phases_file}"
        )


def _one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = str(first["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def load(folder: Path, expected: Path | None = None) -> Declared:
    """Read and validate a folder's expected.toml (or ``expected``): one-line errors."""
    path = expected or folder / EXPECTED
    if not path.is_file():
        raise CaptureError(f"{folder}: no {EXPECTED} (declare the trace, or trace = false)")
    try:
        capture = Capture.model_validate(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise CaptureError(f"{path}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        raise CaptureError(f"{path}: {_one_line(exc)}") from None
    if capture.trace is False:
        return Declared(folder, capture, (), path)
    for name in [*capture.trace, capture.phases_file]:
        if not (folder / name).is_file():
            raise CaptureError(f"{path}: {name} is not in {folder}")
    declared = Declared(folder, capture, read_phases(folder / capture.phases_file), path)
    _check_phases(declared)
    return declared


def read_phases(path: Path) -> tuple[Window, ...]:
    """load_phases.txt: ``<unix seconds> <name>`` lines; each phase ends where the next starts."""
    rows = [line.split(" ", 1) for line in path.read_text().splitlines() if line.strip()]
    starts = [(float(ts), name.strip()) for ts, name in rows]
    seen: dict[str, int] = {}
    out = []
    for i, (start, name) in enumerate(starts):
        seen[name] = seen.get(name, 0) + 1
        end = starts[i + 1][0] if i + 1 < len(starts) else start
        out.append(Window(name, seen[name], start, end))
    return tuple(out)


def _check_phases(d: Declared) -> None:
    """Every load phase is declared once; every declared phase and cut is in the file."""
    path = d.source
    if len(set(d.scorings)) != len(d.scorings):
        raise CaptureError(f"{path}: cut names must differ from each other and from {WHOLE!r}")
    declared = [(p.name, p.occurrence) for p in d.capture.phases]
    for key in declared:
        d.window(*key)
        if declared.count(key) > 1:
            raise CaptureError(f"{path}: phase {key[0]!r} (occurrence {key[1]}) declared twice")
    for w in d.windows:
        if w.name not in d.capture.quiet and (w.name, w.occurrence) not in declared:
            raise CaptureError(
                f"{path}: load phase {w.name!r} (occurrence {w.occurrence}) has no [[phases]] "
                "entry (or list it in `quiet`)"
            )
    for cut in d.capture.cuts:
        d.window(cut.phase, cut.occurrence)
    for phase in d.capture.phases:
        for exp in phase.expect:
            for scoring in set(exp.known_gap) - set(d.scorings):
                raise CaptureError(f"{path}: known_gap names no scoring {scoring!r}")


def folder_problems(runs: Path = RUNS) -> list[str]:
    """Loose files, and folders that neither declare a trace nor say why they have none."""
    problems = [
        f"{p}: a loose file; put it in its run's folder"
        for p in sorted(runs.iterdir())
        if p.is_file() and p.name != "README.md"
    ]
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        try:
            load(folder)
        except CaptureError as exc:
            problems.append(str(exc))
    return problems
