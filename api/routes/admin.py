"""Admin calls: store maintenance on demand (it also runs on its own schedule)."""

from __future__ import annotations

from fastapi import APIRouter

from hbmwatch.api.deps import ScopeAdmin, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES
from hbmwatch.api.schemas import CompactionOut

router = APIRouter(prefix="/api/v1/admin", tags=["admin"], responses=ERROR_RESPONSES)


@router.post("/compact", response_model=CompactionOut)
def compact(store: StoreDep, _: ScopeAdmin) -> CompactionOut:
    """Compact every closed minute into chunks and rollups now, and re-pack closed hours."""
    report = store.compact()
    return CompactionOut(
        minutes=report.minutes,
        samples=report.samples,
        chunks=report.chunks,
        merged=report.merged,
        hours=report.hours,
    )
