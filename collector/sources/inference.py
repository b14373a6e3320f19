"""Inference servers' histograms -> per-window latency quantiles and request counts.

vLLM, SGLang and TGI export cumulative histograms; training jobs export step times the
same way.  Each scrape, hbmwatch takes the bucket counts of the last ``window`` seconds
(now minus the snapshot that old) and interpolates p50, p95 and p99 inside the bucket
they fall in, as Prometheus' ``histogram_quantile`` does.  It also records how wide that
bucket was (``workload_latency_resolution_seconds``: vLLM's end-to-end buckets jump from
60 to 120 s) and how many observations the window held (``workload_window_requests``), so a
detector can tell a p99 of three requests from a p99 of three thousand.  Triton's opt-in
summaries already hold quantiles and pass through.  Phases stay apart.

A server shows the same series scrape after scrape; only the values change.  So what a
page's lines become (which histogram, which bucket, which output series) is worked out once
per page shape, as a ``_Plan``, and kept while the page's series (the text before each
value) stay the same: a scrape then only converts the values and does the window
arithmetic, in plain Python (numpy's per-call overhead on 20 buckets cost more).  A page of
a new shape (a new label value, a series gone, another server) gets a new plan; a page with
malformed or capped lines is translated without one.  tests/test_inference_plan.py checks
the plans against the translator as it was before them.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any

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
    and the width is unbounded (reported as that bound).  The translator uses it for
    windows whose counts are not finite; finite ones take ``_quantile``, its plain twin.

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


def _quantile(
    q: float,
    uppers: Sequence[float],
    counts: Sequence[float],
    cumulative: Sequence[float],
    total: float,
) -> tuple[float, float]:
    """``histogram_quantile`` for finite counts, on lists, with the sums already taken."""
    rank = q * total
    i = min(bisect_left(cumulative, rank), len(uppers) - 1)
    upper = uppers[i]
    if math.isinf(upper):
        finite = uppers[-2] if len(uppers) > 1 else 0.0
        return finite, finite
    lower = uppers[i - 1] if i > 0 else 0.0
    before = cumulative[i - 1] if i > 0 else 0.0
    inside = counts[i]
    fraction = (rank - before) / inside if inside > 0 else 1.0
    return lower + (upper - lower) * fraction, upper - lower


def _numpy_sum(xs: list[float]) -> float:
    """``np.sum`` of floats, added in numpy's order (blocks of up to 128 in eight running
    sums, then pairs), so the plain-Python window gives the very bits the numpy one gave."""
    n = len(xs)
    if n > 128:
        half = n // 2
        half -= half % 8
        return _numpy_sum(xs[:half]) + _numpy_sum(xs[half:])
    if n < 8:
        total = 0.0
        for x in xs:
            total += x
        return total
    r = xs[:8]
    stop = n - n % 8
    for i in range(8, stop, 8):
        r = list(map(operator.add, r, xs[i : i + 8]))
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(stop, n):
        total += xs[i]
    return total


def _picker(lines: list[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """What takes the ``lines`` (bucket counts, sample lines) out of a list, in one C call."""
    if not lines:
        return lambda values: ()
    if len(lines) == 1:
        return lambda values: (values[lines[0]],)
    return operator.itemgetter(*lines)  # type: ignore[return-value]


@dataclass(slots=True)
class _Snapshot:
    ts_ms: int
    buckets: tuple[float, ...]
    count: float


@dataclass(slots=True)
class _Window:
    """One histogram of a page: where its values are, and the series it becomes."""

    buckets_of: Callable[[list[float]], tuple[float, ...]]  # a page's values -> bucket counts
    count_line: int | None
    uppers: list[float]
    history: deque[_Snapshot]
    requests: SeriesKey | None  # workload_requests_total, for counted phases
    window: SeriesKey
    quantiles: list[tuple[float, SeriesKey, SeriesKey]]  # q, latency, resolution


@dataclass(slots=True)
class _Summary:
    """A Triton summary line that passes through as a quantile."""

    line: int
    latency: SeriesKey
    resolution: SeriesKey


@dataclass(slots=True)
class _Drop:
    """What a page's shape alone drops, every scrape."""

    reason: str
    why: str | None = None


