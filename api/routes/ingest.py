"""Push ingest: sample batches, raw request latencies and training step times.

The payloads are checked field by field (a 422 names the field); each sample is then judged
by the store like a scraped one, and what it refused comes back counted by reason, so a
client sees exactly what was lost.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from hbmwatch.api.deps import ScopeWrite, StoreDep
from hbmwatch.api.errors import ERROR_RESPONSES
from hbmwatch.api.schemas import IngestResult
from hbmwatch.collector.sources.push import (
    LatencyWindow,
    SampleBatch,
    StepTimes,
    samples_from_batch,
    samples_from_latencies,
    samples_from_steps,
)
from hbmwatch.collector.translate import Collected
from hbmwatch.store.store import Store
from hbmwatch.validation import InvalidQuery

router = APIRouter(prefix="/api/v1/ingest", tags=["ingest"], responses=ERROR_RESPONSES)


def _write(store: Store, collected: Collected, received: int) -> IngestResult:
    result = store.write(collected.samples)
    rejected = dict(result.rejected)
    for reason, n in collected.dropped.items():
        rejected[reason] = rejected.get(reason, 0) + n
    return IngestResult(
        received=received,
        accepted=result.accepted,
        duplicates=result.duplicates,
        rejected=rejected,
        errors=[*collected.errors, *result.errors][:10],
    )


@router.post("/samples", response_model=IngestResult)
def ingest_samples(store: StoreDep, _: ScopeWrite, batch: SampleBatch) -> IngestResult:
    """Canonical samples (metric, labels, timestamp, value), up to 100,000 a request."""
    return _write(store, samples_from_batch(batch), len(batch.samples))


@router.post("/latencies", response_model=IngestResult)
def ingest_latencies(store: StoreDep, _: ScopeWrite, window: LatencyWindow) -> IngestResult:
    """One window of raw request latencies: stored as exact quantiles and a request count."""
    return _write_window(store, lambda: samples_from_latencies(window))


@router.post("/steps", response_model=IngestResult)
def ingest_steps(store: StoreDep, _: ScopeWrite, steps: StepTimes) -> IngestResult:
    """One window of training step times, stored like latencies with phase=step."""
    return _write_window(store, lambda: samples_from_steps(steps))


def _write_window(store: Store, convert: Callable[[], Collected]) -> IngestResult:
    try:
        collected = convert()
    except ValueError as exc:
        raise InvalidQuery(f"window_end: {exc}", parameter="window_end") from None
    return _write(store, collected, len(collected.samples))
