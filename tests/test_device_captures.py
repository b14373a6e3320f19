"""Every real capture in docs/device-runs/ scored, and its expected.toml asserted.

One test id per capture, scoring (the whole capture or a cold-start cut) and expectation, so
a failure says which capture regressed and how.  Each capture is scored once per scoring
(module-scoped cache).  The checker is shown able to fail: wrong expectations (an
expected.toml mutated in a temp copy) fail with a message naming the capture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from hbmwatch.records import RankedCause
from hbmwatch.runtime.offline import ScoredFile
from hbmwatch.taxonomy import Cause, FindingKind
from tests.device_capture_checks import checks, known_gaps, run_check, score
from tests.device_captures import EXPECTED, RUNS, CaptureError, Declared, folder_problems, load

Scorer = Callable[[str, str], ScoredFile]
#: A valid head for the schema tests: the two-loads capture's files, the rules stated.
BASE = 'trace = ["nvml_samples.csv", "latency.csv"]\nno_heat_blamed = true\ntail_s = 30\n'


def _cases() -> list[pytest.param]:
    """(capture, scoring, check) for every folder that declares a trace; bad ones fail below."""
    cases = []
    for folder in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        try:
            d = load(folder)
        except CaptureError:
            continue  # test_every_folder_declares_its_capture names it
        if d.capture.trace is False:
            continue
        for scoring in d.scorings:
            gaps = known_gaps(d, scoring)
            for key in checks(d, scoring):
                gap = gaps.get(key)
                marks = [pytest.mark.xfail(reason=gap, raises=AssertionError, strict=True)]
                cases.append(
                    pytest.param(
                        d.name, scoring, key, id=f"{d.name}/{scoring}/{key}",
                        marks=marks if gap else (),
                    )
                )  # fmt: skip
    return cases


@pytest.fixture(scope="module")
def scored() -> Scorer:
    """Each capture scored once per scoring, shared by all of its expectations."""
    cache: dict[tuple[str, str], ScoredFile] = {}

    def get(name: str, scoring: str) -> ScoredFile:
        if (name, scoring) not in cache:
            cache[name, scoring] = score(load(RUNS / name), scoring)
        return cache[name, scoring]

    return get


def test_every_folder_declares_its_capture() -> None:
    """No loose files; each folder has a valid expected.toml: a trace, or why there is none."""
    assert folder_problems(RUNS) == []
    declared = [load(p) for p in RUNS.iterdir() if p.is_dir()]
    assert sum(d.capture.trace is not False for d in declared) >= 4


@pytest.mark.parametrize(("capture", "scoring", "key"), _cases())
def test_capture_expectation(scored: Scorer, capture: str, scoring: str, key: str) -> None:
    run_check(load(RUNS / capture), scoring, key, scored(capture, scoring))


def test_a_loose_file_or_an_undeclared_folder_fails_the_suite(tmp_path: Path) -> None:
    (tmp_path / "2026-01-01-probe.json").write_text("{}")
    (tmp_path / "no-declaration").mkdir()
    (tmp_path / "no-reason").mkdir()
    (tmp_path / "no-reason" / EXPECTED).write_text("trace = false\n")
    (tmp_path / "README.md").write_text("# runs\n")
    problems = folder_problems(tmp_path)
    assert len(problems) == 3, problems
    assert "2026-01-01-probe.json: a loose file" in problems[0]
    assert "no-declaration: no expected.toml" in problems[1]
    assert "no-reason" in problems[2] and "needs a `reason`" in problems[2]


# What each mutation does to a real expected.toml, and the check that must then fail.
MUTATIONS = [
    ("2026-11-27-h200-two-loads", 'first_cause = ["power_cap"]\npeak', 'first_cause = ["bandwidth"]\npeak', "gemm:p99_regression", "first cause power_cap"),  # noqa: E501
    ("2026-11-27-h200-two-loads", "raised_within_s = 15", "raised_within_s = 3", "hbm copy:p99_regression", "s after hbm copy began, want <= 3"),  # noqa: E501
    ("2026-11-27-h200-two-loads", "started_s = [0, 5]", "started_s = [3, 5]", "gemm:throttle", "want one throttle"),  # noqa: E501
    ("2026-11-27-h200-two-loads", 'entity = { reason = "power" }', 'entity = { reason = "power" }\nfirst_cause_evidenced = true', "gemm:throttle", "no evidence"),  # noqa: E501
    ("2026-11-26-h200-trace", 'late_causes = ["power_cap"]', 'late_causes = ["clock_drop"]', "hbm copy:p99_regression", "clock_drop not said late"),  # noqa: E501
    ("2026-11-26-h200-trace", "first_cause_evidenced = true", 'not_first_cause = ["co_tenant"]', "hbm copy:p99_regression", "first cause co_tenant is in"),  # noqa: E501
    ("2026-11-27-h200-cold-start", 'no_cause = ["heat"]', 'no_cause = ["power_cap"]', "gemm:p99_regression", "['power_cap'] ranked at all"),  # noqa: E501
    ("2026-11-27-h200-cold-start", "peak_at_least = 5", "peak_at_least = 9", "gemm:p99_regression", "no peak >= 9"),  # noqa: E501
    ("2026-11-27-h200-cold-start", 'kind = "p99_regression"\nstill_open', 'kind = "step_time_regression"\nstill_open', "hbm copy:step_time_regression", "no step_time_regression open"),  # noqa: E501
    ("2026-11-27-h200-cold-start", "throttle = 1 }", "throttle = 2 }", "total:throttle", "1 throttle findings, want 2"),  # noqa: E501
    ("2026-11-26-h200-trace", "tail_s = 30", 'tail_s = 0\nquiet = ["idle", "rest", "done", "gemm"]', "quiet-outside-loads", "found outside the load phases"),  # noqa: E501
]  # fmt: skip


def _mutated(tmp_path: Path, capture: str, old: str, new: str) -> Declared:
    """The capture's expected.toml with ``old`` replaced, read from a temp copy."""
    text = (RUNS / capture / EXPECTED).read_text()
    assert old in text, f"{capture}: the mutation's text is gone from {EXPECTED}"
    text = text.replace(old, new, 1)
    if "quiet = [" in new:  # the gemm moved to the quiet phases: drop its [[phases]] entry
        text = text[: text.index('[[phases]]\nname = "gemm"')]
    path = tmp_path / EXPECTED
    path.write_text(text)
    return load(RUNS / capture, expected=path)


