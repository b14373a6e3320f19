"""Exporters that refresh slower than the scrape: the simulator's option, the collector's
unchanged pages and refresh series, and the stuck-sensor check on 30 s samples."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.refresh import PageMemory
from hbmwatch.collector.targets import Target, TargetSet
from hbmwatch.detectors.quality import DataQuality
from hbmwatch.promql.engine import evaluate
from hbmwatch.promql.source import StoreSource
from hbmwatch.promql.values import Grid
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import CollectorSettings
from hbmwatch.simulator.inprocess import InProcessServer
from hbmwatch.simulator.runner import Simulation
from hbmwatch.simulator.scenario import Scenario, scenario_from_dict
from hbmwatch.validation import ConfigError
from tests.conftest import Clock, make_store
from tests.test_detect_quality import busy_gpu, by_check, chunks, run

REFRESH = "hbmwatch_target_refresh_seconds"


def fleet(refresh: float | str = 0, **extra: object) -> Scenario:
    """One MI300X node (DME) and one H200 node (dcgm-exporter): 16 GPUs."""
    return scenario_from_dict(
        {
            "name": "slow",
            "duration": "10m",
            "seed": 3,
            "exporter_refresh": refresh,
            "racks": [
                {"name": "r0", "nodes": 1, "sku": "MI300X"},
                {"name": "r1", "nodes": 1, "sku": "H200"},
            ],
            **extra,
        }
    )


def changes(pages: list[str | None]) -> list[int]:
    return [i for i in range(1, len(pages)) if pages[i] != pages[i - 1]]


# -- the simulator ---------------------------------------------------------------------------
def test_exporter_pages_hold_between_refreshes_and_truth_is_unchanged() -> None:
    start = 1_795_000_000.0
    slow, plain = Simulation(fleet("30s"), start_unix=start), Simulation(fleet(0), start_unix=start)
    pages: dict[int, list[str | None]] = {0: [], 1: []}
    plain_pages = []
    for _ in range(95):
        slow.step()
        plain.step()
        plain_pages.append(plain.node_page(0))
        for node, served in pages.items():
            served.append(slow.node_page(node))
    assert changes(plain_pages) == list(range(1, 95))  # a fresh page every step
    for served in pages.values():
        at = changes(served)
        assert len(at) >= 3 and all(b - a == 30 for a, b in itertools.pairwise(at))
    assert changes(pages[0])[0] != changes(pages[1])[0], "nodes refresh at their own phase"
    assert all(pages[0][i] == plain_pages[i] for i in changes(pages[0]))  # the same fleet
    assert slow.ground_truth() == plain.ground_truth()


def test_a_racks_refresh_overrides_the_scenarios_and_the_flag_overrides_both() -> None:
    scenario = fleet(
        "30s",
        racks=[
            {"name": "r0", "nodes": 1, "sku": "MI300X", "exporter_refresh": "10s"},
            {"name": "r1", "nodes": 1, "sku": "H200"},
        ],
    )
    assert Simulation(scenario).refresh == [10.0, 30.0]
    assert Simulation(scenario.with_exporter_refresh(5)).refresh == [5.0, 5.0]
    with pytest.raises(ConfigError, match="exporter_refresh"):
        fleet(-1)


@pytest.mark.parametrize("command", ["sim", "eval"])
def test_a_bad_refresh_flag_is_refused_in_one_line(command: str) -> None:
    from typer.testing import CliRunner

    from hbmwatch.cli.main import app

    result = CliRunner().invoke(app, [command, "healthy", "--exporter-refresh", "-1"])
    assert result.exit_code == 2 and "exporter-refresh" in result.output


def test_a_node_back_from_target_down_serves_a_fresh_page() -> None:
    down = {"kind": "target_down", "target": {"host": "r0-node0"}, "onset": 10, "end": 20}
    sim = Simulation(fleet("60s", faults=[down]))
    sim.advance_to(5)
    before = sim.node_page(0)
    sim.advance_to(12)
    assert sim.node_page(0) is None
    sim.advance_to(21)
    after = sim.node_page(0)
    assert after is not None and after != before


# -- the collector ---------------------------------------------------------------------------
class ListSink:
    """The part of a BatchingSink that a scrape round uses: ``add``."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, samples: list[Sample]) -> None:
        self.samples.extend(samples)


async def scrape_fleet(refresh: float, seconds: int) -> tuple[dict[str, int], list[Sample]]:
    """Node samples per target kind over ``seconds`` 1 s rounds, and everything written."""
    sim = Simulation(fleet(refresh))
    server = InProcessServer(sim)
    served = [t for t in await server.start() if t.kind in ("dme", "dcgm")]
    settings = CollectorSettings()
    targets = [Target(t.kind, t.url, dict(t.labels), 1.0, 60.0) for t in served]
    sink = ListSink()
    engine = ScrapeEngine(TargetSet(settings, targets), sink, settings,  # type: ignore[arg-type]
                          clock=lambda: sim.now_unix, transport=server.transport())  # fmt: skip
    counts = {"dme": 0, "dcgm": 0}
    try:
        for _ in range(seconds):
            sim.step()
            for report in await engine.scrape_round(round(sim.now_unix * 1000)):
                assert report.up
                counts["dme" if "20000" in report.target else "dcgm"] += report.samples
    finally:
        await engine.close()
    return counts, sink.samples


