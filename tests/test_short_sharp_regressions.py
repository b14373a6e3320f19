"""Short sharp regressions, read as the pager reads them: vLLM's first-token histogram, its
p99 over the collector's 60 s window, scraped every 5 s, into ``LatencyRegressions``.

vLLM's buckets are coarse (0.25, 0.5, 0.75, 1, 2.5, 5 s): a 22x p99 is under two buckets
over its baseline.  The hold must scale with the p99 ratio, not with that bucket count
(which held a 22x regression 75 s, like a 1.9x one, so 5-30 s faults never paged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.collector.spellings.vllm import TIME_TO_FIRST_TOKEN_BUCKETS
from hbmwatch.detectors.latency import LatencyRegressions
from hbmwatch.records import Finding
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import load_scenario
from hbmwatch.taxonomy import FindingKind
from tests import test_detect_latency as lat

SCRAPE_S = 5  # hbmwatch eval scrapes latency pages every 5 s
SIGNALS = {"0.99": "p99", "0.5": "p50"}
TTFT = "vllm:time_to_first_token_seconds"
EDGES = (*TIME_TO_FIRST_TOKEN_BUCKETS, float("inf"))


def ttft_page(counts: np.ndarray) -> str:
    """A vLLM page with one model's first-token histogram (per-bucket ``counts``)."""
    lines = [f"# TYPE {TTFT} histogram"]
    for edge, c in zip(EDGES, np.cumsum(counts).tolist(), strict=True):
        le = "+Inf" if edge == float("inf") else repr(float(edge))
        lines.append(f'{TTFT}_bucket{{model_name="m",le="{le}"}} {c}')
    lines.append(f'{TTFT}_count{{model_name="m"}} {int(counts.sum())}')
    return "\n".join(lines) + "\n"


def collect(pages: Iterator[tuple[int, dict[str, str]]], seconds: int) -> dict[str, np.ndarray]:
    """Each service's first-token p99, p50, bucket width and window requests on a 1 s grid
    (NaN between scrapes), through the collector's own translator."""
    translators: dict[str, InferenceTranslator] = {}
    out: dict[str, dict[str, np.ndarray]] = {}
    for t, texts in pages:
        for service, text in texts.items():
            tr = translators.setdefault(service, InferenceTranslator({"service": service}))
            rows = out.setdefault(
                service, {k: np.full(seconds, np.nan) for k in ("p99", "p50", "res99", "win")}
            )
            for s in tr.translate_text(text, t * 1000).samples:
                if s.series.label("phase") != "ttft":
                    continue
                metric, q = s.series.metric, SIGNALS.get(s.series.label("quantile") or "")
                if metric == "workload_latency_seconds" and q:
                    rows[q][t] = s.value
                elif metric == "workload_latency_resolution_seconds" and q == "p99":
                    rows["res99"][t] = s.value
                elif metric == "workload_window_requests":
                    rows["win"][t] = s.value
    return {
        name: np.stack([rows[k] for rows in out.values()])
        for name, k in (("p99", "p99"), ("p50", "p50"), ("res99", "res99"), ("win", "win"))
    } | {"keys": np.array([f"{s}/ttft" for s in out])}


def detect(series: dict[str, np.ndarray]) -> list[Finding]:
    """The opening statement of each p99 finding over the collected series."""
    found = lat.feed(
        LatencyRegressions(),
        series["p99"],
        keys=[str(k) for k in series["keys"]],
        p50=series["p50"],
        res99=series["res99"],
        window_requests=series["win"],
    )
    return [f for f in lat.opened(found) if f.kind == FindingKind.P99_REGRESSION]


def synthetic(seconds: int, slow: Callable[[int], float], seed: int = 0):  # type: ignore[no-untyped-def]
    """6 first tokens a second (median 45 ms, p99 about 0.13 s), ``slow(t)`` times slower."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(EDGES), dtype=np.int64)
    for t in range(seconds):
        values = rng.lognormal(np.log(0.045), 0.45, rng.poisson(6)) * slow(t)
        np.add.at(counts, np.searchsorted(TIME_TO_FIRST_TOKEN_BUCKETS, values), 1)
        if t % SCRAPE_S == SCRAPE_S - 1:
            yield t, {"svc": ttft_page(counts)}


ONSET = 600


@pytest.mark.parametrize(
    ("factor", "during_s", "within_s"),
    [(5.0, 20, 40), (9.0, 30, 25), (51.0, 5, 15)],
    ids=["5x-slower-for-20s", "9x-for-30s", "51x-for-5s"],
)
def test_a_short_sharp_regression_pages(factor: float, during_s: int, within_s: int) -> None:
    """First tokens ``factor`` times slower for ``during_s``: the window's p99 reads 3-22x
    over its baseline, through one or two coarse buckets; it pages ``within_s`` of onset."""
    seconds = ONSET + 180

    def slow(t: int) -> float:
        return factor if ONSET <= t < ONSET + during_s else 1.0

    found = detect(collect(synthetic(seconds, slow), seconds))
    assert len(found) == 1, [f.summary for f in found]
    f = found[0]
    assert f.started_ms >= ONSET * 1000 and f.raised_ms <= (ONSET + within_s) * 1000


def test_a_steady_service_through_the_same_buckets_opens_nothing() -> None:
    """The same traffic, 15 minutes without a fault: its tail excursions page nothing."""
    seconds = 900
    for seed in range(2):
        assert detect(collect(synthetic(seconds, lambda t: 1.0, seed), seconds)) == []


@pytest.mark.slow
def test_the_scenario_pages_each_fault_on_its_service() -> None:
    """``short_sharp_regressions`` through the simulator's own vLLM pages and the collector:
    each of its three faults opens a p99 regression on its service, after its onset and
    before its window has passed; nothing else opens."""
    scenario = load_scenario("short_sharp_regressions")
    sim = Simulation(scenario, start_unix=1_800_000_000.0 + 3600)  # 09:00 UTC, as eval
    seconds = int(scenario.duration)
    names = [s.name for s in sim.fleet.services]

    def pages() -> Iterator[tuple[int, dict[str, str]]]:
        for t in range(seconds):
            sim.step()
            if t % SCRAPE_S == SCRAPE_S - 1:
                yield t, {name: sim.service_page(i) for i, name in enumerate(names)}

    found = detect(collect(pages(), seconds))
    truth = sim.ground_truth()["faults"]
    assert len(found) == len(truth), [f.summary for f in found]
    start = sim.start_unix
    for f, fault in zip(sorted(found, key=lambda f: f.started_ms), truth, strict=True):
        assert f.entity["service"] in fault["affected_services"]
        onset_s = fault["onset_unix"] - start
        assert onset_s * 1000 <= f.started_ms and f.raised_ms <= (onset_s + 90) * 1000
