"""A Prometheus rules file, and promtool unit tests for it, generated from the metric model.

For teams that alert from Prometheus rather than from hbmwatch's own alerting.  Generated
rather than hand-written so that every expression names only metrics the model defines
(``EXPORTED`` or ``METRICS``; ``tests/test_promrules.py`` checks) and the unit tests move
with the ``for`` durations.  The output is YAML via PyYAML where it is installed, JSON
otherwise: JSON is YAML, and promtool reads either.

Annotations use only ``{{ $labels.x }}`` and ``{{ printf "%.Nf" $value }}`` so that
``expand_template`` can render the expected text of the unit tests; promtool then checks
that Prometheus renders the same.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RULES_FILE = "hbmwatch-rules.yml"
TESTS_FILE = "hbmwatch-rules.test.yml"
#: How often the unit tests evaluate the rules and space their samples.
TEST_INTERVAL_SECONDS = 15

#: Thresholds, named once: the expressions and the annotations quote them.
THERMAL_MARGIN_LOW_CELSIUS = 5
DETECTION_LAG_LIMIT_SECONDS = 60
RATE_WINDOW_SECONDS = 300

_RUNBOOK = "docs/detection.md"


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule; ``severity`` may be a template (copied from the series)."""

    group: str
    name: str
    expr: str
    for_seconds: int
    severity: str
    summary: str
    description: str
    runbook: str

    @property
    def labels(self) -> dict[str, str]:
        return {"severity": self.severity}

    @property
    def annotations(self) -> dict[str, str]:
        return {"summary": self.summary, "description": self.description, "runbook": self.runbook}


_GPU = "{{ $labels.host }} GPU {{ $labels.gpu }}"
_WHERE = "{{ $labels.cluster }}/{{ $labels.rack }}/{{ $labels.host }} GPU {{ $labels.gpu }}"

