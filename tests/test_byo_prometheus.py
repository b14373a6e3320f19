"""Bring your own Prometheus: a real Prometheus scrapes the simulated fleet's exporter pages
(dcgm-exporter, DME, vLLM, training), and the collector, given only that Prometheus as a
``prometheus`` target, writes the same canonical series the scraping collector writes,
with Prometheus' timestamps, once each, and the detectors find the fault through it."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hbmwatch.collector.engine import ScrapeEngine
from hbmwatch.collector.sources.federated import FederatedTranslator, selectors
from hbmwatch.detectors import default_detectors
from hbmwatch.detectors.context import Context
from hbmwatch.detectors.devices import Throttling
from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.records import Finding, SeriesKey
from hbmwatch.runtime.detection import DetectionRunner
from hbmwatch.runtime.service import build_collector
from hbmwatch.settings import CollectorSettings, Settings, StoreSettings
from hbmwatch.simulator.process import FleetInfo, FleetSpec, SimProcess
from hbmwatch.store.store import Store
from tests.conftest import make_store
from tests.prometheus_server import (
    PROMETHEUS,
    VICTORIA_METRICS,
    prometheus,
    victoria_metrics,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs the prometheus binary"),
]

#: One AMD node (DME) and one NVIDIA node (dcgm-exporter); GPU 3 of the NVIDIA node is
#: power-capped from the start, which the throttling detector reports.
SCENARIO = """
name = "byo"
duration = "30m"
seed = 7
[[racks]]
name = "r0"
nodes = 1
sku = "MI300X"
[[racks]]
name = "r1"
nodes = 1
sku = "H200"
[[faults]]
kind = "power_cap"
target = { host = "r1-node0", gpu = 3 }
onset = "0s"
"""


def scrape_config(info: FleetInfo) -> str:
    """One job per exporter kind; each target's labels (cluster, rack, host, service, gpu)
    as target labels, its path as ``__metrics_path__``: how a user would write it."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in info.targets:
        url = httpx.URL(t.url)
        labels = {**t.labels, "__metrics_path__": url.path}
        target = {"targets": [f"{url.host}:{url.port}"], "labels": labels}
        jobs.setdefault(t.kind, []).append(target)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": k, "static_configs": v} for k, v in jobs.items()],
    }
    return json.dumps(config)  # JSON is YAML


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetInfo, str]]:
    """The simulated fleet, and a Prometheus that has scraped every page of it."""
    tmp = tmp_path_factory.mktemp("byo")
    (tmp / "byo.toml").write_text(SCENARIO)
    spec = FleetSpec(str(tmp / "byo.toml"), None, 0, 1.0, str(tmp / "truth.json"), "warning")
    sim = SimProcess(spec)
    loop = asyncio.new_event_loop()
    info = loop.run_until_complete(sim.start())
    try:
        with prometheus(tmp, scrape_config(info)) as prom:
            wait_for(lambda: all_up(prom, len(info.targets)), "prometheus to scrape every page")
            yield info, prom
    finally:
        loop.run_until_complete(sim.stop())
        loop.close()


def all_up(server: str, targets: int) -> bool:
    up = httpx.get(f"{server}/api/v1/query", params={"query": "up"}).json()
    values = [r["value"][1] for r in up["data"]["result"]]
    return len(values) == targets and set(values) == {"1"}


def collector(tmp: Path, store: Store, prom: str) -> ScrapeEngine:
    target = {"kind": "prometheus", "url": prom, "host_label": "host"}
    settings = Settings(
        store=StoreSettings(url="sqlite://"),
        collector=CollectorSettings(targets=[target], spool_dir=str(tmp / "spool")),  # type: ignore[list-item]
    )
    return build_collector(settings, store, [])


def direct(tmp: Path, store: Store, info: FleetInfo) -> ScrapeEngine:
    """The scraping collector, over the same pages, for comparison."""
    targets = [t.as_dict() for t in info.targets]
    settings = Settings(collector=CollectorSettings(targets=targets, spool_dir=str(tmp / "s2")))
    return build_collector(settings, store, [])


