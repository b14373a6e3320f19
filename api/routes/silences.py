"""Silences: mute alerts matching labels for a while; mirrored to Alertmanager by delivery."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from hbmwatch.api.deps import AlertingDep, ScopeRead, ScopeWrite, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES, not_found
from hbmwatch.api.params import parse_time
from hbmwatch.api.schemas import SilenceIn, SilenceOut
from hbmwatch.records import Matcher
from hbmwatch.validation import InvalidQuery, parse_duration

router = APIRouter(prefix="/api/v1", tags=["silences"], responses=ERROR_RESPONSES)

MAX_SILENCE_SECONDS = 30 * 86400


@router.get("/silences", response_model=list[SilenceOut])
def list_silences(
    store: StoreDep,
    _: ScopeRead,
    expired: Annotated[bool, Query(description="Include silences that ended.")] = False,
) -> list[SilenceOut]:
    now = store.now_ms()
    found = store.alerts.silences(ends_after_ms=None if expired else now + 1)
    return [SilenceOut.of(s, now) for s in found]


@router.post("/silences", response_model=SilenceOut, status_code=status.HTTP_201_CREATED)
def create_silence(_: ScopeWrite, alerting: AlertingDep, body: SilenceIn) -> SilenceOut:
    """Mute matching alerts from starts_at (default now) to ends_at or for duration."""
    now_s = alerting.store.now_ms() / 1000
    starts = parse_time("starts_at", _text(body.starts_at), now_s)
    if (body.ends_at is None) == (body.duration is None):
        raise InvalidQuery("give exactly one of ends_at and duration", parameter="ends_at")
    if body.duration is not None:
        try:
            ends = max(starts, now_s) + parse_duration(body.duration)
        except ValueError as exc:
            raise InvalidQuery(f"duration: {exc}", parameter="duration") from None
    else:
        ends = parse_time("ends_at", _text(body.ends_at), 0)
    if ends - max(starts, now_s) > MAX_SILENCE_SECONDS:
        raise InvalidQuery("a silence lasts at most 30 days", parameter="ends_at")
    matchers = [Matcher(m.name, m.value, m.op) for m in body.matchers]
    try:
        silence = alerting.add_silence(
            matchers,
            starts_ms=int(starts * 1000),
            ends_ms=int(ends * 1000),
            created_by=body.created_by,
            comment=body.comment,
        )
    except ValueError as exc:
        raise InvalidQuery(str(exc)) from None
    return SilenceOut.of(silence, alerting.store.now_ms())


@router.delete("/silences/{silence_id}", response_model=SilenceOut)
def expire_silence(
    _: ScopeWrite,
    alerting: AlertingDep,
    silence_id: Annotated[str, Path(max_length=100)],
) -> SilenceOut:
    """End a silence now; it stays listed with ``expired=true``."""
    silence = alerting.expire_silence(silence_id)
    if silence is None:
        raise not_found("silence", silence_id)
    return SilenceOut.of(silence, alerting.store.now_ms())


def _text(value: float | str | None) -> str | None:
    return None if value is None else str(value)
