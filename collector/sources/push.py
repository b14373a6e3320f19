"""Push ingest: what clients send instead of being scraped, as canonical samples.

Three payloads (the API exposes them): sample batches in the canonical model, raw request
latencies of one service and window (exact quantiles: resolution 0), and training step
times.  Validation names the field and the problem; the store then judges each sample
(unknown metrics, labels, NaN, clock skew) as it judges scraped ones.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hbmwatch.collector.translate import Collected
from hbmwatch.metrics import QUANTILES
from hbmwatch.records import Sample, SeriesKey

MAX_SAMPLES_PER_BATCH = 100_000
MAX_LATENCIES_PER_WINDOW = 1_000_000
#: Unix seconds past this (the year 5138) are a unit mistake, not a time.
MAX_UNIX_SECONDS = 1e11


def to_ms(value: float | str | dt.datetime) -> int:
    """Unix seconds, an RFC 3339 string or a datetime -> milliseconds.

    >>> to_ms(1_800_000_000.5), to_ms("2027-01-15T08:00:00Z")
    (1800000000500, 1800000000000)
    """
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is neither unix seconds nor RFC 3339") from None
        if parsed.tzinfo is None:
            raise ValueError(f"{value!r} has no time zone; use Z or an offset")
        return int(parsed.timestamp() * 1000)
    if not math.isfinite(value) or abs(value) > MAX_UNIX_SECONDS:
        raise ValueError(f"{value!r} is not a unix time in seconds")
    return int(value * 1000)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PushedSample(_Strict):
    metric: str = Field(examples=["gpu_memory_temperature_celsius"])
    labels: dict[str, str] = Field(examples=[{"host": "node7", "gpu": "3"}])
    timestamp: float | str = Field(description="Unix seconds or RFC 3339", examples=[1800000000.0])
    value: float


class SampleBatch(_Strict):
    samples: list[PushedSample] = Field(max_length=MAX_SAMPLES_PER_BATCH)


class Placement(_Strict):
    service: str = Field(min_length=1, examples=["chat-70b"])
    model: str = ""
    cluster: str = ""
    rack: str = ""
    host: str = ""
    gpu: str = ""
    partition: str = ""


class LatencyWindow(Placement):
    """Raw latencies of one window (a client's own measurements, e.g. a load generator)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "service": "chat-70b", "host": "node7", "gpu": "3", "phase": "e2e",
            "window_end": "2027-01-15T08:00:00Z", "latencies_seconds": [0.21, 0.25, 1.9],
        }]},
    )  # fmt: skip

    phase: str = Field("e2e", pattern="^(ttft|inter_token|e2e)$")
    window_end: float | str = Field(description="Unix seconds or RFC 3339")
    latencies_seconds: list[float] = Field(min_length=1, max_length=MAX_LATENCIES_PER_WINDOW)

    @field_validator("latencies_seconds")
    @classmethod
    def _non_negative(cls, values: list[float]) -> list[float]:
        bad = [v for v in values if not math.isfinite(v) or v < 0]
        if bad:
            raise ValueError(f"{len(bad)} latencies are negative or not finite (first: {bad[0]})")
        return values


class StepTimes(Placement):
    """Training step times of one window."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "service": "pretrain-405b", "host": "node7", "window_end": 1800000000,
            "step_seconds": [4.1, 4.0, 4.3],
        }]},
    )  # fmt: skip

    window_end: float | str
    step_seconds: list[float] = Field(min_length=1, max_length=MAX_LATENCIES_PER_WINDOW)

    @field_validator("step_seconds")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        if any(not math.isfinite(v) or v <= 0 for v in values):
            raise ValueError("step times must be positive and finite")
        return values


def samples_from_batch(batch: SampleBatch) -> Collected:
    out = Collected()
    for i, s in enumerate(batch.samples):
        try:
            ts = to_ms(s.timestamp)
        except ValueError as exc:
            out.drop("malformed", why=f"samples[{i}].timestamp: {exc}")
            continue
        out.samples.append(Sample(SeriesKey(s.metric, s.labels), ts, s.value))
    return out


def _quantiles(out: Collected, base: dict[str, str], values: np.ndarray, ts_ms: int) -> None:
    out.add(SeriesKey("workload_window_requests", base), ts_ms, float(len(values)))
    for q in QUANTILES:
        labelled = {**base, "quantile": q}
        out.add(
            SeriesKey("workload_latency_seconds", labelled),
            ts_ms,
            float(np.quantile(values, float(q))),
        )
        out.add(SeriesKey("workload_latency_resolution_seconds", labelled), ts_ms, 0.0)


def _base(p: Placement, phase: str) -> dict[str, str]:
    fields = ("service", "model", "cluster", "rack", "host", "gpu", "partition")
    labels = {f: getattr(p, f) for f in fields if getattr(p, f)}
    return {**labels, "phase": phase}


def samples_from_latencies(window: LatencyWindow) -> Collected:
    out = Collected()
    _quantiles(
        out,
        _base(window, window.phase),
        np.asarray(window.latencies_seconds),
        to_ms(window.window_end),
    )
    return out


def samples_from_steps(steps: StepTimes) -> Collected:
    out = Collected()
    _quantiles(out, _base(steps, "step"), np.asarray(steps.step_seconds), to_ms(steps.window_end))
    return out