ALERTS: tuple[AlertRule, ...] = (
    AlertRule(
        group="hbmwatch-thermal",
        name="HBMThermalMarginLow",
        expr=f'hbmwatch_gpu_thermal_margin_celsius{{sensor="memory"}} '
        f"< {THERMAL_MARGIN_LOW_CELSIUS}",
        for_seconds=60,
        severity="warning",
        summary=f"HBM on {_GPU} is within {THERMAL_MARGIN_LOW_CELSIUS} C of its limit",
        description=f"HBM temperature on {_WHERE} ({{{{ $labels.sku }}}}) "
        'has {{ printf "%.1f" $value }} C of headroom below the SKU limit; past it the '
        "memory throttles.",
        runbook="Check the rack's inlet temperature, fans and the job's memory bandwidth; "
        "hbmwatch's thermal_excursion and throttle findings for the host say which "
        f"({_RUNBOOK}). Drain the GPU if the margin keeps falling.",
    ),
    AlertRule(
        group="hbmwatch-thermal",
        name="HBMThermalLimitExceeded",
        expr='hbmwatch_gpu_thermal_margin_celsius{sensor="memory"} < 0',
        for_seconds=30,
        severity="critical",
        summary=f"HBM on {_GPU} is past its thermal limit",
        description=f"HBM temperature on {_WHERE} ({{{{ $labels.sku }}}}) is "
        '{{ printf "%.1f" $value }} C from the SKU limit (negative = past it); '
        "the memory is throttling or about to.",
        runbook="Drain the GPU now and check its cooling (inlet, fans, cold plate); "
        f"compare with its rack neighbours' margins ({_RUNBOOK}).",
    ),
    AlertRule(
        group="hbmwatch-findings",
        name="HbmwatchFindingsOpen",
        expr='sum by (kind, severity) (hbmwatch_findings_open{severity="critical"}) > 0',
        for_seconds=0,
        severity="critical",
        summary="hbmwatch has open critical {{ $labels.kind }} findings",
        description='{{ printf "%.0f" $value }} critical {{ $labels.kind }} findings are '
        "open in hbmwatch.",
        runbook=f"Read the findings in hbmwatch: each names its devices and evidence ({_RUNBOOK}).",
    ),
    AlertRule(
        group="hbmwatch-findings",
        name="HbmwatchIncidentOpen",
        expr='sum by (severity) (hbmwatch_incidents_open{state="open"}) > 0',
        for_seconds=120,
        severity="{{ $labels.severity }}",
        summary="hbmwatch has unacknowledged {{ $labels.severity }} incidents",
        description='{{ printf "%.0f" $value }} {{ $labels.severity }} incidents are open '
        "and not acknowledged in hbmwatch.",
        runbook="Acknowledge or resolve the incidents in hbmwatch; each groups the alerts "
        f"and findings behind it ({_RUNBOOK}).",
    ),
    AlertRule(
        group="hbmwatch-self",
        name="HbmwatchDetectionLagging",
        expr=f"hbmwatch_detection_lag_seconds > {DETECTION_LAG_LIMIT_SECONDS}",
        for_seconds=300,
        severity="warning",
        summary="hbmwatch detection on {{ $labels.instance }} is behind",
        description='The last detection cycle\'s frame ends {{ printf "%.0f" $value }} s '
        f"before now (limit {DETECTION_LAG_LIMIT_SECONDS} s): findings arrive late.",
        runbook="Compare hbmwatch_detection_cycle_seconds with the detection interval; a "
        f"slow store or too many series makes cycles overrun ({_RUNBOOK}).",
    ),
    AlertRule(
        group="hbmwatch-self",
        name="HbmwatchAlertDeliveryFailing",
        expr="sum by (receiver) "
        '(rate(hbmwatch_alert_notifications_total{outcome="failed"}'
        f"[{RATE_WINDOW_SECONDS // 60}m])) > 0",
        for_seconds=600,
        severity="warning",
        summary="hbmwatch cannot deliver alerts to {{ $labels.receiver }}",
        description="Notifications to {{ $labels.receiver }} fail at "
        '{{ printf "%.2f" $value }}/s: its alerts do not reach anyone.',
        runbook="Check the receiver's URL, credentials and reachability from hbmwatch; "
        "hbmwatch's logs name the error of each failed delivery.",
    ),
    AlertRule(
        group="hbmwatch-self",
        name="HbmwatchTargetDown",
        expr="hbmwatch_target_up == 0",
        for_seconds=120,
        severity="warning",
        summary="hbmwatch cannot scrape {{ $labels.target }}",
        description="Scrapes of {{ $labels.target }} ({{ $labels.source }} on "
        "{{ $labels.host }}) fail: its GPUs are not watched.",
        runbook="Check the exporter on the host is running and reachable from hbmwatch; "
        "hbmwatch_scrape_dropped_total says what else is lost.",
    ),
)
ALERTS_BY_NAME: dict[str, AlertRule] = {a.name: a for a in ALERTS}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(a.group for a in ALERTS))


def format_duration(seconds: int) -> str:
    """A Prometheus duration (``90`` -> ``1m30s``); ``0s`` for zero.

    >>> format_duration(90), format_duration(600), format_duration(0)
    ('1m30s', '10m', '0s')
    """
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            out += f"{n}{unit}"
    return out or "0s"


def _for_seconds(for_seconds: Mapping[str, int] | None) -> dict[str, int]:
    """Each alert's ``for``, overrides applied; a misspelt name fails rather than no-ops."""
    durations = {a.name: a.for_seconds for a in ALERTS}
    for name, seconds in (for_seconds or {}).items():
        if name not in durations:
            raise ValueError(f"unknown alert {name!r} in for_seconds: one of {sorted(durations)}")
        if int(seconds) != seconds or seconds < 0:
            raise ValueError(f"for_seconds[{name!r}] must be whole seconds >= 0, not {seconds}")
        durations[name] = int(seconds)
    return durations