@pytest.mark.parametrize(
    ("capture", "old", "new", "key", "message"), MUTATIONS, ids=[m[3] for m in MUTATIONS]
)
def test_a_wrong_expectation_fails_naming_the_capture(
    scored: Scorer, tmp_path: Path, capture: str, old: str, new: str, key: str, message: str
) -> None:
    result = scored(capture, "whole")
    right = load(RUNS / capture)
    if key in checks(right):
        run_check(right, "whole", key, result)  # the declared expectation holds ...
    wrong = _mutated(tmp_path, capture, old, new)
    with pytest.raises(AssertionError) as err:  # ... and the mutated one fails, named
        run_check(wrong, "whole", key, result)
    assert str(err.value).startswith(f"{capture} [whole] {key}: "), err.value
    assert message in str(err.value), err.value


def _blame_heat(result: ScoredFile, excursion: bool) -> ScoredFile:
    """The scoring as it would read had the detectors blamed heat (the rule's other side)."""
    first = result.findings[0]
    if excursion:
        hot = dataclasses.replace(first, kind=FindingKind.THERMAL_EXCURSION)
    else:
        hot = dataclasses.replace(first, causes=(RankedCause(Cause.THERMAL, 0.9), *first.causes))
    return dataclasses.replace(result, findings=[hot, *result.findings[1:]])


@pytest.mark.parametrize(
    ("excursion", "message"), [(True, "a thermal excursion"), (False, "heat ranked first")]
)
def test_heat_blamed_fails_the_no_heat_rule(scored: Scorer, excursion: bool, message: str) -> None:
    capture = "2026-11-27-h200-two-loads"
    hot = _blame_heat(scored(capture, "whole"), excursion)
    with pytest.raises(AssertionError, match=f"^{capture} \\[whole\\] no-heat-blamed: {message}"):
        run_check(load(RUNS / capture), "whole", "no-heat-blamed", hot)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('trace = false\nreason = "x"\ncolour = 1\n', "colour: Extra inputs are not permitted"),
        ("trace = false\n", "trace = false needs a `reason`"),
        ('trace = ["latency.csv"]\ntail_s = 30\n', "a trace states `no_heat_blamed`"),
        ('trace = ["nope.csv"]\nno_heat_blamed = true\ntail_s = 30\n', "nope.csv is not in"),
        (BASE + '[[phases]]\nname = "gemm"\n[[phases.expect]]\nkind = "p99_regression"\n'
         'first_cause = ["warmth"]\n', "unknown cause or family 'warmth'"),
        (BASE + '[[phases]]\nname = "gemm"\n', "phase 'gemm' expects nothing: say why"),
        (BASE + '[[phases]]\nname = "gemm"\nnote = "x"\n', "load phase 'hbm copy' (occurrence 1) has no"),  # noqa: E501
        (BASE + '[[phases]]\nname = "gemm"\noccurrence = 2\nnote = "x"\n', "no phase 'gemm' (occurrence 2)"),  # noqa: E501
        (BASE + '[[cuts]]\nname = "whole"\nphase = "gemm"\noffset_s = -30\n', "cut names must differ"),  # noqa: E501
        (BASE + 'quiet = ["idle", "rest", "done", "hbm copy"]\n[[phases]]\nname = "gemm"\n[[phases.expect]]\nkind = "throttle"\nknown_gap = { cold = "x" }\n', "known_gap names no scoring 'cold'"),  # noqa: E501
        ("trace = [", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_expected_toml_is_one_clear_line(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / EXPECTED
    path.write_text(toml)
    with pytest.raises(CaptureError) as err:
        load(RUNS / "2026-11-27-h200-two-loads", expected=path)
    text = str(err.value)
    assert text.startswith(str(path)) and "\n" not in text, text
    assert message in text, text


def test_declared_options_reach_the_detectors(tmp_path: Path) -> None:
    """``[options]`` scores with them: a 200 s hold outlasts the 30 s GEMM, so it is missed."""
    capture = "2026-11-27-h200-cold-start"
    text = (RUNS / capture / EXPECTED).read_text()
    path = tmp_path / EXPECTED
    path.write_text(text + "\n[options]\nwarmup_s = 30\nhold_s = 200\nmin_hold_s = 200\n")
    d = load(RUNS / capture, expected=path)
    with pytest.raises(AssertionError, match=f"^{capture} \\[whole\\] gemm:p99_regression: want"):
        run_check(d, "whole", "gemm:p99_regression", score(d, "whole"))
