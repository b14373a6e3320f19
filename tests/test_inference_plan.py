"""The memoised inference translator agrees with the one before it, sample for sample.

``tests/inference_reference.py`` is the translator as it was before plans (issue 17); both
read the same page sequences (simulated vLLM pages, restarts, counter resets, a histogram
without +Inf, malformed lines and values, Triton summaries, mapped labels, the series cap,
shapes that change, a cache reset) and must give the same samples, values and drops.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hbmwatch.collector.sources.inference import InferenceTranslator, _numpy_sum
from hbmwatch.collector.spellings.vllm import REQUEST_LATENCY_BUCKETS
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict
from tests.inference_reference import InferenceTranslator as Reference

QUANTILES = ("0.5", "0.9", "0.99", "abc")

T = 1_800_000_000_000
E2E = "vllm:e2e_request_latency_seconds"
BOUNDS = ("0.5", "1.0", "2.5", "+Inf")


def outcome(collected):  # type: ignore[no-untyped-def]
    samples = [(s.series.text, s.timestamp_ms, float(s.value)) for s in collected.samples]
    return samples, dict(collected.dropped), collected.errors


def agree(pages: list[str], *, step_ms: int = 1000, **kwargs) -> list:  # type: ignore[no-untyped-def]
    """Feed both translators the pages, one scrape a step; every scrape must agree."""
    new, old = InferenceTranslator(**kwargs), Reference(**kwargs)
    outs = []
    for n, page in enumerate(pages):
        ts = T + n * step_ms
        if page == "CLEAR":
            new.clear()
            old.clear()
            continue
        got, want = outcome(new.translate_text(page, ts)), outcome(old.translate_text(page, ts))
        assert got == want, f"scrape {n} differs"
        outs.append(got)
    return outs


def histogram(counts: list[float], *, model: str = "m", count: float | None = None,
              bounds: tuple[str, ...] = BOUNDS, extra: str = "") -> str:  # fmt: skip
    lines = ["# TYPE vllm:e2e_request_latency_seconds histogram"]
    for le, c in zip(bounds, counts, strict=True):
        lines.append(f'{E2E}_bucket{{model_name="{model}"{extra},le="{le}"}} {c}')
    total = counts[-1] if count is None else count
    lines.append(f'{E2E}_count{{model_name="{model}"{extra}}} {total}')
    lines.append(f'{E2E}_sum{{model_name="{model}"{extra}}} {total * 0.7}')
    return "\n".join(lines) + "\n"


def growing(n: int, seed: int = 1) -> list[list[float]]:
    rng = random.Random(seed)
    counts = [0.0] * len(BOUNDS)
    pages = []
    for _ in range(n):
        for i in range(rng.randrange(len(BOUNDS)), len(BOUNDS)):
            counts[i] += rng.randrange(5)
        counts = list(np.maximum.accumulate(counts))
        pages.append(list(counts))
    return pages


def test_simulated_vllm_pages_agree_scrape_after_scrape() -> None:
    scenario = scenario_from_dict(
        {
            "name": "p",
            "duration": "1h",
            "seed": 4,
            "racks": [{"name": "r0", "nodes": 1, "sku": "H100"}],
        }
    )
    sim = Simulation(scenario, start_unix=1_800_000_000)
    pages: dict[int, list[str]] = {i: [] for i in range(3)}
    for _ in range(40):
        sim.step()
        for i in pages:
            pages[i].append(sim.service_page(i))
    for i, series in pages.items():
        outs = agree(series, window_seconds=10, static_labels={"host": "n1", "gpu": str(i)})
        assert any(s[0].startswith("workload_latency_seconds") for s in outs[-1][0])


def test_restarts_counter_resets_and_windows_agree() -> None:
    counts = growing(30)
    pages = [histogram(c) for c in counts]
    pages[12] = histogram([0.0] * 4)  # the server restarted
    pages[20] = histogram([*counts[20][:2], 0.0, counts[20][3]])  # one bucket went back
    pages[25] = histogram(counts[25], count=1.0)  # _count went back alone
    agree(pages, window_seconds=5, static_labels={"service": "s"})


def test_changing_shapes_and_a_cache_reset_agree() -> None:
    counts = growing(24, seed=2)
    pages = [histogram(c) for c in counts]
    pages[5] = histogram(counts[5], model="other")  # a new label value
    pages[6] = histogram(counts[6]) + histogram(counts[6], model="other").split("\n", 1)[1]
    pages[8] = histogram(counts[8][:3], bounds=("0.5", "1.0", "+Inf"))  # a bucket gone
    pages[10] = "CLEAR"
    pages[14] = histogram(counts[14], extra=',engine="1"')
    pages[15] = histogram(counts[15]).replace(f"{E2E}_count", "# gone")  # no _count line
    pages[16] = histogram(counts[16]).replace(" 0.0\n", " 0.0 17\n")  # timestamps
    agree(pages, window_seconds=4)


def test_malformed_lines_values_and_missing_inf_agree() -> None:
    counts = growing(16, seed=3)
    pages = [histogram(c) for c in counts]
    pages[3] = histogram(counts[3], bounds=("0.5", "1.0", "2.5", "5.0"))  # no +Inf bucket
    pages[5] = pages[5].replace(f" {counts[5][1]}\n", " twelve\n", 1)  # a bad value
    pages[7] = pages[7] + "this is { not a line\n"
    pages[8] = pages[8].replace('le="1.0"', 'le="one"')
    pages[9] = pages[9].replace(',le="1.0"', "")  # a bucket without le
    pages[10] = pages[10] + pages[10].splitlines()[2] + "\n"  # the same series twice
    pages[11] = pages[11].replace(f"{counts[11][3]}\n", "NaN\n", 1)
    pages[12] = pages[12].replace(f"{counts[12][2]}\n", "+Inf\n", 1)
    pages[13] = histogram([0.5, 1.25, 2.0, 2.75])  # not counts at all
    pages[14] = histogram([0.1, 0.30000000000000004, 0.7, 1e-9 + 0.7])
    agree(pages, window_seconds=3, static_labels={"service": "s"})


def test_triton_summaries_agree() -> None:
    def page(v: float) -> str:
        name = "nv_inference_request_summary_us"
        lines = [f'{name}{{model="r",version="1",quantile="{q}"}} {v}' for q in QUANTILES]
        lines.append(f'{name}{{version="1",quantile="0.5"}} {v}')  # no model: no device
        return "\n".join(lines) + "\n"

    agree([page(v) for v in (2500, 2600, float("nan"), 3000)])


def test_mapped_labels_phases_and_no_device_agree() -> None:
    kwargs = {"phases": {"my_latency": "e2e"}, "label_map": {"model": "deployment"}}
    pages = []
    for c in growing(8, seed=4):
        lines = [f'my_latency_bucket{{deployment="d1",le="{le}"}} {v}' for le, v in
                 zip(BOUNDS, c, strict=True)]  # fmt: skip
        lines += [f'my_latency_bucket{{le="{le}"}} {v}' for le, v in zip(BOUNDS, c, strict=True)]
        pages.append("\n".join(lines) + "\n")
    agree(pages, **kwargs)


def test_series_cap_agrees() -> None:
    counts = growing(6, seed=5)
    pages = [histogram(c) + histogram(c, model="b").split("\n", 1)[1] for c in counts]
    outs = agree(pages, series_cap=8)
    assert outs[-1][1].get("series_cap")


def test_random_pages_agree() -> None:
    rng = random.Random(6)
    bounds = (*(str(b) for b in REQUEST_LATENCY_BUCKETS), "+Inf")
    pages = []
    counts = [0.0] * len(bounds)
    for _ in range(200):
        if rng.random() < 0.05:
            counts = [0.0] * len(bounds)
        counts = [c + rng.choice((0, 0, 1, 0.1, 1 / 3, 2.5, 1e6)) for c in counts]
        counts = list(np.maximum.accumulate(counts))
        models = ["a", "b"][: rng.randrange(1, 3)]
        pages.append("".join(histogram(counts, model=m, bounds=bounds) for m in models))
    agree(pages, window_seconds=7, step_ms=900)


@pytest.mark.parametrize("n", [*range(1, 40), 127, 128, 129, 300])
def test_numpy_sum_adds_in_numpys_order(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.uniform(-1, 1) * 10 ** rng.randrange(-6, 6) for _ in range(n)]
    assert _numpy_sum(xs) == float(np.array(xs).sum())
    assert math.isfinite(_numpy_sum(xs))
