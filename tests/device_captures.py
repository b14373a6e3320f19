"""The device-run captures as a regression suite: each folder's ``expected.toml`` and its checks.

Every folder under ``docs/device-runs/`` declares what scoring its capture must show (the
schema below, documented in ``docs/device-runs/README.md``), or says why it has no trace to
score.  ``checks()`` turns one declaration into named checks, each of which raises an
``AssertionError`` naming the capture, the scoring (the whole capture or a cut) and the
expectation, so a failing test id and message say what regressed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hbmwatch.records import Finding
from hbmwatch.runtime.offline import (
    DetectorOptions,
    ScoredFile,
    Trace,
    merge_traces,
    read_trace,
    score_trace,
)
from hbmwatch.taxonomy import Cause, FindingKind

RUNS = Path(__file__).parent.parent / "docs" / "device-runs"
EXPECTED = "expected.toml"
WHOLE = "whole"
#: Cause families an expectation may name beside single causes.
FAMILIES: dict[str, frozenset[Cause]] = {
    "heat": frozenset(c for c in Cause if c.is_thermal),
    "bandwidth": frozenset({Cause.CO_TENANT, Cause.MEMORY_BANDWIDTH}),
}
PEAK = re.compile(r"peaked (\d+(?:\.\d+)?)x its baseline")


class CaptureError(ValueError):
    """An expected.toml that cannot be read or does not fit the schema (one line)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _causes(names: list[str]) -> frozenset[Cause]:
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


def score(d: Declared, scoring: str) -> ScoredFile:
    """Score the merged trace whole, or from a cut's start, with the declared options."""
    cap = d.capture
    assert cap.trace is not False
    trace = merge_traces([read_trace(d.folder / name) for name in cap.trace])
    if scoring != WHOLE:
        from_ms = d.starts_s(scoring) * 1000
        trace = Trace(trace.path, [s for s in trace.samples if s.timestamp_ms >= from_ms], {})
    options = cap.options.detector_options() if cap.options else None
    return score_trace(trace, options=options)


Check = Callable[[ScoredFile], None]


def _phase_keys(d: Declared, scoring: str) -> list[tuple[str, Window, Expect]]:
    """Each phase expectation with its test key: ``gemm:p99_regression``, ``gemm#2:...``.

    A cut is held to the phases that start inside it.
    """
    out: list[tuple[str, Window, Expect]] = []
    for phase in d.capture.phases:
        window = d.window(phase.name, phase.occurrence)
        if window.start_s < d.starts_s(scoring):
            continue
        for exp in phase.expect:
            key = f"{window.label}:{exp.kind.value}"
            n = sum(k == key or k.startswith(f"{key}#") for k, _, _ in out)
            out.append((key if n == 0 else f"{key}#{n + 1}", window, exp))
    return out


def checks(d: Declared, scoring: str = WHOLE) -> dict[str, Check]:
    """The capture's expectations as named checks over one scoring's result."""
    cap = d.capture
    keys = _phase_keys(d, scoring)
    out: dict[str, Check] = {key: _phase_check(w, exp) for key, w, exp in keys}
    if cap.no_heat_blamed:
        out["no-heat-blamed"] = _no_heat_check(d.windows[0].start_s)
    out["quiet-outside-loads"] = _quiet_check(d)
    for kind, n in cap.totals.items():
        out[f"total:{kind.value}"] = _total_check(kind, n, d.windows[0].start_s)
    return out


def known_gaps(d: Declared, scoring: str = WHOLE) -> dict[str, str]:
    """Expectations the detectors are known to miss today (reported): expected failures."""
    keys = _phase_keys(d, scoring)
    return {key: exp.known_gap[scoring] for key, _, exp in keys if scoring in exp.known_gap}


def run_check(d: Declared, scoring: str, key: str, result: ScoredFile) -> None:
    """Run one check; its failure names the capture, the scoring and the expectation."""
    try:
        checks(d, scoring)[key](result)
    except AssertionError as exc:
        raise AssertionError(f"{d.name} [{scoring}] {key}: {exc}") from None


def _brief(findings: list[Finding], origin_s: float = 0.0) -> list[tuple[str, float, str | None]]:
    """Each finding's kind, start (seconds from ``origin_s``) and first cause."""
    return [(f.kind, round(f.started_ms / 1000 - origin_s, 1), f.top_cause) for f in findings]


def _phase_check(w: Window, exp: Expect) -> Check:
    def check(result: ScoredFile) -> None:
        found = _matching(result.findings, w, exp)
        _assert_causes(found, exp)

    return check


