"""The device-run captures' checks: a declaration scored and asserted, one named check each.

``checks()`` turns a validated ``expected.toml`` (``tests/device_captures.py``) into named
checks over one scoring (the whole capture or a cut); each raises an ``AssertionError``
naming the capture, the scoring and the expectation, so a failing test id and message say
what regressed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hbmwatch.records import Finding
from hbmwatch.runtime.offline import ScoredFile, Trace, merge_traces, read_trace, score_trace
from hbmwatch.taxonomy import Cause, FindingKind
from tests.device_captures import WHOLE, Declared, Expect, Window, causes

PEAK = re.compile(r"peaked (\d+(?:\.\d+)?)x its baseline")


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
        _assertcauses(found, exp)

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


def _assertcauses(f: Finding, exp: Expect) -> None:
    ranked = [(c.cause, round(c.confidence, 2)) for c in f.causes]
    first = Cause(f.causes[0].cause) if f.causes else None
    if exp.first_cause:
        want = causes(exp.first_cause)
        assert first in want, f"first cause {first}, want one of {exp.first_cause}: {ranked}"
    if exp.not_first_cause:
        avoid = causes(exp.not_first_cause)
        assert first not in avoid, f"first cause {first} is in {exp.not_first_cause}: {ranked}"
    if exp.no_cause:
        bad = [c.cause for c in f.causes if Cause(c.cause) in causes(exp.no_cause)]
        assert not bad, f"{bad} ranked at all ({exp.no_cause}): {ranked}"
    if exp.first_cause_evidenced:
        assert f.causes and f.causes[0].evidence, f"the first cause has no evidence: {ranked}"
    if exp.late_causes:
        _assert_late(f, causes(exp.late_causes), ranked)
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
