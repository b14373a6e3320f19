"""Federation: the newest sample of stored canonical series, in Prometheus' text format.

A Prometheus that scrapes ``/federate?match[]=...`` (``honor_labels: true``) then holds the
device series under their canonical names, as it would from another Prometheus' federation
endpoint: the newest sample of every matching series within the 5-minute lookback, with its
timestamp in ms, ``# TYPE`` from the canonical model (``hbmwatch.metrics``), labels sorted.

The answer is all or nothing: past ``api.federate_max_series`` series it is refused
(``FederationTooLarge``), never cut short, since a cut page would look complete to a scraper.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import promql_parser as pp

from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.metrics import METRICS, MetricDef, Scope
from hbmwatch.promql.engine import matchers_of
from hbmwatch.promql.errors import QueryError
from hbmwatch.query import check_time_budget
from hbmwatch.records import SeriesKey
from hbmwatch.store.registry import NAME_LABEL
from hbmwatch.store.store import LatestValue, Store
from hbmwatch.validation import HbmwatchError, InvalidQuery

#: Prometheus' default lookback: a series with nothing newer is stale and left out.
LOOKBACK_SECONDS = 300.0
#: The exposition format served (Prometheus' text format, as its own /federate serves).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SETTING = "api.federate_max_series"


class FederationTooLarge(HbmwatchError):
    """More series match than ``api.federate_max_series`` allows in one answer."""


def parse_match(text: str) -> list[Matcher]:
    """One ``match[]`` value, a series selector as Prometheus parses it (promql-parser):
    ``name{...}`` or ``{__name__=~"...",...}``, with at least one matcher that does not
    match the empty string; no offset, ``@`` or range.

    >>> [str(m) for m in parse_match("{__name__=~'gpu_power_.*', host='n1'}")]
    ['__name__=~"gpu_power_.*"', 'host="n1"']
    >>> parse_match('{host=""}')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    hbmwatch.validation.InvalidQuery: ...at least one non-empty matcher
    """
    try:
        node = pp.parse(text)
    except ValueError as exc:
        raise InvalidQuery(f"cannot parse match[] {text[:200]!r}: {exc}") from None
    if not isinstance(node, pp.VectorSelector) or node.offset or node.at:
        raise InvalidQuery(f"match[] {text[:200]!r} is not a series selector")
    try:
        return matchers_of(node)
    except QueryError as exc:
        raise InvalidQuery(f"match[] {text[:200]!r}: {exc}") from None


def select(
    store: Store, selectors: Iterable[Sequence[Matcher]], cap: int
) -> list[tuple[int, SeriesKey]]:
    """The union of the series the selectors match, refused past ``cap``."""
    found: dict[int, SeriesKey] = {}
    for matchers in selectors:
        for sid, key in store.select_matching(matchers):
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
    selectors = [parse_match(text) for text in matches]
    return render(store.latest_of(select(store, selectors, cap), LOOKBACK_SECONDS))


def canonical(store: Store, cap: int) -> str:
    """Every stored device and workload series (not the collector's own, which ``/metrics``
    serves already), for ``api.expose_canonical_series``."""
    selectors = [
        [Matcher(NAME_LABEL, MatchOp.EQ, m.name)]
        for m in METRICS.values()
        if m.scope is not Scope.COLLECTOR
    ]
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
