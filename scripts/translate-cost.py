#!/usr/bin/env python3
"""CPU per page and per sample out: translating scrapes, and writing them to the store.

Translation (issue 17): a vLLM page (one inference server, 73 lines) through the memoised
``InferenceTranslator`` and through the translator as it was before (kept in
tests/inference_reference.py), and a DCGM and a DME node page (8 GPUs) through theirs;
every page after the first of its target (steady state), pages rendered by the simulator
one step apart.  Writing: one batch of those samples into a fresh SQLite store through
``Store.write`` (samples named by ``SeriesKey``) and through the collector's writer.
CPU time (``time.process_time``), best of ``--repeat``.
Usage: .venv/bin/python scripts/translate-cost.py [--steps 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/inference_reference

from hbmwatch.collector.sources.dcgm import DcgmTranslator  # noqa: E402
from hbmwatch.collector.sources.dme import DmeTranslator  # noqa: E402
from hbmwatch.collector.sources.inference import InferenceTranslator  # noqa: E402
from hbmwatch.simulator.runner import Simulation  # noqa: E402
from hbmwatch.simulator.scenario import scenario_from_dict  # noqa: E402
from tests.inference_reference import InferenceTranslator as Reference  # noqa: E402

T0 = 1_800_000_000_000


def rendered(sku: str, steps: int) -> tuple[list[list[str]], list[list[str]]]:
    """Per node and per inference service of one 8-GPU node, its page at every step."""
    scenario = scenario_from_dict(
        {"name": "cost", "duration": "1h", "seed": 4,
         "racks": [{"name": "r0", "nodes": 1, "sku": sku}]}
    )  # fmt: skip
    sim = Simulation(scenario, start_unix=T0 // 1000)
    nodes: list[list[str]] = [[] for _ in sim.fleet.nodes]
    services: list[list[str]] = [[] for _ in sim.fleet.services]
    for _ in range(steps):
        sim.step()
        for i, pages in enumerate(nodes):
            pages.append(sim.node_page(i) or "")
        for i, pages in enumerate(services):
            pages.append(sim.service_page(i))
    return nodes, services


def cost(make: Any, targets: list[list[str]], repeat: int) -> dict[str, float]:
    """CPU µs per page and per sample out, steady state (each target's first page untimed)."""
    best, pages, samples = float("inf"), 0, 0
    for _ in range(repeat):
        translators = [make() for _ in targets]
        for t, series in zip(translators, targets, strict=True):
            t.translate_text(series[0], T0)
        pages = samples = 0
        started = time.process_time()
        for t, series in zip(translators, targets, strict=True):
            for n, page in enumerate(series[1:], 1):
                samples += len(t.translate_text(page, T0 + n * 1000).samples)
                pages += 1
        best = min(best, time.process_time() - started)
    return {
        "us_per_page": best / pages * 1e6,
        "us_per_sample": best / max(samples, 1) * 1e6,
        "samples_per_page": samples / pages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    _, services = rendered("H100", args.steps)
    dcgm, _ = rendered("H100", min(args.steps, 20))
    dme, _ = rendered("MI300X", min(args.steps, 20))
    rows = {
        "vllm page, memoised InferenceTranslator": cost(InferenceTranslator, services, args.repeat),
        "vllm page, reference (before)": cost(Reference, services, args.repeat),
        "dcgm node page (8 GPUs)": cost(DcgmTranslator, dcgm, args.repeat),
        "dme node page (8 GPUs)": cost(DmeTranslator, dme, args.repeat),
    }
    print(f"{'translation':48} {'µs/page':>9} {'µs/sample':>10} {'samples/page':>13}")
    for name, r in rows.items():
        print(f"{name:48} {r['us_per_page']:9.1f} {r['us_per_sample']:10.3f} "
              f"{r['samples_per_page']:13.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
