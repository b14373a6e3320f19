"""Series listing, range queries and latest values: the store's read path over HTTP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from hbmwatch.api.deps import ScopeRead, SettingsDep, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES
from hbmwatch.api.params import Cursor, Limit, TimeParam, page, parse_step, parse_time
from hbmwatch.api.schemas import (
    LatestResult,
    LatestSeries,
    Page,
    RangeResult,
    RangeSeries,
    SeriesOut,
    finite,
)
from hbmwatch.query import Aggregation, check_time_budget, parse_selector, time_budget
from hbmwatch.validation import InvalidQuery

router = APIRouter(prefix="/api/v1", tags=["series"], responses=ERROR_RESPONSES)

#: At most this many series are listed in one call, however the pages fall.
MAX_SERIES_LISTED = 10_000
DEFAULT_RANGE_SECONDS = 3600.0

SelectorParam = Annotated[
    str,
    Query(
        min_length=1,
        max_length=4000,
        description='A selector: metric{label="v",...}; simple values need no quotes '
        "(host=n1). Regexes are RE2, anchored at both ends.",
        examples=['gpu_memory_temperature_celsius{host="node7",gpu="3"}'],
    ),
]


@router.get("/series", response_model=Page[SeriesOut])
def list_series(
    store: StoreDep,
    settings: SettingsDep,
    _: ScopeRead,
    match: SelectorParam,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[SeriesOut]:
    """Series that match a selector, in the order the store registered them."""
    with time_budget(settings.api.query_timeout_seconds):
        keys = store.series(parse_selector(match), limit=MAX_SERIES_LISTED)
    return page([SeriesOut.of(k) for k in keys], limit, cursor)


@router.get("/query_range", response_model=RangeResult)
def query_range(
    store: StoreDep,
    settings: SettingsDep,
    _: ScopeRead,
    query: SelectorParam,
    start: TimeParam = None,
    end: TimeParam = None,
    step: Annotated[str, Query(max_length=20, description="Seconds or a duration: 60, 1m.")] = "60",
    agg: Annotated[
        Aggregation, Query(description="How samples in a step combine.")
    ] = Aggregation.AVG,
    q: Annotated[float | None, Query(ge=0, le=1, description="For agg=quantile.")] = None,
    fn: Annotated[
        str | None,
        Query(
            pattern="^(rate|increase)$", description="For counters: per-second rate or increase."
        ),
    ] = None,
) -> RangeResult:
    """One value per step for each matching series; rollups serve steps of whole minutes.

    Over a budget (series, points, time: ``api.query_timeout_seconds``) the answer is a 400
    ``query_too_expensive`` naming the limit.
    """
    end_s = parse_time("end", end, store.now_ms() / 1000)
    start_s = parse_time("start", start, end_s - DEFAULT_RANGE_SECONDS)
    step_s = parse_step(step)
    selector = parse_selector(query)
    with time_budget(settings.api.query_timeout_seconds):
        if fn is not None:
            result = store.counter_query(selector, start_s, end_s, step_s, fn)
        else:
            result = store.range_query(selector, start_s, end_s, step_s, agg, q)
        series = []
        for sp in result.series:
            check_time_budget()
            series.append(RangeSeries.of_points(sp))
    return RangeResult(tier=result.tier, step=step_s, warnings=list(result.warnings), series=series)


@router.get("/query", response_model=LatestResult)
def query_latest(
    store: StoreDep,
    settings: SettingsDep,
    _: ScopeRead,
    query: SelectorParam,
    lookback: Annotated[str, Query(max_length=20, description="Seconds or a duration.")] = "5m",
) -> LatestResult:
    """The newest sample of each matching series within the lookback; stale ones are left out."""
    seconds = parse_step(lookback)
    if seconds > 7 * 86400:
        raise InvalidQuery("lookback is at most 7 days", parameter="lookback")
    with time_budget(settings.api.query_timeout_seconds):
        latest = store.latest(parse_selector(query), lookback=seconds)
    return LatestResult(
        series=[
            LatestSeries(
                metric=v.series.metric,
                labels=v.series.label_dict,
                timestamp=v.timestamp,
                value=finite(v.value),
            )
            for v in latest
        ]
    )
