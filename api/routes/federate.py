"""``/federate``: canonical device series for a Prometheus that scrapes hbmwatch.

Errors are one line of plain text, as Prometheus' own ``/federate`` answers them (a scraper
shows the status and the body, not a JSON envelope): 400 for a bad ``match[]``, 422 past
``api.federate_max_series``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import PlainTextResponse

from hbmwatch.api import federation
from hbmwatch.api.deps import ScopeRead, SettingsDep, StoreDep
from hbmwatch.query import time_budget
from hbmwatch.validation import HbmwatchError, QueryTooExpensive

router = APIRouter(tags=["metrics"])

MatchParam = Annotated[
    list[str],
    Query(
        alias="match[]",
        description='Series selectors, as Prometheus takes them: gpu_power_watts{host="n1"} '
        'or {__name__=~"gpu_.*"}. Repeat for several; the union is served.',
        examples=['{__name__=~"gpu_.*"}'],
    ),
]


@router.get(
    "/federate",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Exposition text (format 0.0.4)."},
        400: {"content": {"text/plain": {}}, "description": "A match[] cannot be parsed."},
        422: {"content": {"text/plain": {}}, "description": "Over api.federate_max_series."},
    },
)
def federate(
    store: StoreDep,
    settings: SettingsDep,
    _: ScopeRead,
    match: MatchParam = [],  # noqa: B006 (FastAPI copies the default)
) -> Response:
    """The newest sample (5-minute lookback) of every stored series any ``match[]`` selects,
    under its canonical name, with its timestamp; ``# TYPE`` from the canonical model."""
    if not match:
        return _error(400, 'no match[] given: add match[]={__name__=~"gpu_.*"} or a selector')
    try:
        with time_budget(settings.api.query_timeout_seconds):
            text = federation.federate(store, match, settings.api.federate_max_series)
    except federation.FederationTooLarge as exc:
        return _error(422, str(exc))
    except QueryTooExpensive as exc:
        return _error(422, str(exc))
    except HbmwatchError as exc:
        return _error(400, str(exc))
    return Response(text, media_type=federation.CONTENT_TYPE)


def _error(status: int, message: str) -> PlainTextResponse:
    return PlainTextResponse(" ".join(message.split()) + "\n", status_code=status)
