"""Federation: the newest sample of stored canonical series, in Prometheus' text format.

A Prometheus that scrapes ``/federate?match[]=...`` (``honor_labels: true``) then holds the
device series under their canonical names, as it would from another Prometheus' federation
endpoint: the newest sample of every matching series within the 5-minute lookback, with its
timestamp in ms, ``# TYPE`` from the canonical model (``hbmwatch.metrics``), labels sorted.

The answer is all or nothing: past ``api.federate_max_series`` series it is refused
(``FederationTooLarge``), never cut short, since a cut page would look complete to a scraper.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hbmwatch.matchers import NAME_LABEL, Matcher, MatchOp, parse_matchers
from hbmwatch.metrics import METRICS, MetricDef, Scope
from hbmwatch.query import Selector, check_time_budget
from hbmwatch.records import SeriesKey
from hbmwatch.store.store import LatestValue, Store
from hbmwatch.validation import HbmwatchError, InvalidQuery, check_metric_name

#: Prometheus' default lookback: a series with nothing newer is stale and left out.
LOOKBACK_SECONDS = 300.0
#: The exposition format served (Prometheus' text format, as its own /federate serves).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SETTING = "api.federate_max_series"

_SELECTOR_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(.*)\})?\s*$", re.S)


class FederationTooLarge(HbmwatchError):
    """More series match than ``api.federate_max_series`` allows in one answer."""


def parse_match(text: str) -> list[Selector]:
    """One ``match[]`` value (``name{...}`` or ``{__name__=~"...",...}``) as one selector per
    canonical metric whose name it matches.

    >>> [s.metric for s in parse_match('{__name__=~"gpu_power_.*"}')]
    ['gpu_power_watts', 'gpu_power_limit_watts']
    >>> parse_match('{host=""}')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    hbmwatch.validation.InvalidQuery: ...at least one matcher that does not match the empty...
    """
    match = _SELECTOR_RE.match(text)
    if not match or not (match.group(1) or match.group(2) is not None):
        raise InvalidQuery(f"cannot parse match[] {text[:200]!r}: expected a series selector")
    name, body = match.group(1), match.group(2) or ""
    matchers = parse_matchers(body, name_label=True)
    if name:
        check_metric_name(name)
        matchers.insert(0, Matcher.of(NAME_LABEL, MatchOp.EQ.value, name, name_label=True))
    if not any(not m.matches("") for m in matchers):
        raise InvalidQuery(
            f"match[] {text[:200]!r} needs at least one matcher that does not match the empty "
            "string (Prometheus' rule: a selector may not select every series)"
        )
    by_name = [m for m in matchers if m.label == NAME_LABEL]
    rest = tuple(m for m in matchers if m.label != NAME_LABEL)
    return [Selector(metric, rest) for metric in METRICS if all(m.matches(metric) for m in by_name)]


def select(store: Store, selectors: Iterable[Selector], cap: int) -> list[tuple[int, SeriesKey]]:
    """The union of the series the selectors match, refused past ``cap``."""
    found: dict[int, SeriesKey] = {}
    for selector in selectors:
        for sid, key in store.select_series(selector):
            found[sid] = key
        if len(found) > cap:
            raise FederationTooLarge(
                f"the match[] selectors match more than {cap} series, over the limit "
                f"({SETTING}); narrow them or raise {SETTING}",
                limit=SETTING,
            )
    return sorted(found.items(), key=lambda item: (item[1].metric, item[1].text))


def federate(store: Store, matches: Iterable[str], cap: int) -> str:
    """The exposition text for ``/federate``: every ``match[]`` parsed first, then read."""
    selectors = [s for text in matches for s in parse_match(text)]
    return render(store.latest_of(select(store, selectors, cap), LOOKBACK_SECONDS))


def canonical(store: Store, cap: int) -> str:
    """Every stored device and workload series (not the collector's own, which ``/metrics``
    serves already), for ``api.expose_canonical_series``."""
    selectors = [Selector(m.name) for m in METRICS.values() if m.scope is not Scope.COLLECTOR]
    return render(store.latest_of(select(store, selectors, cap), LOOKBACK_SECONDS))


def render(values: Iterable[LatestValue]) -> str:
    """Text format 0.0.4: ``# HELP`` and ``# TYPE`` once per family, then its samples with
    their timestamps (ms); values are grouped by metric as ``select`` sorted them."""
    lines: list[str] = []
    family = None
    for value in values:
        check_time_budget()
        key = value.series
        if key.metric != family:
            family = key.metric
            lines.extend(_header(METRICS[family]))
        labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in key.labels)
        body = f"{key.metric}{{{labels}}}" if labels else key.metric
        lines.append(f"{body} {format_value(value.value)} {round(value.timestamp * 1000)}")
    return "".join(f"{line}\n" for line in lines)


def _header(definition: MetricDef) -> tuple[str, str]:
    help_text = definition.help.replace("\\", "\\\\").replace("\n", "\\n")
    return (
        f"# HELP {definition.name} {help_text}",
        f"# TYPE {definition.name} {definition.type.value}",
    )


def escape_label_value(value: str) -> str:
    """Backslash, double quote and newline escaped, as the text format wants."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """Go's spelling of special values (``+Inf``, ``-Inf``, ``NaN``); shortest round-trip
    digits otherwise."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
