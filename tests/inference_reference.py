"""The inference translator as it was before plans were memoised (issue 17), kept verbatim as
the reference the memoised one must agree with, sample for sample (tests/test_inference_plan.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hbmwatch.collector.exposition import ParsedPage, SeriesCache, parse
from hbmwatch.collector.spellings import vllm as spelling
from hbmwatch.collector.translate import Collected
from hbmwatch.metrics import QUANTILES
from hbmwatch.records import SeriesKey

PLACEMENT = ("cluster", "rack", "host", "gpu", "partition")
COUNTED_PHASES = ("e2e", "step")


def histogram_quantile(q: float, uppers: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """Quantile and the width of its bucket, from per-bucket (not cumulative) counts.

    ``uppers`` are the buckets' upper bounds, the last one +Inf.  Inside a bucket the
    quantile is interpolated linearly; in the +Inf bucket it is the highest finite bound,
    and the width is unbounded (reported as that bound).

    >>> up = np.array([0.1, 0.5, 1.0, np.inf])
    >>> histogram_quantile(0.5, up, np.array([0, 10, 10, 0]))
    (0.5, 0.4)
    >>> histogram_quantile(0.99, up, np.array([0, 0, 0, 5]))
    (1.0, 1.0)
    """
    total = counts.sum()
    rank = q * total
    cumulative = np.cumsum(counts)
    i = int(np.searchsorted(cumulative, rank, side="left"))
    i = min(i, len(uppers) - 1)
    lower = uppers[i - 1] if i > 0 else 0.0
    upper = uppers[i]
    if math.isinf(upper):
        finite = float(uppers[-2]) if len(uppers) > 1 else 0.0
        return finite, finite
    before = cumulative[i - 1] if i > 0 else 0.0
    inside = counts[i]
    fraction = (rank - before) / inside if inside > 0 else 1.0
    return float(lower + (upper - lower) * fraction), float(upper - lower)


@dataclass
class _Snapshot:
    ts_ms: int
    buckets: np.ndarray
    count: float


class InferenceTranslator:
    """One inference (or training) target: its histograms' recent snapshots."""

    kind = "vllm"

    def __init__(
        self,
        static_labels: Mapping[str, str] | None = None,
        *,
        window_seconds: float = 60.0,
        phases: Mapping[str, str] | None = None,
        label_map: Mapping[str, str] | None = None,
        series_cap: int = 200_000,
    ) -> None:
        self.static = dict(static_labels or {})
        self.window_ms = int(window_seconds * 1000)
        self.phases = {**spelling.PHASE_OF, **(phases or {})}
        self.label_map = dict(label_map or {})  # canonical <- page label, for mapped targets
        self._history: dict[tuple, deque[_Snapshot]] = {}
        self._series = SeriesCache(series_cap)

    def _base(self, labels: Mapping[str, str], phase: str) -> dict[str, str] | None:
        labels = {**labels, **{c: labels[p] for c, p in self.label_map.items() if p in labels}}
        model = next((labels[k] for k in spelling.MODEL_LABELS if labels.get(k)), "")
        service = self.static.get("service") or labels.get("service") or labels.get("job") or model
        if not service:
            return None
        base = {k: self.static.get(k) or labels.get(k, "") for k in PLACEMENT}
        base = {k: v for k, v in base.items() if v}
        base.update(service=service, phase=phase)
        if model:
            base["model"] = model
        return base

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        return self.translate(parse(text, self._series), ts_ms)

    def clear(self) -> None:
        self._series.clear()

    def translate(self, page: ParsedPage, ts_ms: int) -> Collected:
        out = Collected()
        if page.malformed:
            out.drop("malformed", page.malformed, "; ".join(page.first_errors))
        if page.series_capped:
            out.drop("series_cap", page.series_capped)
        histograms: dict[tuple, dict] = {}
        for sample in page.samples:
            name = sample.series.name
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix) and name[: -len(suffix)] in self.phases:
                    family = name[: -len(suffix)]
                    break
            else:
                if name in spelling.TRITON_SUMMARIES:
                    self._summary(out, sample, ts_ms)
                continue
            labels = sample.series.label_dict()
            le = labels.pop("le", None)
            entry = histograms.setdefault(
                (family, tuple(sorted(labels.items()))), {"buckets": {}, "count": None}
            )
            if suffix == "_bucket":
                if le is None:
                    out.drop("malformed")
                    continue
                try:
                    entry["buckets"][float(le)] = sample.value
                except ValueError:
                    out.drop("malformed")
            elif suffix == "_count":
                entry["count"] = sample.value
        for (family, labels), entry in histograms.items():
            self._window(out, family, dict(labels), entry, ts_ms)
        return out

    def _summary(self, out: Collected, sample, ts_ms: int) -> None:  # type: ignore[no-untyped-def]
        labels = sample.series.label_dict()
        q = labels.pop("quantile", None)
        phase = spelling.TRITON_SUMMARIES[sample.series.name]
        base = self._base(labels, phase)
        if base is None or q is None:
            out.drop("no_device")
            return
        try:
            wanted = float(q)
        except ValueError:
            out.drop("malformed", why=f"{sample.series.name}: quantile {q[:40]!r}")
            return
        canonical = next((c for c in QUANTILES if float(c) == wanted), None)
        if canonical is None:
            return
        out.add(
            SeriesKey("workload_latency_seconds", {**base, "quantile": canonical}),
            ts_ms,
            sample.value * 1e-6,
        )
        out.add(
            SeriesKey("workload_latency_resolution_seconds", {**base, "quantile": canonical}),
            ts_ms,
            0.0,
        )

    def _window(
        self, out: Collected, family: str, labels: dict[str, str], entry: dict, ts_ms: int
    ) -> None:
        phase = self.phases[family]
        base = self._base(labels, phase)
        if base is None:
            out.drop("no_device")
            return
        edges = sorted(entry["buckets"])
        if not edges or not math.isinf(edges[-1]):
            out.drop("malformed", why=f"{family}: histogram without a +Inf bucket")
            return
        cumulative = np.array([entry["buckets"][e] for e in edges])
        count = entry["count"] if entry["count"] is not None else cumulative[-1]
        if phase in COUNTED_PHASES:
            out.add(SeriesKey("workload_requests_total", base), ts_ms, count)
        key = (family, tuple(sorted(labels.items())))
        history = self._history.setdefault(key, deque())
        if history and (
            count < history[-1].count
            or len(history[-1].buckets) != len(edges)
            or (cumulative < history[-1].buckets).any()
        ):
            history.clear()  # the server restarted: its counters began again
        horizon = ts_ms - self.window_ms
        while len(history) >= 2 and history[1].ts_ms <= horizon:
            history.popleft()
        history.append(_Snapshot(ts_ms, cumulative, count))
        if len(history) < 2:
            return
        start = history[0]
        per_bucket = np.diff(np.r_[0.0, cumulative - start.buckets])
        in_window = float(per_bucket.sum())
        out.add(SeriesKey("workload_window_requests", base), ts_ms, in_window)
        if in_window <= 0:
            return
        uppers = np.array(edges)
        for q in QUANTILES:
            value, width = histogram_quantile(float(q), uppers, per_bucket)
            labelled = {**base, "quantile": q}
            out.add(SeriesKey("workload_latency_seconds", labelled), ts_ms, value)
            out.add(SeriesKey("workload_latency_resolution_seconds", labelled), ts_ms, width)