def rules_document(*, for_seconds: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The rules file as data; ``for_seconds`` overrides alerts' ``for`` by alert name."""
    durations = _for_seconds(for_seconds)
    groups = []
    for group in GROUPS:
        rules = []
        for a in ALERTS:
            if a.group != group:
                continue
            rule: dict[str, Any] = {"alert": a.name, "expr": a.expr}
            if durations[a.name]:
                rule["for"] = format_duration(durations[a.name])
            rule["labels"] = a.labels
            rule["annotations"] = a.annotations
            rules.append(rule)
        groups.append({"name": group, "rules": rules})
    return {"groups": groups}


_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_PRINTF_VALUE = re.compile(r'^printf\s+"%\.(\d+)f"\s+\$value$')


def expand_template(text: str, labels: Mapping[str, str], value: float) -> str:
    """Render the template subset the rules use, as Prometheus would, for expected values."""

    def one(m: re.Match[str]) -> str:
        action = m.group(1)
        if action.startswith("$labels."):
            return labels.get(action.removeprefix("$labels."), "")
        printf = _PRINTF_VALUE.match(action)
        if printf:
            return f"{value:.{int(printf.group(1))}f}"
        raise ValueError(f"template action {action!r} is outside the subset the rules use")

    return _TEMPLATE.sub(one, text)


# -- unit tests ----------------------------------------------------------------------------


def _series(name: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}" if inner else name


@dataclass
class _Case:
    """One promtool test group: series, then which alerts fire when (with what value)."""

    series: list[tuple[str, dict[str, str], list[float]]]
    checks: list[tuple[int, str, list[tuple[dict[str, str], float]]]]

    def constant(self, name: str, labels: dict[str, str], value: float, n: int) -> None:
        self.series.append((name, labels, [value] * n))

    def expect(self, at: int, alert: str, *fired: tuple[dict[str, str], float]) -> None:
        self.checks.append((at, alert, list(fired)))

    def document(self) -> dict[str, Any]:
        tests = []
        for at, name, fired in self.checks:
            rule = ALERTS_BY_NAME[name]
            exp = []
            for labels, value in fired:
                full = {**labels, **rule.labels}
                exp.append(
                    {
                        "exp_labels": {
                            k: expand_template(v, labels, value) for k, v in full.items()
                        },
                        "exp_annotations": {
                            k: expand_template(v, labels, value)
                            for k, v in rule.annotations.items()
                        },
                    }
                )
            tests.append({"eval_time": format_duration(at), "alertname": name, "exp_alerts": exp})
        return {
            "interval": format_duration(TEST_INTERVAL_SECONDS),
            "input_series": [
                {"series": _series(name, labels), "values": _values(values)}
                for name, labels, values in self.series
            ],
            "alert_rule_test": tests,
        }


def _values(values: list[float]) -> str:
    """promtool's expanding notation, runs compressed (``3x4`` = five 3s, ``0+1x4`` = 0..4).

    >>> _values([3, 3, 3, 10, 0, 1, 2, 3])
    '3x2 10 0+1x3'
    """

    def num(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    out: list[str] = []
    i = 0
    while i < len(values):
        step = values[i + 1] - values[i] if i + 1 < len(values) else 0.0
        j = i + 1
        while j + 1 < len(values) and values[j + 1] - values[j] == step:
            j += 1
        if j == i + 1 and step != 0:  # two points are no run: emit the first alone
            out.append(num(values[i]))
            i += 1
            continue
        n = min(j, len(values) - 1) - i
        if n == 0:
            out.append(num(values[i]))
        elif step == 0:
            out.append(f"{num(values[i])}x{n}")
        else:
            out.append(f"{num(values[i])}{'+' if step > 0 else '-'}{num(abs(step))}x{n}")
        i += n + 1
    return " ".join(out)


def _samples(seconds: int) -> int:
    """Samples, one per interval, that cover ``seconds`` with a margin."""
    return math.ceil(seconds / TEST_INTERVAL_SECONDS) + 4


def _fires_at(for_s: int, onset: int = 0) -> int:
    """When a check sees the alert firing: past its ``for`` by two evaluations."""
    return onset + for_s + 2 * TEST_INTERVAL_SECONDS


def _pending_at(for_s: int, onset: int = 0) -> int | None:
    """When a check sees it still pending (not firing), if ``for`` leaves room for one."""
    at = onset + for_s - TEST_INTERVAL_SECONDS
    return at if for_s >= TEST_INTERVAL_SECONDS and at >= 0 else None


def _thermal_cases(d: Mapping[str, int]) -> list[_Case]:
    low, over = d["HBMThermalMarginLow"], d["HBMThermalLimitExceeded"]
    n = _samples(max(_fires_at(low), _fires_at(over)))
    margin = "hbmwatch_gpu_thermal_margin_celsius"

    def device(rack: str, host: str, gpu: str, sku: str, sensor: str = "memory") -> dict[str, str]:
        return dict(cluster="c1", rack=rack, host=host, gpu=gpu, sku=sku, sensor=sensor)

    ok = device("r1", "h1", "0", "mi300x")
    warm = device("r1", "h2", "1", "mi300x")
    hot = device("r2", "h3", "2", "b200")
    hot_die = device("r2", "h4", "3", "b200", sensor="hotspot")
    case = _Case([], [])
    case.constant(margin, ok, 10, n)  # plenty of headroom: no alert
    case.constant(margin, warm, 3, n)  # low: warning only
    case.constant(margin, hot, -2, n)  # past the limit: both
    case.constant(margin, hot_die, -4, n)  # a hot die is not HBM: no alert
    for name, fired in (
        ("HBMThermalMarginLow", [(warm, 3.0), (hot, -2.0)]),
        ("HBMThermalLimitExceeded", [(hot, -2.0)]),
    ):
        pending = _pending_at(d[name])
        if pending is not None:
            case.expect(pending, name)
        case.expect(_fires_at(d[name]), name, *fired)

    # A margin that recovers: the warning fires, then resolves.
    recovers = _Case([], [])
    fire = _fires_at(low)
    until = _samples(fire)
    recovers.series.append((margin, warm, [3.0] * until + [10.0] * 8))
    recovers.expect(fire, "HBMThermalMarginLow", (warm, 3.0))
    recovers.expect((until + 2) * TEST_INTERVAL_SECONDS, "HBMThermalMarginLow")
    return [case, recovers]


def _findings_cases(d: Mapping[str, int]) -> list[_Case]:
    f_open, i_open = d["HbmwatchFindingsOpen"], d["HbmwatchIncidentOpen"]
    n = _samples(max(_fires_at(f_open), _fires_at(i_open)))
    findings, incidents = "hbmwatch_findings_open", "hbmwatch_incidents_open"
    case = _Case([], [])
    case.constant(findings, {"kind": "thermal_excursion", "severity": "critical"}, 2, n)
    case.constant(findings, {"kind": "thermal_excursion", "severity": "warning"}, 5, n)
    case.constant(findings, {"kind": "p99_regression", "severity": "warning"}, 1, n)
    case.constant(findings, {"kind": "fabric_errors", "severity": "critical"}, 0, n)
    for kind in ("thermal_excursion", "p99_regression"):
        case.constant(incidents, {"severity": "critical", "kind": kind, "state": "open"}, 1, n)
    ack = {"severity": "warning", "kind": "throttle", "state": "acknowledged"}
    case.constant(incidents, ack, 1, n)  # acknowledged: no alert
    case.constant(incidents, {"severity": "info", "kind": "data_quality", "state": "open"}, 0, n)
    for name, fired in (
        ("HbmwatchFindingsOpen", [({"kind": "thermal_excursion", "severity": "critical"}, 2.0)]),
        ("HbmwatchIncidentOpen", [({"severity": "critical"}, 2.0)]),
    ):
        pending = _pending_at(d[name])
        if pending is not None:
            case.expect(pending, name)
        case.expect(_fires_at(d[name]), name, *fired)
    return [case]


def _self_cases(d: Mapping[str, int]) -> list[_Case]:
    cases = []

    lag_for = d["HbmwatchDetectionLagging"]
    n = _samples(_fires_at(lag_for))
    lag = _Case([], [])
    behind = {"instance": "hbm-a:8000", "job": "hbmwatch"}
    lag.constant("hbmwatch_detection_lag_seconds", behind, 120, n)
    current = {"instance": "hbm-b:8000", "job": "hbmwatch"}
    lag.constant("hbmwatch_detection_lag_seconds", current, 30, n)
    pending = _pending_at(lag_for)
    if pending is not None:
        lag.expect(pending, "HbmwatchDetectionLagging")
    lag.expect(_fires_at(lag_for), "HbmwatchDetectionLagging", (behind, 120.0))
    cases.append(lag)

    # A counter's rate is first non-zero once it has two samples: one interval in; its value
    # is the steady one (the annotation quotes it) once the whole [5m] window has samples.
    deliver_for = d["HbmwatchAlertDeliveryFailing"]
    onset = TEST_INTERVAL_SECONDS
    fires = max(_fires_at(deliver_for, onset), RATE_WINDOW_SECONDS + 2 * TEST_INTERVAL_SECONDS)
    n = _samples(fires)
    delivery = _Case([], [])
    total = "hbmwatch_alert_notifications_total"
    step = {
        ("pager", "failed"): 1,
        ("pager", "sent"): 5,
        ("slack", "failed"): 0,  # a failed-outcome series that stays flat: no alert
        ("slack", "sent"): 1,
        ("slack", "rate_limited"): 2,
    }
    for (receiver, outcome), inc in step.items():
        values = [float(i * inc) for i in range(n)]
        delivery.series.append((total, {"receiver": receiver, "outcome": outcome}, values))
    pending = _pending_at(deliver_for, onset)
    if pending is not None:
        delivery.expect(pending, "HbmwatchAlertDeliveryFailing")
    delivery.expect(
        fires,
        "HbmwatchAlertDeliveryFailing",
        ({"receiver": "pager"}, 1 / TEST_INTERVAL_SECONDS),
    )
    cases.append(delivery)

    down_for = d["HbmwatchTargetDown"]
    n = _samples(_fires_at(down_for))
    down = _Case([], [])

    def target(host: str, source: str) -> dict[str, str]:
        return dict(cluster="c1", rack="r1", host=host, target=f"{host}:9400", source=source)

    down.constant("hbmwatch_target_up", target("h1", "dcgm"), 1, n)
    down.constant("hbmwatch_target_up", target("h2", "dcgm"), 0, n)
    if down_for >= TEST_INTERVAL_SECONDS:  # down, up, down...: never down for ``for``
        flapping = [float(i % 2) for i in range(n)]
        down.series.append(("hbmwatch_target_up", target("h3", "amd_exporter"), flapping))
    pending = _pending_at(down_for)
    if pending is not None:
        down.expect(pending, "HbmwatchTargetDown")
    down.expect(_fires_at(down_for), "HbmwatchTargetDown", (target("h2", "dcgm"), 0.0))
    cases.append(down)
    return cases


def rules_tests_document(
    *, for_seconds: Mapping[str, int] | None = None, rule_file: str = RULES_FILE
) -> dict[str, Any]:
    """promtool unit tests for ``rules_document(for_seconds=...)``: each alert firing and not."""
    d = _for_seconds(for_seconds)
    cases = [*_thermal_cases(d), *_findings_cases(d), *_self_cases(d)]
    return {
        "rule_files": [rule_file],
        "evaluation_interval": format_duration(TEST_INTERVAL_SECONDS),
        "tests": [c.document() for c in cases],
    }


def _dump(document: Mapping[str, Any]) -> str:
    """YAML where PyYAML is installed, else JSON (which is YAML to promtool)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return json.dumps(document, indent=2) + "\n"
    return str(yaml.safe_dump(dict(document), sort_keys=False, width=1000))


def render_rules(*, for_seconds: Mapping[str, int] | None = None) -> str:
    """The rules file's text."""
    return _dump(rules_document(for_seconds=for_seconds))


def render_rules_tests(*, for_seconds: Mapping[str, int] | None = None) -> str:
    """The unit-test file's text (``promtool test rules`` it beside the rules file)."""
    return _dump(rules_tests_document(for_seconds=for_seconds))


def write_rules(
    directory: Path, *, for_seconds: Mapping[str, int] | None = None
) -> tuple[Path, Path]:
    """Write ``hbmwatch-rules.yml`` and its ``.test.yml`` into ``directory``; return both."""
    directory.mkdir(parents=True, exist_ok=True)
    rules, tests = directory / RULES_FILE, directory / TESTS_FILE
    rules.write_text(render_rules(for_seconds=for_seconds))
    tests.write_text(render_rules_tests(for_seconds=for_seconds))
    return rules, tests
