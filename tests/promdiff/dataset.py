"""The differential tests' data: a seeded synthetic fleet, and the default scenario's own.

Dataset 1 is built to hit PromQL's edges: 15 s scrapes with millisecond jitter, counter
resets, gaps shorter and longer than the 5-minute lookback, series that stop (stale) and
series that start late, and label sets that differ between series of one metric (``rack``
and ``sku`` on some series only, ``partition`` on one host).  The canonical model has no
classic histogram (no ``*_bucket`` with ``le``), so ``histogram_quantile`` is exercised
only over selectors that have no ``le`` (empty on both engines).

Dataset 2 is what hbmwatch's own pipeline writes: the simulated fleet's ``default``
scenario through the collector into a store (``hbmwatch eval``'s runner), dumped.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.store import Store

STEP_MS = 15_000
SPAN_MS = 2 * 3600 * 1000
#: Minutes before the store clock that compaction leaves in the head.
HEAD_MINUTES = 25


@dataclass
class Dataset:
    """Samples plus what the query grammar may pick from them."""

    samples: list[Sample]
    start_s: float
    end_s: float
    gauges: dict[str, list[str]] = field(default_factory=dict)  # metric -> its labels
    counters: dict[str, list[str]] = field(default_factory=dict)
    label_values: dict[str, list[str]] = field(default_factory=dict)
    #: Gauges whose values are continuous (no ties: safe for topk/bottomk).
    continuous: tuple[str, ...] = ()


_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    # metric -> (extra label, its values)
    "gpu_power_watts": ("", ()),
    "gpu_hbm_stack_temperature_celsius": ("stack", ("0", "1")),
    "gpu_clock_hertz": ("domain", ("compute", "memory")),
    "gpu_throttle_active": ("reason", ("power", "hbm_thermal")),
}
_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu_energy_joules_total": ("", ()),
    "gpu_pcie_naks_total": ("direction", ("rx", "tx")),
    "gpu_ecc_errors_total": ("severity", ("correctable", "uncorrectable")),
}
HOSTS = ("h0", "h1", "h2")
GPUS = ("0", "1", "2")


def _identity(host: str, gpu: str) -> dict[str, str]:
    """Device labels; which optional ones a series has depends on the host."""
    labels = {"cluster": "c1", "host": host, "gpu": gpu}
    if host != "h2":
        labels["rack"] = "r0" if host == "h0" else "r1"
    if host == "h0":
        labels["sku"] = "MI300X"
    if host == "h1" and gpu == "2":
        labels["partition"] = "1"
    return labels


def _shape(rng: random.Random) -> tuple[int, int, list[tuple[int, int]]]:
    """(first, last) sample offsets in ms and the gaps inside them, drawn per series."""
    first, last = 0, SPAN_MS
    kind = rng.random()
    if kind < 0.15:
        first = rng.randrange(20, 70) * 60_000  # starts late
    elif kind < 0.3:
        last = rng.randrange(60, 110) * 60_000  # stops: stale afterwards
    gaps = []
    if rng.random() < 0.5:
        at = rng.randrange(first, max(first + 1, last - 10 * 60_000))
        gaps.append((at, at + rng.choice((90, 150, 240, 290)) * 1000))  # under the lookback
    if rng.random() < 0.35:
        at = rng.randrange(first, max(first + 1, last - 20 * 60_000))
        gaps.append((at, at + rng.choice((330, 420, 900)) * 1000))  # over it
    return first, last, gaps


def _times(rng: random.Random, start_ms: int) -> list[int]:
    first, last, gaps = _shape(rng)
    out = []
    for t in range(first, last, STEP_MS):
        if any(lo <= t < hi for lo, hi in gaps):
            continue
        jitter = rng.randrange(-1500, 1500) if rng.random() < 0.7 else 0
        out.append(start_ms + max(0, min(SPAN_MS - 1, t + jitter)))
    return sorted(set(out))


def _gauge_values(rng: random.Random, metric: str, n: int) -> list[float]:
    if metric == "gpu_throttle_active":
        return [float(rng.random() < 0.2) for _ in range(n)]
    base = {"gpu_power_watts": 400.0, "gpu_clock_hertz": 1.5e9}.get(metric, 60.0)
    spread = base * 0.1
    return [round(base + rng.uniform(-spread, spread), 3) for _ in range(n)]


def _counter_values(rng: random.Random, n: int) -> list[float]:
    value, out = rng.uniform(0, 1000), []
    scale = rng.choice((1.0, 50.0, 1e6))
    for _ in range(n):
        if rng.random() < 0.01:
            value = rng.uniform(0, 5) * scale  # a reset (driver reload, wrap)
        else:
            value += round(rng.expovariate(1.0) * scale, 3)
        out.append(value)
    return out


def synthetic(now_s: float, seed: int = 15) -> Dataset:
    """Dataset 1: about 80 series over the two hours before ``now_s``."""
    rng = random.Random(seed)
    start_ms = int(now_s * 1000) - SPAN_MS
    samples: list[Sample] = []
    label_values: dict[str, set[str]] = {}
    for table, is_counter in ((_GAUGES, False), (_COUNTERS, True)):
        for metric, (extra, values) in table.items():
            for host in HOSTS:
                for gpu in GPUS:
                    for v in values or ("",):
                        labels = _identity(host, gpu) | ({extra: v} if extra else {})
                        key = SeriesKey(metric, labels)
                        times = _times(rng, start_ms)
                        vals = (
                            _counter_values(rng, len(times))
                            if is_counter
                            else _gauge_values(rng, metric, len(times))
                        )
                        samples += [Sample(key, t, x) for t, x in zip(times, vals, strict=True)]
                        for k, x in key.labels:
                            label_values.setdefault(k, set()).add(x)
    return Dataset(
        samples,
        start_ms / 1000,
        now_s,
        gauges={m: _labels_of(samples, m) for m in _GAUGES},
        counters={m: _labels_of(samples, m) for m in _COUNTERS},
        label_values={k: sorted(v) for k, v in label_values.items()},
        continuous=("gpu_power_watts", "gpu_hbm_stack_temperature_celsius", "gpu_clock_hertz"),
    )


def _labels_of(samples: list[Sample], metric: str) -> list[str]:
    return sorted({k for s in samples if s.series.metric == metric for k, _ in s.series.labels})


def load(store: Store, dataset: Dataset, now_s: float) -> None:
    """Write the samples, then compact all but the last ``HEAD_MINUTES`` into the tiers."""
    batch = 20_000
    for i in range(0, len(dataset.samples), batch):
        result = store.write(dataset.samples[i : i + batch])
        assert result.accepted == len(dataset.samples[i : i + batch]), result
    store.compact(int((now_s - HEAD_MINUTES * 60) * 1000))


def default_scenario(minutes: float, folder: Path, seed: int = 1) -> tuple[Path, float, float]:
    """Dataset 2: ``minutes`` of the default scenario through hbmwatch's pipeline (``hbmwatch
    eval``'s runner: simulator, collector, store, compaction), its store copied to ``folder``.

    Returns the copy and the simulated [start, end] in Unix seconds."""
    from hbmwatch.evaluation.run import run_scenario
    from hbmwatch.simulator.scenario import load_scenario

    copy = folder / "scenario.db"
    span: list[float] = []

    async def on_cycle(store: Store, report: object) -> None:
        # detect_every_s is beyond the run: only the final cycle comes here, with all data.
        source = sqlite3.connect(str(store.engine.url.database))
        target = sqlite3.connect(str(copy))
        with target:
            source.backup(target)
        source.close()
        target.close()
        span[:] = [store.now_ms() / 1000]

    result = asyncio.run(
        run_scenario(
            load_scenario("default"),
            seed=seed,
            duration_s=minutes * 60,
            detect_every_s=minutes * 60 + 3600,
            on_cycle=on_cycle,
        )
    )
    return copy, span[0] - result.simulated_seconds, span[0]