_Step = _Window | _Summary | _Drop


_HEAD, _TAIL = operator.itemgetter(0), operator.itemgetter(2)


def _is_sample(line: str) -> bool:
    """Whether the parser reads the line as a sample (it strips lines and skips comments)."""
    line = line.strip()
    return bool(line) and line[0] != "#"


def _same(page: ParsedPage, heads: list[str], lines: list[int]) -> bool:
    """Whether the page's samples are the ``lines``, one for one, each line's series up to
    its last space (a line with a timestamp, or with odd spacing, is not: such pages go
    without a plan)."""
    samples = page.samples
    return len(samples) == len(lines) and all(
        s.key == heads[i] and s.timestamp_ms is None for s, i in zip(samples, lines, strict=True)
    )


@dataclass(slots=True)
class _Plan:
    """What a page of one shape becomes: its lines (to recognise the shape) and steps."""

    heads: list[str]  # each line of the page up to its last space, comments too
    samples_of: Callable[[list[Any]], tuple[Any, ...]]  # lines -> the sample lines
    steps: list[_Step]


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
        self._plan: _Plan | None = None

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

    def clear(self) -> None:
        self._series.clear()
        self._plan = None  # rebuilt on the next scrape, which re-fills the series cache

    def translate_text(self, text: str, ts_ms: int) -> Collected:
        """A page of the last page's shape takes its plan; any other is parsed in full."""
        parts = list(map(str.rpartition, text.split("\n"), repeat(" ")))
        heads = list(map(_HEAD, parts))  # each line up to its last space
        plan = self._plan
        if plan is not None and plan.heads == heads:
            try:
                numbers = list(map(float, map(_TAIL, plan.samples_of(parts))))
            except ValueError:  # a bad value: the full parser says which line and why
                return self.translate(parse(text, self._series), ts_ms)
            return self._run(plan.steps, numbers, ts_ms, Collected())
        page = parse(text, self._series)
        self._plan = None
        lines = [i for i, (head, space, _) in enumerate(parts) if _is_sample(head + space)]
        if not page.malformed and not page.series_capped and _same(page, heads, lines):
            self._plan = _Plan(heads, _picker(lines), self._steps(page))
            return self._run(self._plan.steps, [s.value for s in page.samples], ts_ms, Collected())
        return self.translate(page, ts_ms)

    def translate(self, page: ParsedPage, ts_ms: int) -> Collected:
        """One parsed page, planned afresh (mapped targets hand their pages here)."""
        out = Collected()
        if page.malformed:
            out.drop("malformed", page.malformed, "; ".join(page.first_errors))
        if page.series_capped:
            out.drop("series_cap", page.series_capped)
        return self._run(self._steps(page), [s.value for s in page.samples], ts_ms, out)

    # -- planning: what each line of a page of this shape becomes ---------------------------
    def _steps(self, page: ParsedPage) -> list[_Step]:
        steps: list[_Step] = []
        histograms: dict[tuple, dict] = {}
        for i, sample in enumerate(page.samples):
            name = sample.series.name
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix) and name[: -len(suffix)] in self.phases:
                    family = name[: -len(suffix)]
                    break
            else:
                if name in spelling.TRITON_SUMMARIES:
                    step = self._summary(i, name, sample.series.label_dict())
                    if step is not None:
                        steps.append(step)
                continue
            labels = sample.series.label_dict()
            le = labels.pop("le", None)
            entry = histograms.setdefault(
                (family, tuple(sorted(labels.items()))), {"buckets": {}, "count": None}
            )
            if suffix == "_bucket":
                if le is None:
                    steps.append(_Drop("malformed"))
                    continue
                try:
                    entry["buckets"][float(le)] = i
                except ValueError:
                    steps.append(_Drop("malformed"))
            elif suffix == "_count":
                entry["count"] = i
        for key, entry in histograms.items():
            steps.append(self._window(key, entry))
        return steps

    def _summary(self, line: int, name: str, labels: dict[str, str]) -> _Step | None:
        q = labels.pop("quantile", None)
        base = self._base(labels, spelling.TRITON_SUMMARIES[name])
        if base is None or q is None:
            return _Drop("no_device")
        try:
            wanted = float(q)
        except ValueError:
            return _Drop("malformed", f"{name}: quantile {q[:40]!r}")
        canonical = next((c for c in QUANTILES if float(c) == wanted), None)
        if canonical is None:
            return None  # a quantile hbmwatch does not keep: nothing to count
        labelled = {**base, "quantile": canonical}
        return _Summary(
            line,
            SeriesKey("workload_latency_seconds", labelled),
            SeriesKey("workload_latency_resolution_seconds", labelled),
        )

    def _window(self, key: tuple, entry: dict) -> _Step:
        family, labels = key
        phase = self.phases[family]
        base = self._base(dict(labels), phase)
        if base is None:
            return _Drop("no_device")
        edges = sorted(entry["buckets"])
        if not edges or not math.isinf(edges[-1]):
            return _Drop("malformed", f"{family}: histogram without a +Inf bucket")
        counted = phase in COUNTED_PHASES
        quantiles = []
        for q in QUANTILES:
            labelled = {**base, "quantile": q}
            latency = SeriesKey("workload_latency_seconds", labelled)
            resolution = SeriesKey("workload_latency_resolution_seconds", labelled)
            quantiles.append((float(q), latency, resolution))
        return _Window(
            buckets_of=_picker([entry["buckets"][e] for e in edges]),
            count_line=entry["count"],
            uppers=edges,
            history=self._history.setdefault(key, deque()),
            requests=SeriesKey("workload_requests_total", base) if counted else None,
            window=SeriesKey("workload_window_requests", base),
            quantiles=quantiles,
        )

    # -- running: one scrape's values through the plan ---------------------------------------
    def _run(
        self, steps: list[_Step], values: list[float], ts_ms: int, out: Collected
    ) -> Collected:
        for step in steps:
            if type(step) is _Window:
                self._run_window(out, step, values, ts_ms)
            elif type(step) is _Summary:
                out.add(step.latency, ts_ms, values[step.line] * 1e-6)
                out.add(step.resolution, ts_ms, 0.0)
            else:
                out.drop(step.reason, why=step.why)
        return out

    def _run_window(self, out: Collected, w: _Window, values: list[float], ts_ms: int) -> None:
        cumulative = w.buckets_of(values)
        count = values[w.count_line] if w.count_line is not None else cumulative[-1]
        if w.requests is not None:
            out.add(w.requests, ts_ms, count)
        history = w.history
        if history:
            last = history[-1]
            if (
                count < last.count
                or len(last.buckets) != len(cumulative)
                or any(map(operator.lt, cumulative, last.buckets))
            ):
                history.clear()  # the server restarted: its counters began again
        horizon = ts_ms - self.window_ms
        while len(history) >= 2 and history[1].ts_ms <= horizon:
            history.popleft()
        history.append(_Snapshot(ts_ms, cumulative, count))
        if len(history) < 2:
            return
        grown = list(map(operator.sub, cumulative, history[0].buckets))
        per_bucket = [grown[0], *map(operator.sub, grown[1:], grown[:-1])]
        in_window = _numpy_sum(per_bucket)
        out.add(w.window, ts_ms, in_window)
        if in_window <= 0:
            return
        if math.isfinite(in_window):
            running = list(accumulate(per_bucket))
            for q, latency, resolution in w.quantiles:
                value, width = _quantile(q, w.uppers, per_bucket, running, in_window)
                out.add(latency, ts_ms, value)
                out.add(resolution, ts_ms, width)
            return
        uppers, counts = np.array(w.uppers), np.array(per_bucket)
        for q, latency, resolution in w.quantiles:
            value, width = histogram_quantile(q, uppers, counts)
            out.add(latency, ts_ms, value)
            out.add(resolution, ts_ms, width)