def _matching(findings: list[Finding], w: Window, exp: Expect) -> Finding:
    """The one finding the expectation is about: new in the phase, or still open from before."""
    same = [
        f for f in findings
        if f.kind == exp.kind and all(f.entity.get(k) == v for k, v in exp.entity.items())
    ]  # fmt: skip
    if exp.still_open:
        at_ms = (w.start_s + (exp.raised_within_s or 0)) * 1000
        open_then = [
            f for f in same
            if f.raised_ms <= at_ms and (f.ended_ms is None or f.ended_ms >= at_ms)
        ]  # fmt: skip
        assert open_then, f"no {exp.kind.value} open {exp.raised_within_s} s into {w.label}"
        return open_then[0]
    lo, hi = (w.start_s + exp.started_s[0]) * 1000, (w.start_s + exp.started_s[1]) * 1000
    new = [f for f in same if lo <= f.started_ms <= hi]
    entity = f" {dict(exp.entity)}" if exp.entity else ""
    assert len(new) == 1, (
        f"want one {exp.kind.value}{entity} started {list(exp.started_s)} s from {w.label}'s "
        f"start; found (kind, start from it, first cause): {_brief(findings, w.start_s)}"
    )
    f = new[0]
    if exp.raised_within_s is not None:
        late = f.raised_ms / 1000 - w.start_s
        assert late <= exp.raised_within_s, (
            f"{exp.kind.value} raised {late:.1f} s after {w.label} began, "
            f"want <= {exp.raised_within_s}"
        )
    return f


def _assert_causes(f: Finding, exp: Expect) -> None:
    ranked = [(c.cause, round(c.confidence, 2)) for c in f.causes]
    first = Cause(f.causes[0].cause) if f.causes else None
    if exp.first_cause:
        want = _causes(exp.first_cause)
        assert first in want, f"first cause {first}, want one of {exp.first_cause}: {ranked}"
    if exp.not_first_cause:
        avoid = _causes(exp.not_first_cause)
        assert first not in avoid, f"first cause {first} is in {exp.not_first_cause}: {ranked}"
    if exp.no_cause:
        bad = [c.cause for c in f.causes if Cause(c.cause) in _causes(exp.no_cause)]
        assert not bad, f"{bad} ranked at all ({exp.no_cause}): {ranked}"
    if exp.first_cause_evidenced:
        assert f.causes and f.causes[0].evidence, f"the first cause has no evidence: {ranked}"
    if exp.late_causes:
        _assert_late(f, _causes(exp.late_causes), ranked)
    if exp.peak_at_least is not None:
        peak = PEAK.search(f.summary)
        assert peak and float(peak.group(1)) >= exp.peak_at_least, (
            f"summary states no peak >= {exp.peak_at_least}x: {f.summary!r}"
        )


def _assert_late(f: Finding, late: frozenset[Cause], ranked: list[tuple[str, float]]) -> None:
    """A cause that began after the regression: never first, below it, and said to be late."""
    assert f.causes and Cause(f.causes[0].cause) not in late, f"a late cause is first: {ranked}"
    top = f.causes[0].confidence
    for c in f.causes[1:]:
        if Cause(c.cause) in late:
            assert "after the regression" in c.summary, f"{c.cause} not said late: {c.summary}"
            assert c.confidence < top, f"{c.cause} ties the first cause: {ranked}"


def _no_heat_check(origin_s: float) -> Check:
    def check(result: ScoredFile) -> None:
        hot_kinds = [f for f in result.findings if f.kind == FindingKind.THERMAL_EXCURSION]
        assert not hot_kinds, f"a thermal excursion: {_brief(hot_kinds, origin_s)}"
        hot = [f for f in result.findings if f.causes and Cause(f.causes[0].cause).is_thermal]
        assert not hot, f"heat ranked first: {_brief(hot, origin_s)}"

    return check


def _quiet_check(d: Declared) -> Check:
    cap = d.capture
    loads = [d.window(p.name, p.occurrence) for p in cap.phases]
    lead, tail = cap.lead_s, cap.tail_s or 0.0

    def check(result: ScoredFile) -> None:
        outside = [
            f for f in result.findings
            if not any(w.start_s - lead <= f.started_ms / 1000 <= w.end_s + tail for w in loads)
        ]  # fmt: skip
        assert not outside, (
            f"found outside the load phases (-{lead} s, +{tail} s), seconds from the run's "
            f"start: {_brief(outside, d.windows[0].start_s)}"
        )

    return check


def _total_check(kind: FindingKind, n: int, origin_s: float) -> Check:
    def check(result: ScoredFile) -> None:
        got = [f for f in result.findings if f.kind == kind]
        assert len(got) == n, f"{len(got)} {kind.value} findings, want {n}: {_brief(got, origin_s)}"

    return check


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
