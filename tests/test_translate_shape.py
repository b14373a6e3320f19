"""Exporter pages read by their shape agree with the same pages read line by line.

``LineTranslator.translate_text`` takes a page of the last page's shape through a
``_Shape`` (values only); ``translate_lines`` is the line-by-line reading every page had
before (issue 17).  Both read the same page sequences (simulated DCGM and DME node pages,
sentinels, non-finite and bad values, new, vanished, duplicated and timestamped series,
odd spacing, a cache reset, the series cap) and must give the same samples and drops.
"""

from __future__ import annotations

import pytest

from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import scenario_from_dict

T = 1_800_000_000_000


def outcome(collected):  # type: ignore[no-untyped-def]
    samples = [(s.series.text, s.timestamp_ms, float(s.value)) for s in collected.samples]
    return samples, dict(collected.dropped), collected.errors, sorted(collected.devices)


def agree(make, pages: list[str], **kwargs) -> list:  # type: ignore[no-untyped-def]
    shaped, lines = make(**kwargs), make(**kwargs)
    outs = []
    for n, page in enumerate(pages):
        if page == "CLEAR":
            shaped.clear()
            lines.clear()
            continue
        got = outcome(shaped.translate_text(page, T + n * 1000))
        want = lines.translate_lines(page, T + n * 1000)
        want.devices = dict(lines._devices)
        assert got == outcome(want), f"scrape {n} differs"
        outs.append(got)
    return outs


def node_pages(sku: str, steps: int) -> list[str]:
    scenario = scenario_from_dict(
        {"name": "p", "duration": "1h", "seed": 4, "racks": [{"name": "r", "nodes": 1, "sku": sku}]}
    )
    sim = Simulation(scenario, start_unix=T // 1000)
    pages = []
    for _ in range(steps):
        sim.step()
        pages.append(sim.node_page(0) or "")
    return pages


def edited(pages: list[str]) -> list[str]:
    """The pages with one thing wrong at a time, between runs of good ones."""
    first = next(line for line in pages[0].splitlines() if line and line[0] != "#")
    head = first.rpartition(" ")[0]
    new = head.replace("}", ',extra="1"}') if "}" in head else head + "_x"
    out = list(pages)
    out[4] = out[4].replace(head + " ", new + " ", 1)  # a new series
    out[6] = "\n".join(line for line in out[6].splitlines() if not line.startswith(head))
    out[8] = out[8] + first + "\n"  # the same series twice
    out[10] = out[10].replace(head + " ", head + " NaN ", 1).replace(" NaN ", " NaN\n#", 1)
    out[11] = "CLEAR"
    out[13] = out[13].replace("\n", " \n", 1)  # a trailing blank
    out[14] = out[14].replace("\n", "\r\n")
    out[16] = "\n".join(
        line + " 1800000000000" if line and line[0] != "#" else line
        for line in out[16].splitlines()
    )
    return out


@pytest.mark.parametrize(("make", "sku"), [(DcgmTranslator, "H100"), (DmeTranslator, "MI300X")])
def test_simulated_node_pages_agree(make, sku) -> None:  # type: ignore[no-untyped-def]
    pages = node_pages(sku, 20)
    outs = agree(make, pages)
    assert len(outs[-1][0]) > 100
    agree(make, edited(pages))
    unknown = [page + 'some_other_metric{gpu="0"} 1\n' for page in pages]
    assert agree(make, unknown)[-1][1]
    first = next(line for line in pages[0].splitlines() if line and line[0] != "#")
    twice = [page + first.rpartition(" ")[0] + " 7\n" for page in pages]  # every scrape
    assert agree(make, twice)[-1][2]


@pytest.mark.parametrize("value", ["NaN", "+Inf", "twelve", "9223372036854775794", "2147483640"])
def test_a_bad_or_blank_value_agrees(value: str) -> None:
    pages = node_pages("H100", 6)
    target = next(line for line in pages[3].splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP"))
    pages[3] = pages[3].replace(target, target.rpartition(" ")[0] + " " + value)
    outs = agree(DcgmTranslator, pages)
    assert outs[3][1]


def test_the_series_cap_agrees() -> None:
    outs = agree(DmeTranslator, node_pages("MI300X", 5), series_cap=50)
    assert outs[-1][1].get("series_cap")