def test_a_30s_exporter_stores_a_thirtieth_and_records_its_refresh() -> None:
    seconds = 120
    fresh, _ = asyncio.run(scrape_fleet(0, seconds))
    slow, written = asyncio.run(scrape_fleet(30, seconds))
    for kind in ("dme", "dcgm"):
        ratio = slow[kind] / fresh[kind]
        assert 1 / 40 < ratio < 5 / seconds * 1.2, (kind, ratio)  # the first page and 4 more
    ups = [s for s in written if s.series.metric == "hbmwatch_target_up"]
    assert len(ups) == 2 * seconds and all(s.value == 1.0 for s in ups)
    refresh = [s for s in written if s.series.metric == REFRESH]
    last = {
        s.series.label("source"): s.value for s in sorted(refresh, key=lambda s: s.timestamp_ms)
    }
    assert last == {"dme": pytest.approx(30.0, abs=1.5), "dcgm": pytest.approx(30.0, abs=1.5)}
    _, every_second = asyncio.run(scrape_fleet(0, 5))
    assert not [s for s in every_second if s.series.metric == REFRESH]


async def scrape_pages(
    kind: str, pages: list[str | None], every_s: float = 1.0, *, skip: bool = True
) -> tuple[list[int], list[Sample]]:
    """Scrape a target serving ``pages`` in turn (None: HTTP 500); samples per scrape."""
    served = iter(pages)

    def answer(request: httpx.Request) -> httpx.Response:
        page = next(served)
        return httpx.Response(500) if page is None else httpx.Response(200, text=page)

    settings = CollectorSettings(skip_unchanged_pages=skip)
    labels = {"cluster": "c0", "rack": "r1", "host": "r1-node0"}
    if kind == "vllm":
        labels.update(gpu="0", service="svc")
    target = Target(kind, "http://exporter:9400/metrics", labels, every_s, 10.0)
    sink = ListSink()
    engine = ScrapeEngine(TargetSet(settings, [target]), sink, settings,  # type: ignore[arg-type]
                          transport=httpx.MockTransport(answer))  # fmt: skip
    counts = []
    try:
        for i in range(len(pages)):
            (report,) = await engine.scrape_round(int(1_800_000_000_000 + i * every_s * 1000))
            counts.append(report.samples if report.up else -1)
    finally:
        await engine.close()
    return counts, sink.samples


def dcgm_page(at_s: float) -> str:
    sim = Simulation(fleet(0))
    sim.advance_to(at_s)
    page = sim.node_page(1)
    assert page is not None
    return page


def test_an_unchanged_page_is_skipped_but_not_after_a_failure() -> None:
    a, b = dcgm_page(1), dcgm_page(2)
    counts, written = asyncio.run(scrape_pages("dcgm", [a, a, a, None, a, a, b]))
    n = counts[0]
    assert n > 100
    # new, unchanged, unchanged, failed, new again (its series went stale), unchanged, new
    assert counts == [n, 0, 0, -1, n, 0, n]
    samples = [s for s in written if s.series.metric == "hbmwatch_scrape_samples"]
    assert [s.value for s in samples] == [c for c in counts if c >= 0]
    assert [s.value for s in written if s.series.metric == REFRESH] == [1.0, 2.0, 1.0, 2.0]


def test_with_skipping_off_every_page_is_stored() -> None:
    a = dcgm_page(1)
    counts, written = asyncio.run(scrape_pages("dcgm", [a, a, None, a], skip=False))
    assert counts[0] > 100 and counts == [counts[0], counts[0], -1, counts[0]]
    assert not [s for s in written if s.series.metric == REFRESH]


def test_unchanged_pages_still_show_their_devices_to_the_inventory() -> None:
    a = dcgm_page(1)
    seen: list[int] = []

    async def scrape() -> None:
        settings = CollectorSettings(inventory_seconds=0.5)
        target = Target("dcgm", "http://exporter:9400/metrics", {"host": "r1-node0"}, 1.0, 10.0)
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=a))
        engine = ScrapeEngine(TargetSet(settings, [target]), ListSink(), settings,  # type: ignore[arg-type]
                              inventory=lambda devices: seen.append(len(devices)),
                              transport=transport)  # fmt: skip
        async with engine:
            for i in range(3):
                (report,) = await engine.scrape_round(1_800_000_000_000 + i * 1000)
                assert report.samples == (0 if i else report.samples)

    asyncio.run(scrape())
    assert seen == [8, 8, 8]  # every due inventory, the unchanged pages' too


def test_a_timestamp_comment_alone_is_no_change() -> None:
    a, b = dcgm_page(1), dcgm_page(2)
    pages = [f"# generated at 12:00:0{i}\n{page}" for i, page in enumerate([a, a, b, b])]
    counts, _ = asyncio.run(scrape_pages("dcgm", pages))
    assert counts[0] > 100 and counts == [counts[0], 0, counts[0], 0]


