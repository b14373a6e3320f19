"""The generated Prometheus rules: promtool accepts them, their unit tests pass (and can fail),
and every expression names only metrics and labels the model defines."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hbmwatch.alerts import promrules
from hbmwatch.metrics import EXPORTED, METRICS, MetricDef

PROMTOOL = Path("/usr/bin/promtool")
KNOWN: dict[str, MetricDef] = {**METRICS, **EXPORTED}

#: PromQL words that look like metric names but are not.
KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once strings, label matchers,
    ranges and grouping clauses are gone, less function calls and keywords."""
    stripped = _STRING.sub('""', expr)
    stripped = _BRACES.sub(" ", _GROUPING.sub(" ", _RANGE.sub(" ", stripped)))
    return {n for n in _IDENT.findall(stripped) if n.lower() not in KEYWORDS}


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for clause in _GROUPING.findall(expr)
        for label in clause[clause.index("(") + 1 : -1].split(",")
        if label.strip()
    }


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def promtool() -> Path:
    if not PROMTOOL.exists():
        message = f"promtool not available at {PROMTOOL}"
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return PROMTOOL


def _load(text: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return json.loads(text)
    return yaml.safe_load(text)


def _alerts(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in document["groups"] for rule in group["rules"]]


# -- promtool ----------------------------------------------------------------------------------


def test_promtool_accepts_the_rules_and_their_unit_tests_pass(
    promtool: Path, tmp_path: Path
) -> None:
    rules, tests = promrules.write_rules(tmp_path)
    assert (rules.name, tests.name) == ("hbmwatch-rules.yml", "hbmwatch-rules.test.yml")
    check = _promtool("check", "rules", rules.name, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    test = _promtool("test", "rules", tests.name, cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr


def test_a_wrong_expectation_fails_promtool(promtool: Path, tmp_path: Path) -> None:
    promrules.write_rules(tmp_path)
    document = promrules.rules_tests_document()
    wrong = copy.deepcopy(document)
    # Expect the healthy GPU (margin 10) to alert too.
    case = next(t for t in wrong["tests"][0]["alert_rule_test"] if t["exp_alerts"])
    extra = copy.deepcopy(case["exp_alerts"][0])
    extra["exp_labels"]["host"] = "h1"
    case["exp_alerts"].append(extra)
    (tmp_path / "wrong.test.yml").write_text(json.dumps(wrong))
    result = _promtool("test", "rules", "wrong.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "HBMThermalMarginLow" in result.stdout + result.stderr

    silent = copy.deepcopy(document)
    for group in silent["tests"]:
        for t in group["alert_rule_test"]:
            t["exp_alerts"] = []  # "nothing fires": wrong wherever an alert should fire
    (tmp_path / "silent.test.yml").write_text(json.dumps(silent))
    assert _promtool("test", "rules", "silent.test.yml", cwd=tmp_path).returncode != 0


def test_overridden_for_durations_are_written() -> None:
    overrides = {"HBMThermalMarginLow": 0, "HbmwatchFindingsOpen": 90, "HbmwatchTargetDown": 45}
    by_name = {a["alert"]: a for a in _alerts(promrules.rules_document(for_seconds=overrides))}
    assert "for" not in by_name["HBMThermalMarginLow"]
    assert by_name["HbmwatchFindingsOpen"]["for"] == "1m30s"
    assert by_name["HbmwatchTargetDown"]["for"] == "45s"
    assert by_name["HBMThermalLimitExceeded"]["for"] == "30s"  # the default, untouched


@pytest.mark.parametrize("seconds", [0, 20])  # none at all, and one off the 15 s test grid
def test_unit_tests_follow_overridden_for_durations(
    promtool: Path, tmp_path: Path, seconds: int
) -> None:
    overrides = {a.name: seconds for a in promrules.ALERTS}
    rules, tests = promrules.write_rules(tmp_path, for_seconds=overrides)
    assert _load(rules.read_text()) == promrules.rules_document(for_seconds=overrides)
    test = _promtool("test", "rules", tests.name, cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr


def test_unknown_or_negative_for_override_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown alert"):
        promrules.rules_document(for_seconds={"HBMThermalMarginLo": 60})
    with pytest.raises(ValueError, match="whole seconds"):
        promrules.rules_document(for_seconds={"HBMThermalMarginLow": -1})


# -- what the expressions name -----------------------------------------------------------------


def test_metric_name_parser_finds_names_not_functions_labels_or_keywords() -> None:
    expr = (
        'sum by (receiver) (rate(a_total{outcome="failed", x=~"b|c"}[5m])) > 0 '
        "and on (receiver) b_seconds offset 5m unless ignoring(y) c"
    )
    assert metric_names(expr) == {"a_total", "b_seconds", "c"}
    assert grouping_labels(expr) == {"receiver", "y"}


def test_every_expression_names_only_known_metrics_and_labels() -> None:
    alerts = _alerts(promrules.rules_document())
    assert {a["alert"] for a in alerts} == {
        "HBMThermalMarginLow",
        "HBMThermalLimitExceeded",
        "HbmwatchFindingsOpen",
        "HbmwatchIncidentOpen",
        "HbmwatchDetectionLagging",
        "HbmwatchAlertDeliveryFailing",
        "HbmwatchTargetDown",
    }
    for a in alerts:
        names = metric_names(a["expr"])
        assert names, a["alert"]
        assert names <= set(KNOWN), (a["alert"], names - set(KNOWN))
        allowed = set().union(*(KNOWN[n].allowed_labels for n in names))
        assert grouping_labels(a["expr"]) <= allowed, a["alert"]
        for name, matchers in _SELECTOR.findall(a["expr"]):
            m = KNOWN[name]
            for label, op, value in _MATCHER.findall(matchers):
                assert label in m.allowed_labels, (a["alert"], label)
                if op == "=" and label in m.label_values:
                    assert value in m.label_values[label], (a["alert"], label, value)


def test_unit_test_series_are_known_metrics_with_declared_labels() -> None:
    scrape = {"job", "instance"}  # what Prometheus adds to every scraped series
    for group in promrules.rules_tests_document()["tests"]:
        for series in group["input_series"]:
            (name,) = metric_names(series["series"])
            m = KNOWN[name]
            for label, _, value in _MATCHER.findall(series["series"]):
                assert label in m.allowed_labels | scrape, (name, label)
                if label in m.label_values:
                    assert value in m.label_values[label], (name, label, value)


# -- what an alert carries ---------------------------------------------------------------------


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    for a in _alerts(promrules.rules_document()):
        assert a["labels"]["severity"] in {"info", "warning", "critical"} or (
            a["labels"]["severity"] == "{{ $labels.severity }}"
        ), a["alert"]
        for key in ("summary", "description", "runbook"):
            assert a["annotations"].get(key, "").strip(), (a["alert"], key)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for group in promrules.rules_tests_document()["tests"]:
        for t in group["alert_rule_test"]:
            (fired if t["exp_alerts"] else quiet).add(t["alertname"])
    names = set(promrules.ALERTS_BY_NAME)
    # FindingsOpen has no ``for``, so its "not firing" is the zero-count series staying quiet.
    assert fired == names
    assert quiet == names - {"HbmwatchFindingsOpen"}


def test_rendered_file_parses_back_to_the_document() -> None:
    assert _load(promrules.render_rules()) == promrules.rules_document()
    assert _load(promrules.render_rules_tests()) == promrules.rules_tests_document()


def test_expand_template_renders_the_subset_and_refuses_the_rest() -> None:
    text = 'GPU {{ $labels.gpu }} at {{ printf "%.1f" $value }}{{ $labels.missing }}'
    assert promrules.expand_template(text, {"gpu": "3"}, -2.25) == "GPU 3 at -2.2"
    with pytest.raises(ValueError, match="subset"):
        promrules.expand_template("{{ $value | humanize }}", {}, 1.0)