async def rounds(
    engine: ScrapeEngine,
    n: int,
    prom: str | None = None,
    until: Callable[[], bool] | None = None,
    most: int = 30,
) -> None:
    """``n`` scrapes, each after Prometheus has scraped again (when reading through it);
    with ``until``, more (``most`` in all) until it holds."""
    async with engine:
        for done in range(most):
            if done >= n and (until is None or until()):
                return
            if prom is not None:
                await asyncio.to_thread(next_scrape, prom)
            await engine.scrape_round()
            await engine.sink.flush()
    assert until is None or until(), f"not met after {most} scrape rounds"


def next_scrape(prom: str) -> None:
    """Wait until Prometheus has scraped every page again."""
    before = newest_scrape(prom)
    wait_for(lambda: newest_scrape(prom) > before, "prometheus' next scrape")


def newest_scrape(prom: str) -> float:
    q = httpx.get(f"{prom}/api/v1/query", params={"query": "min(timestamp(up))"}).json()
    return float(q["data"]["result"][0]["value"][1])


#: Series that exist only for a latency window that held requests (quantiles, and the
#: window's request count): two readers at other moments need not see the same windows.
PER_WINDOW = ("workload_latency", "workload_window_requests")


def steady(series: dict[SeriesKey, Any]) -> set[SeriesKey]:
    return {k for k in series if not k.metric.startswith(PER_WINDOW)}


def stored(
    store: Store, names: str = "gpu_.*|workload_.*"
) -> dict[SeriesKey, tuple[list[int], list[float]]]:
    now = int(time.time() * 1000)
    names = Matcher("__name__", MatchOp.RE, "", re.compile(names))
    found, _ = store.select_samples([names], 0, now)
    return {key: (list(map(int, t)), list(map(float, v))) for key, t, v, _ in found}


def test_the_canonical_series_of_every_gpu_come_through_prometheus(
    fleet: tuple[FleetInfo, str], tmp_path: Path
) -> None:
    info, prom = fleet
    same_as_scraping(info, prom, tmp_path)


@pytest.mark.skipif(not Path(VICTORIA_METRICS).exists(), reason="needs victoria-metrics")
def test_and_through_victoria_metrics(fleet: tuple[FleetInfo, str], tmp_path: Path) -> None:
    """VictoriaMetrics serves ``/federate`` too; its own scrapes, the same config."""
    info, _ = fleet
    with victoria_metrics(tmp_path, scrape_config(info)) as vm:
        wait_for(lambda: all_up(vm, len(info.targets)), "victoria-metrics to scrape every page")
        same_as_scraping(info, vm, tmp_path)


def same_as_scraping(info: FleetInfo, prom: str, tmp_path: Path) -> None:
    """What the collector writes through ``prom`` is what it writes scraping the pages."""
    byo_store = make_store(f"sqlite:///{tmp_path / 'byo.db'}", time.time)  # type: ignore[arg-type]
    ref_store = make_store(f"sqlite:///{tmp_path / 'ref.db'}", time.time)  # type: ignore[arg-type]
    engine = collector(tmp_path, byo_store, prom)
    # A latency window shows only while it holds requests: on a busy machine the server may
    # scrape the vLLM pages between windows for a round or two, so read until one was seen.
    asyncio.run(rounds(engine, 2, prom, until=lambda: bool(stored(byo_store, "workload_lat.*"))))
    assert engine.sink.totals.rejected == 0 and engine.sink.totals.accepted > 0
    health = {
        k for k in stored(byo_store, "hbmwatch_target_up") if k.label("source") != "prometheus"
    }
    assert len(health) == len(info.targets)  # each exporter's up, as Prometheus saw it
    asyncio.run(rounds(direct(tmp_path, ref_store, info), 2, prom))  # paced alike
    byo, ref = stored(byo_store), stored(ref_store)

    # The same canonical series as scraping the exporters, for every simulated GPU.
    # Latency quantiles and window counts exist only for a window that held requests, which
    # two readers reading at other moments need not share: the rest must be equal, and every
    # quantile belong to a window read.
    plain_byo, plain_ref = steady(byo), steady(ref)
    only_byo = sorted(k.text for k in plain_byo - plain_ref)
    only_ref = sorted(k.text for k in plain_ref - plain_byo)
    assert not only_byo and not only_ref, (len(only_byo), only_byo[:2], len(only_ref), only_ref[:2])
    windows = {k.labels for k in byo if k.metric == "workload_window_requests"}
    quantiles = [k for k in byo if k.metric.startswith("workload_latency")]
    assert quantiles and all(
        tuple(kv for kv in k.labels if kv[0] != "quantile") in windows for k in quantiles
    )
    gpus = {(k.label("host"), k.label("gpu")) for k in byo if k.metric == "gpu_power_watts"}
    assert len(gpus) == info.gpus
    assert {d.host for d in byo_store.devices()} == {t.labels["host"] for t in info.targets}

    # Prometheus' timestamps, each sample once, strictly increasing.
    for times, _ in byo.values():
        assert times == sorted(set(times))

    # Values as Prometheus holds them, at their timestamps: a temperature read as is and a
    # power in watts, on each vendor.
    for host, gpu in sorted(gpus)[::5]:
        for metric, raw in (
            ("gpu_memory_temperature_celsius", MEMORY_TEMPERATURE),
            ("gpu_power_watts", POWER),
        ):
            key = next(k for k in byo if k.metric == metric and k.label("host") == host
                       and k.label("gpu") == gpu)  # fmt: skip
            times, values = byo[key]
            held = prometheus_samples(prom, raw, host, gpu)
            for ts, value in zip(times, values, strict=True):
                assert held[ts] == pytest.approx(value), (key, ts)

    # A re-read of an unchanged server writes nothing new.
    engine = collector(tmp_path, byo_store, prom)
    translator = engine.state(engine.targets.current()[0]).translator
    assert isinstance(translator, FederatedTranslator)
    page = httpx.get(f"{prom}/federate", params=translator.params).text
    assert translator.translate_text(page, 0).samples
    assert translator.translate_text(page, 0).samples == []
    byo_store.close()
    ref_store.close()


