"""Query-parameter parsing shared by the routes: times, steps, pages.

Times are unix seconds or RFC 3339; steps are seconds or durations (``60``, ``1m``).  A bad
value raises ``InvalidQuery`` naming the parameter, which the error handler turns into a 400.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, TypeVar

from fastapi import Query

from hbmwatch.api.schemas import Page
from hbmwatch.collector.sources.push import to_ms
from hbmwatch.validation import InvalidQuery, parse_duration

T = TypeVar("T")

DEFAULT_PAGE = 100
MAX_PAGE = 1000

Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]
Cursor = Annotated[
    str | None, Query(max_length=20, description="`next_cursor` of the previous page.")
]
TimeParam = Annotated[
    str | None,
    Query(
        max_length=40, description="Unix seconds or RFC 3339.", examples=["2027-01-15T08:00:00Z"]
    ),
]


def parse_time(name: str, value: str | None, default: float) -> float:
    """Unix seconds from a query parameter, ``default`` when it is absent."""
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        try:
            return to_ms(value) / 1000
        except ValueError as exc:
            raise InvalidQuery(f"{name}: {exc}", parameter=name) from None
    if not math.isfinite(number) or not 0 <= number < 1e11:
        raise InvalidQuery(f"{name}: {value!r} is not a time in unix seconds", parameter=name)
    return number


def parse_step(value: str) -> float:
    try:
        step = parse_duration(float(value) if _is_number(value) else value)
    except ValueError as exc:
        raise InvalidQuery(f"step: {exc}", parameter="step") from None
    if not math.isfinite(step) or step <= 0:
        raise InvalidQuery("step must be a positive number of seconds", parameter="step")
    return step


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def page(items: Sequence[T], limit: int, cursor: str | None) -> Page[T]:
    """One page of an ordered list; the cursor is the offset of the next item."""
    offset = 0
    if cursor:
        if not (cursor.isascii() and cursor.isdigit()):  # '²' is a digit int() refuses
            raise InvalidQuery("cursor: not a cursor this API gave out", parameter="cursor")
        offset = int(cursor)
    end = offset + limit
    return Page[T](
        items=list(items[offset:end]), next_cursor=str(end) if end < len(items) else None
    )