def test_a_page_without_comments_treats_any_change_as_new() -> None:
    a = dcgm_page(1)
    counts, _ = asyncio.run(scrape_pages("dcgm", [a, a + "\n", a + "\n"]))
    assert counts[1] > 0 and counts[2] == 0


def test_an_unchanged_inference_page_is_translated_for_its_window() -> None:
    sim = Simulation(fleet(0))
    sim.advance_to(60)
    page = sim.service_page(0)
    counts, written = asyncio.run(scrape_pages("vllm", [page] * 4, every_s=30.0))
    assert all(c > 0 for c in counts)
    window = [s.value for s in written if s.series.metric == "workload_window_requests"]
    assert window and window[-1] == 0.0  # the idle service's requests left the window
    assert not [s for s in written if s.series.metric == REFRESH]


def test_comments_that_appear_later_are_found_within_a_hundred_changes() -> None:
    m = PageMemory()
    for i in range(150):  # a plain page changing every scrape ...
        assert not m.same(f"a {i}\n", i * 1000, trusted=i > 0)
    at = [i for i in range(150, 400) if not m.same(f"# at {i}\na 1\n", i * 1000, True)]
    assert at[0] == 150 and len(at) <= 51  # ... then stamped: new until the next check


def test_page_memory_measures_the_interval_between_changes() -> None:
    m = PageMemory()
    assert not m.same("a 1\n", 0, trusted=False)
    assert m.refresh_seconds(0) is None  # no unchanged page yet: nothing written
    assert m.same("a 1\n", 1000, trusted=True)
    assert m.refresh_seconds(1000) == 1.0  # the page's age so far
    assert not m.same("a 2\n", 30_000, trusted=True)
    assert m.same("a 2\n", 31_000, trusted=True)
    assert m.refresh_seconds(31_000) == 30.0
    assert not m.same("a 3\n", 60_000, trusted=True)
    assert m.refresh_seconds(60_000) == 30.0
    assert m.refresh_seconds(150_000) == 90.0  # a frozen exporter: the page's age


# -- the stuck check on 30 s samples ---------------------------------------------------------
def every(seconds: int, sig: dict[str, np.ndarray], hold: Callable[[dict], None] | None = None
          ) -> dict[str, np.ndarray]:  # fmt: skip
    """Signals sampled every ``seconds`` (NaN between), as a slow exporter's pages give."""
    out = {k: v.copy() for k, v in sig.items()}
    if hold is not None:
        hold(out)
    n = next(iter(out.values())).shape[1]
    for v in out.values():
        v[:, np.arange(n) % seconds != 7] = np.nan
    return out


def test_stuck_sensor_is_found_at_a_30s_refresh() -> None:
    n = 1200

    def stick(sig: dict) -> None:
        sig["mem_temp"][:, 200:] = 63.0

    found = run(DataQuality(), chunks(n, **every(30, busy_gpu(n), stick)))
    stuck = by_check(found, "stuck")
    assert {f.entity["signal"] for f in stuck} == {"mem_temp"} and not by_check(found, "gap")
    assert stuck[0].evidence[0].threshold == 720.0  # 24 samples 30 s apart
    assert 150_000 <= stuck[0].started_ms <= 240_000  # the sample before may read 63 too


@pytest.mark.parametrize("seed", range(4))
def test_healthy_gpus_at_a_30s_refresh_raise_nothing(seed: int) -> None:
    n = 1800
    assert run(DataQuality(), chunks(n, **every(30, busy_gpu(n, seed=seed, g=8)))) == []


def test_a_steady_sensor_whose_partner_also_holds_is_not_stuck_at_a_30s_refresh() -> None:
    """At 1 s the rounding flickers; 30 s apart a steady whole degree repeats by chance."""
    n = 1200

    def steady(sig: dict) -> None:
        sig["hot_temp"][:] = 56.0
        sig["mem_temp"][:] = 60.0

    assert run(DataQuality(), chunks(n, **every(30, busy_gpu(n), steady))) == []


# -- PromQL ----------------------------------------------------------------------------------
def test_promql_reads_30s_samples_as_a_live_series(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The 5-minute lookback spans a 30 s refresh: no step between samples is empty."""
    t0 = 1_800_000_000
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(t0 + 600))
    labels = {"cluster": "c0", "host": "n0", "gpu": "0"}
    temp = SeriesKey("gpu_memory_temperature_celsius", labels)
    energy = SeriesKey("gpu_energy_joules_total", labels)
    try:
        store.write(
            [Sample(temp, (t0 + t) * 1000, 60.0 + t % 7) for t in range(0, 600, 30)]
            + [Sample(energy, (t0 + t) * 1000, 500.0 * t) for t in range(0, 600, 30)]
        )
        grid = Grid((t0 + 60) * 1000, (t0 + 590) * 1000, 1000)
        source = StoreSource(store)
        (row,) = evaluate("gpu_memory_temperature_celsius", grid, source)
        assert row.present.all()
        (rate,) = evaluate("rate(gpu_energy_joules_total[1m])", grid, source)
        assert rate.present.all() and np.allclose(rate.values, 500.0)
    finally:
        store.close()