MEMORY_TEMPERATURE = "DCGM_FI_DEV_MEMORY_TEMP(_CELSIUS)?|(amd_)?gpu_memory_temperature"
POWER = "DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_BOARD_POWER_WATTS|(amd_)?gpu_package_power"


def prometheus_samples(prom: str, names: str, host: str, gpu: str) -> dict[int, float]:
    """Raw samples of the last minute of one GPU's series named ``names`` (a regex)."""
    selector = f'{{__name__=~"{names}",host="{host}"}}[1m]'
    result = httpx.get(f"{prom}/api/v1/query", params={"query": selector}).json()["data"]
    out: dict[int, float] = {}
    for series in result["result"]:
        labels = series["metric"]
        if (labels.get("gpu") or labels.get("gpu_id")) != gpu:
            continue
        out.update({round(float(t) * 1000): float(v) for t, v in series["values"]})
    return out


def test_the_selectors_come_from_the_spelling_tables() -> None:
    dcgm, dme, inference, up = selectors(["dcgm", "dme", "inference"])
    assert "DCGM_FI_DEV_MEMORY_TEMP" in dcgm and "amd_gpu_package_power" in dme
    assert "vllm:e2e_request_latency_seconds_bucket" in inference and up == "up"


def test_the_detectors_find_the_fault_through_prometheus(
    fleet: tuple[FleetInfo, str], tmp_path: Path
) -> None:
    """The power-capped GPU's throttling, found from what Prometheus held, not the pages."""
    _, prom = fleet
    store = make_store(f"sqlite:///{tmp_path / 'byo.db'}", time.time)  # type: ignore[arg-type]
    # The throttling detector as the service runs it, less its 10 s minimum episode: the
    # point is the path (Prometheus, federate, translators, store, frames), not the timing.
    detectors = [Throttling(min_on_s=2.0) if isinstance(d, Throttling) else d
                 for d in default_detectors()]  # fmt: skip
    runner = DetectionRunner(store, detectors, context=Context())
    runner.start()
    engine = collector(tmp_path, store, prom)

    async def until_found() -> list[Finding]:
        async with engine:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                await asyncio.to_thread(next_scrape, prom)
                await engine.scrape_round()
                await engine.sink.flush()
                runner.cycle()
                found = store.findings.query(open_only=True)
                if any(f.entity.get("gpu") == "3" for f in found):
                    return found
        return store.findings.query()

    found = asyncio.run(until_found())
    store.close()
    hits = [(f.kind, f.entity.get("host"), f.entity.get("gpu"), f.top_cause) for f in found]
    assert ("throttle", "r1-node0", "3", "power_cap") in hits, hits
