"""``hbmwatch bench versus``: hbmwatch's collector into SQLite beside a real Prometheus
scraping the very same pages, one after the other, in one run.

One simulated fleet (``hbmwatch sim`` in its own process, at real time so every page
changes every second, one vLLM service a GPU: a node page per 8 GPUs plus an inference
page per GPU) is scraped twice at the same interval:

- H: ``hbmwatch collect`` (its embedded default: a SQLite file), then ``hbmwatch serve``
  over that file for the range query;
- P: Prometheus (Debian's) with a scrape config listing the same pages, its admin API on
  for a snapshot (the head written as a block) to weigh the bytes.

For each: CPU-seconds (user + sys from /proc) of the scraping process over the measured
window, samples stored in the window, the share of scheduled 1 s scrapes that were kept,
scrape duration p50/p99, bytes per sample at rest and a range query's median. Two
denominators are given: samples each stored (hbmwatch turns a 73-line vLLM page into about
20 quantile samples, Prometheus stores every line), and page samples scraped (the same
work offered to both).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from hbmwatch.bench.benchmarks import _scenario_toml, machine
from hbmwatch.bench.engines import EngineUnavailable, PrometheusServer, free_port
from hbmwatch.bench.realprom import SeriesSamples, create_blocks, dump_store
from hbmwatch.bench.scale import (
    Progress,
    _quiet,
    _tick,
    appended,
    cpu_seconds,
    prometheus_config,
    query,
    racks_of,
    simulated_fleet,
    stopped_totals,
    wait_for,
)
from hbmwatch.matchers import Matcher, MatchOp
from hbmwatch.runtime.service import migrate
from hbmwatch.settings import Settings, StoreSettings
from hbmwatch.store.bench import bytes_at_rest
from hbmwatch.store.store import open_store

DAY_S = 86_400
#: The range query both answer: every service's p99 end-to-end latency over the window.
HBMWATCH_QUERY = 'workload_latency_seconds{phase="e2e",quantile="0.99"}'
PROMETHEUS_QUERY = (
    "histogram_quantile(0.99, sum by (le, service, host, gpu) "
    "(rate(vllm:e2e_request_latency_seconds_bucket[1m])))"
)
QUERY_RUNS = 20


@dataclass(frozen=True)
class VersusSpec:
    gpus: int = 256
    seconds: float = 60.0
    interval_s: float = 1.0
    warmup_s: float = 15.0
    exporter_refresh_s: float = 0.0  # > 0: node exporters' pages change only this often


def inference_fleet_toml(gpus: int) -> str:
    """``racks_of(gpus)`` with no training job: one vLLM service (and page) a GPU."""
    racks = racks_of(gpus)
    return _scenario_toml({"name": "versus", "duration": "24h", "seed": 5, "racks": racks})


def _window(
    spec: VersusSpec,
    pid: int,
    progress: Progress,
    stage: str,
    count: Callable[[], float] = lambda: 0.0,
) -> tuple[float, float, float, float]:
    """Warm up, then the measured window: (start, end, CPU-s of ``pid`` in it, how much
    ``count`` grew in it): the samples are counted over the very span the CPU is."""
    _tick(f"{stage}: warm-up", spec.warmup_s, progress)
    counted, before, start = count(), cpu_seconds(pid), time.time()
    _tick(f"{stage}: measuring", spec.seconds, progress)
    cpu, end = cpu_seconds(pid) - before, time.time()
    return start, end, cpu, count() - counted


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    p50, p99 = np.percentile(np.array(values) * 1000, [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99)}


def _query_median(url: str, promql: str, start: float, end: float) -> dict[str, Any]:
    """Median wall milliseconds of ``QUERY_RUNS`` identical range queries at a 15 s step."""
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "15"}
    times, series = [], 0
    with httpx.Client(timeout=60) as client:
        for _ in range(QUERY_RUNS):
            began = time.perf_counter()
            answer = client.post(url, data=params).json()
            times.append((time.perf_counter() - began) * 1000)
            if answer.get("status") != "success":
                raise RuntimeError(f"{url} refused {promql}: {answer.get('error')}")
            series = len(answer["data"]["result"])
    return {"query": promql, "median_ms": statistics.median(times), "series": series}


# -- H: hbmwatch ---------------------------------------------------------------------------
def _hbmwatch_config(folder: Path, targets: Path, spec: VersusSpec, port: int) -> Path:
    store = StoreSettings(url=f"sqlite:///{folder / 'hbmwatch.db'}")
    migrate(Settings(store=store))
    lines = ['log_level = "info"', 'log_format = "json"', "[store]", f'url = "{store.url}"',
             "[api]", f"port = {port}", "[collector]", f'target_file = "{targets}"',
             f"interval_seconds = {spec.interval_s}",
             f'spool_dir = "{folder / "spool"}"']  # fmt: skip
    path = folder / "hbmwatch.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def hbmwatch_phase(folder: Path, spec: VersusSpec, targets: Path, progress: Progress) -> dict:
    """``hbmwatch collect`` into a fresh SQLite file, measured; then the file, read."""
    folder.mkdir(parents=True)
    port = free_port()
    config = _hbmwatch_config(folder, targets, spec, port)
    url = f"sqlite:///{folder / 'hbmwatch.db'}"
    argv = [sys.executable, "-m", "hbmwatch.cli", "collect", "--config", str(config)]
    with (folder / "collect.log").open("w") as log_file:
        collector = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        wait_for(lambda: _any_stored(url), "hbmwatch's first samples")
        start, end, cpu, _ = _window(spec, collector.pid, progress, "H  hbmwatch")
    finally:
        collector.terminate()
        collector.wait(timeout=120)
    totals = stopped_totals(folder / "collect.log")
    phase = {"title": "hbmwatch collect -> SQLite", "cpu_s": cpu, "window_s": end - start,
             "written": int(totals["written"]) + int(totals["replayed"]),
             "spooled": int(totals["spooled"])}  # fmt: skip
    phase.update(_hbmwatch_reads(url, start, end, spec))
    phase.update(_hbmwatch_bytes(url, start, end, folder))
    phase["range_query"] = _serve_query(config, port, start, end, folder)
    return phase


def _any_stored(url: str) -> bool:
    """Whether the store holds a sample yet (stops at the first series that has one)."""
    store = open_store(StoreSettings(url=url))
    try:
        return next(iter(dump_store(store)), None) is not None
    finally:
        store.close()


def _hbmwatch_reads(url: str, start: float, end: float, spec: VersusSpec) -> dict[str, Any]:
    """Rounds kept and scrape durations in the window, from its own series."""
    lo, hi = int(start * 1000), int(end * 1000)
    store = open_store(
        StoreSettings(url=url, max_points_per_query=10**9, max_series_per_query=10**6)
    )
    try:
        ups, _ = store.select_samples(_named("hbmwatch_target_up"), lo, hi - 1)
        durations, _ = store.select_samples(_named("hbmwatch_scrape_duration_seconds"), lo, hi - 1)
    finally:
        store.close()
    rounds = (end - start) / spec.interval_s
    kept = [len(times) / rounds for _, times, _, _ in ups]
    values = [float(v) for _, _, vals, _ in durations for v in vals]
    return {"targets": len(ups),
            "rounds_kept": float(np.mean(kept)) if kept else 0.0,
            "scrape": _quantiles(values)}  # fmt: skip


def _named(metric: str) -> list[Matcher]:
    return [Matcher("__name__", MatchOp.EQ, metric)]


def _hbmwatch_bytes(url: str, start: float, end: float, folder: Path) -> dict[str, Any]:
    """Every closed minute compacted (a clock an hour on), then the file weighed; and the
    very same samples as a Prometheus block (``promtool tsdb create-blocks-from``)."""
    store = open_store(StoreSettings(url=url), clock=lambda: end + 3600)
    try:
        store.compact()
        sizes = bytes_at_rest(store.engine)
        every = list(dump_store(store))
        same_data = _block_of(every, folder / "same-data")
    finally:
        store.close()
    total = sum(len(s.timestamps_ms) for s in every)
    lo, hi = int(start * 1000), int(end * 1000)  # the samples stored in the measured window
    window = sum(int(((s.timestamps_ms >= lo) & (s.timestamps_ms < hi)).sum()) for s in every)
    first = min(int(s.timestamps_ms[0]) for s in every)
    last = max(int(s.timestamps_ms[-1]) for s in every)
    samples_only = sum(v for k, v in sizes.items() if k.startswith(("samples_", "rollup")))
    registry = sum(sizes.values()) - samples_only
    span_s = max(1.0, (last - first) / 1000)
    return {"samples": window, "stored_total": total, "bytes": sizes,
            "bytes_per_sample": sum(sizes.values()) / total,
            "sample_bytes_per_sample": samples_only / total,
            # a day of samples per series carries the same registry: its share shrinks
            "bytes_per_sample_day": (samples_only + registry * span_s / DAY_S) / total,
            "prometheus_block_same_data": same_data}  # fmt: skip


def _block_of(every: list[SeriesSamples], folder: Path) -> dict[str, Any]:
    """Bytes per sample of a Prometheus block holding exactly these samples."""
    try:
        tsdb = create_blocks(every, folder)
    except EngineUnavailable as exc:
        return {"skipped": str(exc)}
    files = [p for p in tsdb.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    index = sum(p.stat().st_size for p in files if p.name == "index")
    samples = sum(int(json.loads(p.read_text())["stats"]["numSamples"])
                  for p in tsdb.rglob("meta.json"))  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    return {"samples": samples, "bytes": size, "index_bytes": index,
            "bytes_per_sample": size / samples if samples else float("nan")}  # fmt: skip


def _serve_query(config: Path, port: int, start: float, end: float, folder: Path) -> dict:
    argv = [sys.executable, "-m", "hbmwatch.cli", "serve", "--config", str(config)]
    with (folder / "serve.log").open("w") as log_file:
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_file)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base + "/healthz"), "hbmwatch serve")
        return _query_median(base + "/prometheus/api/v1/query_range", HBMWATCH_QUERY, start, end)
    finally:
        server.terminate()
        server.wait(timeout=60)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


# -- P: Prometheus -------------------------------------------------------------------------
def prometheus_phase(folder: Path, spec: VersusSpec, targets: list[dict[str, Any]],
                     progress: Progress) -> dict[str, Any]:  # fmt: skip
    config = prometheus_config(targets, spec.interval_s)
    with PrometheusServer(folder, config=config, extra=["--web.enable-admin-api"]) as prom:
        wait_for(lambda: appended(prom) > 0, "Prometheus' first samples")
        start, end, cpu, samples = _window(spec, prom.pid, progress, "P  Prometheus",
                                           count=lambda: appended(prom))  # fmt: skip
        window = f"[{int((end - start) * 1000)}ms]"
        page = query(prom, f"sum(sum_over_time(scrape_samples_scraped{window}))", at=end)
        kept = query(prom, f"avg(count_over_time(up{window}))", at=end)
        durations = _raw_values(prom.url, f"scrape_duration_seconds{window}", end)
        range_query = _query_median(prom.url + "/api/v1/query_range", PROMETHEUS_QUERY, start,
                                    end)  # fmt: skip
        weighed = _prometheus_bytes(prom)
    return {"title": "Prometheus scraping the same pages", "cpu_s": cpu, "window_s": end - start,
            "samples": samples, "page_samples": page, "targets": len(targets),
            "rounds_kept": kept / ((end - start) / spec.interval_s),
            "scrape": _quantiles(durations), "range_query": range_query, **weighed}  # fmt: skip


def _raw_values(url: str, selector: str, at: float) -> list[float]:
    answer = httpx.post(url + "/api/v1/query", data={"query": selector, "time": f"{at:.3f}"},
                        timeout=120).json()  # fmt: skip
    return [float(v) for s in answer["data"]["result"] for _, v in s["values"]]


def _prometheus_bytes(prom: PrometheusServer) -> dict[str, Any]:
    """A snapshot writes the head as a block: its files over every sample appended."""
    total = appended(prom)
    answer = httpx.post(prom.url + "/api/v1/admin/tsdb/snapshot", timeout=300).json()
    snapshot = prom.folder / "data" / "snapshots" / answer["data"]["name"]
    files = [p for p in snapshot.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    index = sum(p.stat().st_size for p in files if p.name == "index")
    return {"stored_total": total, "bytes": {"block": size, "index": index},
            "bytes_per_sample": size / total,
            "sample_bytes_per_sample": (size - index) / total}  # fmt: skip


# -- the run -------------------------------------------------------------------------------
def bench_versus(spec: VersusSpec, *, workdir: Path | None = None,
                 progress: Progress = _quiet) -> dict[str, Any]:  # fmt: skip
    """Phases H and P over one fleet (module doc); no Prometheus skips P, saying why."""
    report: dict[str, Any] = {"machine": machine(), "gpus": spec.gpus, "seconds": spec.seconds,
                              "interval_s": spec.interval_s, "warmup_s": spec.warmup_s,
                              "exporter_refresh_s": spec.exporter_refresh_s,
                              "phases": {}, "skipped": []}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        progress("starting the simulated fleet", 0, 1)
        toml = inference_fleet_toml(spec.gpus)
        fleet = simulated_fleet(folder, spec.gpus, toml=toml, speed=1.0,
                                exporter_refresh_s=spec.exporter_refresh_s)  # fmt: skip
        with fleet as (fleet_pid, targets):
            progress("starting the simulated fleet", 1, 1)
            report["targets"] = len(targets)
            fleet_before = cpu_seconds(fleet_pid)
            report["phases"]["hbmwatch"] = hbmwatch_phase(
                folder / "H", spec, folder / "targets.json", progress
            )
            try:
                report["phases"]["prometheus"] = prometheus_phase(
                    folder / "P", spec, targets, progress
                )
            except EngineUnavailable as exc:
                report["skipped"].append({"phase": "prometheus", "why": str(exc)})
            report["fleet_cpu_s"] = cpu_seconds(fleet_pid) - fleet_before
    _compare(report)
    return report


def _compare(report: dict[str, Any]) -> None:
    phases = report["phases"]
    for phase in phases.values():
        phase["cpu_per_million"] = phase["cpu_s"] / (phase["samples"] / 1e6 or float("nan"))
        phase["cores"] = phase["cpu_s"] / phase["window_s"]
    prom = phases.get("prometheus")
    if prom is None:
        return
    page_rate = prom["page_samples"] / prom["window_s"]
    for phase in phases.values():  # the same work offered to both: the pages' lines
        offered = page_rate * phase["window_s"] / 1e6 or float("nan")
        phase["cpu_per_million_page_samples"] = phase["cpu_s"] / offered
    ours = phases["hbmwatch"]
    report["ratios"] = {
        "cpu_per_sample_stored": ours["cpu_per_million"] / prom["cpu_per_million"],
        "cpu_per_page_sample": ours["cpu_per_million_page_samples"]
        / prom["cpu_per_million_page_samples"],
        "bytes_per_sample": ours["bytes_per_sample"] / prom["bytes_per_sample"],
        "bytes_per_sample_day": ours["bytes_per_sample_day"] / prom["bytes_per_sample"],
        "bytes_per_sample_same_data": ours["bytes_per_sample"]
        / ours["prometheus_block_same_data"].get("bytes_per_sample", float("nan")),
        "range_query_median": ours["range_query"]["median_ms"] / prom["range_query"]["median_ms"],
    }
