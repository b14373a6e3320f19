#!/usr/bin/env python3
"""CPU per page and per sample out: translating scrapes, and writing them to the store.

Translation (issue 17): a vLLM page (one inference server, 73 lines) through the memoised
``InferenceTranslator`` and through the translator as it was before (kept in
tests/inference_reference.py), and a DCGM and a DME node page (8 GPUs) through theirs,
by page shape and line by line (``LineTranslator.translate_lines``, as before shapes);
every page after the first of its target (steady state), pages rendered by the simulator
one step apart.  Writing: batches of a 64-GPU DCGM page's samples into a fresh SQLite store
through ``Store.write`` (samples named by ``SeriesKey``, the collector's path) and through
``Store.write_rows`` with the ids looked up by the caller (the lookup timed apart), batch
for batch alternately.  CPU time (``time.process_time``), best of ``--repeat``, with the
garbage collector tuned as the service tunes it.
Usage: .venv/bin/python scripts/translate-cost.py [--steps 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/inference_reference

from bench.benchmarks import _migrated_store, _page_of
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.inference import InferenceTranslator
from hbmwatch.runtime.service import tune_gc
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict
from tests.inference_reference import InferenceTranslator as Reference

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


def lines(translator: type) -> type:
    """The translator reading every page line by line, as all pages were read before shapes."""
    return type(
        f"{translator.__name__}Lines", (translator,), {"translate_text": translator.translate_lines}
    )


def once(make: Any, targets: list[list[str]]) -> tuple[float, int, int]:
    """CPU seconds, pages and samples out of one pass, steady state (first pages untimed)."""
    translators = [make() for _ in targets]
    for t, series in zip(translators, targets, strict=True):
        t.translate_text(series[0], T0)
    pages = samples = 0
    started = time.process_time()
    for t, series in zip(translators, targets, strict=True):
        for n, page in enumerate(series[1:], 1):
            samples += len(t.translate_text(page, T0 + n * 1000).samples)
            pages += 1
    return time.process_time() - started, pages, samples


def cost(makes: dict[str, Any], targets: list[list[str]], repeat: int) -> dict[str, dict]:
    """CPU µs per page and per sample out of each translator, best of ``repeat`` passes
    taken in turns (a busy host slows them alike)."""
    best = dict.fromkeys(makes, float("inf"))
    pages = samples = 0
    for _ in range(repeat):
        for name, make in makes.items():
            spent, pages, samples = once(make, targets)
            best[name] = min(best[name], spent)
    return {
        name: {
            "us_per_page": spent / pages * 1e6,
            "us_per_sample": spent / max(samples, 1) * 1e6,
            "samples_per_page": samples / pages,
        }
        for name, spent in best.items()
    }


def writes(batches: int) -> dict[str, float]:
    """CPU µs per sample: ``Store.write``, and ``write_rows`` plus the caller's id lookup."""
    page = _page_of("dcgm", 64)
    translator = DcgmTranslator()
    samples = [translator.translate_text(page, T0 + n * 1000).samples for n in range(batches)]
    spent = {"write": 0.0, "lookup": 0.0, "write_rows": 0.0}
    counted = {"write": 0, "write_rows": 0}
    with tempfile.TemporaryDirectory() as folder:
        store = _migrated_store(f"sqlite:///{folder}/cost.db", lambda: T0 / 1000 + batches)
        store.write(samples[0])  # registers every series
        tune_gc()
        ids = store.series_registry.ids
        for n, batch in enumerate(samples[1:]):
            started = time.process_time()
            if n % 2 == 0:
                result = store.write(batch)
                spent["write"] += time.process_time() - started
            else:
                rows = [(s[1], ids[s[0].text], s[2]) for s in batch]
                looked_up = time.process_time()
                result = store.write_rows(rows)
                spent["lookup"] += looked_up - started
                spent["write_rows"] += time.process_time() - looked_up
            counted["write" if n % 2 == 0 else "write_rows"] += len(batch)
            assert result.accepted == len(batch), result
        store.close()
    return {
        "write": spent["write"] / counted["write"] * 1e6,
        "lookup": spent["lookup"] / counted["write_rows"] * 1e6,
        "write_rows": spent["write_rows"] / counted["write_rows"] * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batches", type=int, default=21, help="written batches of 4,928")
    args = parser.parse_args()
    _, services = rendered("H100", args.steps)
    dcgm, _ = rendered("H100", min(args.steps, 20))
    dme, _ = rendered("MI300X", min(args.steps, 20))
    tune_gc()  # as ``hbmwatch up`` does: young garbage collected rarely, start-up frozen
    rows = {
        **cost({"vllm page, memoised InferenceTranslator": InferenceTranslator,
                "vllm page, reference (before)": Reference}, services, args.repeat),
        **cost({"dcgm node page (8 GPUs), shaped": DcgmTranslator,
                "dcgm node page, line by line (before)": lines(DcgmTranslator)}, dcgm, args.repeat),
        **cost({"dme node page (8 GPUs), shaped": DmeTranslator,
                "dme node page, line by line (before)": lines(DmeTranslator)}, dme, args.repeat),
    }  # fmt: skip
    print(f"{'translation':48} {'µs/page':>9} {'µs/sample':>10} {'samples/page':>13}")
    for name, r in rows.items():
        print(f"{name:48} {r['us_per_page']:9.1f} {r['us_per_sample']:10.3f} "
              f"{r['samples_per_page']:13.1f}")  # fmt: skip
    w = writes(args.batches)
    print(f"\nwriting to SQLite, CPU µs a sample: Store.write {w['write']:.3f}; caller's "
          f"id lookup {w['lookup']:.3f} + Store.write_rows {w['write_rows']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
