"""``hbmwatch bench ...``: throughput and size figures, each beside its baseline.

Benchmarks print a table and can write JSON; docs/benchmarks.md records the figures with
the command and the machine.  Nothing here asserts a speed: tests check behaviour only.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.runtime.service import tune_gc
from hbmwatch.settings import StoreSettings
from hbmwatch.store.bench import PostgresCeiling, SqliteCeiling, bytes_at_rest
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.store import Store, open_store


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


@dataclass
class TelemetryShape:
    """Synthetic per-GPU telemetry with the value shapes real sensors have.

    Integral temperatures that drift, milliwatt power, steady clocks, byte counters that
    climb by millions a second, error counters that rarely move: about 92 series a GPU.
    """

    gpus: int
    seed: int = 0
    keys: list[SeriesKey] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for g in range(self.gpus):
            base = {
                "cluster": "bench",
                "rack": f"r{g // 64}",
                "host": f"node{g // 8:04d}",
                "gpu": str(g % 8),
                "sku": "MI300X",
                "vendor": "amd",
            }
            add = self._add
            add("gpu_hotspot_temperature_celsius", base, "temp")
            add("gpu_memory_temperature_celsius", base, "temp")
            for stack in range(8):
                add("gpu_hbm_stack_temperature_celsius", {**base, "stack": str(stack)}, "temp")
            add("gpu_memory_bandwidth_utilization_ratio", base, "ratio")
            add("gpu_utilization_ratio", base, "ratio")
            add("gpu_memory_used_bytes", base, "steady_big")
            add("gpu_memory_total_bytes", base, "constant")
            add("gpu_power_watts", base, "power")
            add("gpu_power_limit_watts", base, "constant")
            add("gpu_energy_joules_total", base, "energy")
            for domain in ("compute", "memory", "soc"):
                add("gpu_clock_hertz", {**base, "domain": domain}, "clock")
            for reason in (
                "hbm_thermal",
                "socket_thermal",
                "vr_thermal",
                "power",
                "prochot",
                "sw_thermal",
                "hw_thermal",
                "hw_slowdown",
                "power_brake",
                "board_limit",
                "sync_boost",
                "reliability",
                "low_utilization",
            ):
                add("gpu_throttle_seconds_total", {**base, "reason": reason}, "rare_counter")
                add("gpu_throttle_active", {**base, "reason": reason}, "flag")
            for link in range(7):
                for direction in ("rx", "tx"):
                    add(
                        "gpu_fabric_bytes_total",
                        {**base, "fabric": "xgmi", "link": str(link), "direction": direction},
                        "bytes",
                    )
                for error in ("crc", "replay"):
                    add(
                        "gpu_fabric_errors_total",
                        {**base, "fabric": "xgmi", "link": str(link), "error": error},
                        "rare_counter",
                    )
                add(
                    "gpu_fabric_link_bandwidth_bytes_per_second",
                    {**base, "fabric": "xgmi", "link": str(link)},
                    "constant",
                )
            for direction in ("rx", "tx"):
                add("gpu_pcie_bytes_total", {**base, "direction": direction}, "bytes")
                add("gpu_pcie_naks_total", {**base, "direction": direction}, "rare_counter")
            add("gpu_pcie_replays_total", base, "rare_counter")
            add("gpu_pcie_recoveries_total", base, "rare_counter")
            add("gpu_pcie_link_width_lanes", base, "constant")
            add("gpu_pcie_link_speed_transfers_per_second", base, "constant")
            for severity in ("correctable", "uncorrectable", "deferred"):
                add("gpu_ecc_errors_total", {**base, "severity": severity}, "rare_counter")
        self._rng = np.random.default_rng(self.seed)
        kinds = np.array(self.kinds)
        self._masks = {k: kinds == k for k in set(self.kinds)}
        n = len(self.keys)
        self._state = np.zeros(n)
        init = {
            "temp": 45.0,
            "ratio": 0.6,
            "steady_big": 96e9,
            "constant": 192e9,
            "power": 550.0,
            "energy": 1e9,
            "clock": 2.1e9,
            "rare_counter": 0.0,
            "flag": 0.0,
            "bytes": 1e12,
        }
        for kind, mask in self._masks.items():
            self._state[mask] = init[kind]

    def _add(self, metric: str, labels: dict[str, str], kind: str) -> None:
        self.keys.append(SeriesKey(metric, labels))
        self.kinds.append(kind)

    def tick(self) -> np.ndarray:
        """Advance one second and return every series' value."""
        rng, s, m = self._rng, self._state, self._masks
        s[m["temp"]] = np.clip(
            s[m["temp"]] + rng.choice([-1.0, 0, 0, 0, 1.0], m["temp"].sum()), 35, 85
        )
        s[m["ratio"]] = np.round(
            np.clip(s[m["ratio"]] + rng.normal(0, 0.03, m["ratio"].sum()), 0, 1), 2
        )
        s[m["power"]] = np.round(
            np.clip(s[m["power"]] + rng.normal(0, 8, m["power"].sum()), 120, 750), 3
        )
        s[m["energy"]] += np.round(s[m["power"]], 3)
        s[m["bytes"]] += rng.integers(10**8, 4 * 10**8, m["bytes"].sum())
        bump = rng.random(m["rare_counter"].sum()) < 0.002
        s[m["rare_counter"]] += bump
        s[m["flag"]] = (rng.random(m["flag"].sum()) < 0.01).astype(float)
        steps = rng.random(m["clock"].sum()) < 0.01
        s[m["clock"]] = np.where(steps, rng.choice([1.9e9, 2.1e9], m["clock"].sum()), s[m["clock"]])
        return s.copy()

    def samples(self, start_ms: int, seconds: int) -> Iterator[list[Sample]]:
        """One list of samples per second, for every series."""
        keys = self.keys
        for i in range(seconds):
            ts = start_ms + i * 1000
            values = self.tick().tolist()
            yield [Sample(k, ts, v) for k, v in zip(keys, values, strict=True)]


def _migrated_store(url: str, clock: Any) -> Store:
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    return open_store(StoreSettings(url=url), clock=clock)


BENCH_SCHEMA = "hbmwatch_bench"


def bench_postgres_url(url: str) -> str:
    """The same server and database, confined to a scratch schema the benchmark owns."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.update_query_dict({"options": f"-csearch_path={BENCH_SCHEMA}"}).render_as_string(
        hide_password=False
    )


def _reset_postgres(url: str) -> None:
    from sqlalchemy import text

    engine = create_store_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {BENCH_SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {BENCH_SCHEMA}"))
    engine.dispose()


def ingest(
    store: Store, ceiling: Any, shape: TelemetryShape, start_ms: int, seconds: int, batch: int
) -> dict[str, float]:
    """Write ``seconds`` of the fleet; time the store and the bare driver batch by batch.

    Even seconds go through ``write`` (samples named by ``SeriesKey``), odd ones through
    ``write_rows`` (ids resolved once, as the collector does); the bare driver writes every
    second into its own file.  The garbage collector is tuned as ``hbmwatch up`` tunes it.
    """
    ticks = shape.samples(start_ms, seconds + 1)
    warm = next(ticks)  # the first scrape registers every series: timed on its own
    started = time.perf_counter()
    for i in range(0, len(warm), batch):
        store.write(warm[i : i + batch])
    register_s = time.perf_counter() - started
    tune_gc()
    ids = store.series_registry.ids
    spent = {"keys": 0.0, "ids": 0.0, "ceiling": 0.0}
    counted = {"keys": 0, "ids": 0, "ceiling": 0}
    for n, samples in enumerate(ticks):
        path = "keys" if n % 2 == 0 else "ids"
        for i in range(0, len(samples), batch):
            part = samples[i : i + batch]
            rows = [(s.timestamp_ms, ids[s.series.text], s.value) for s in part]
            t0 = time.perf_counter()
            result = store.write(part) if path == "keys" else store.write_rows(rows)
            spent[path] += time.perf_counter() - t0
            if result.accepted != len(part):
                raise RuntimeError(f"benchmark batch not fully accepted: {result}")
            spent["ceiling"] += ceiling.write(rows)
            counted[path] += len(part)
            counted["ceiling"] += len(part)
    rate = {k: counted[k] / spent[k] for k in spent}
    return {
        "series": len(shape.keys),
        "samples": counted["ceiling"],
        "register_seconds": register_s,
        "store_samples_per_second": rate["keys"],
        "store_ids_samples_per_second": rate["ids"],
        "ceiling_samples_per_second": rate["ceiling"],
        "ratio": rate["keys"] / rate["ceiling"],
        "ratio_ids": rate["ids"] / rate["ceiling"],
    }


def bench_store(
    *,
    gpus: int,
    seconds: int,
    batch: int,
    size_gpus: int,
    size_minutes: int,
    pg_url: str | None,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Ingest, bytes at rest and a rollup range query; SQLite, and PostgreSQL when given."""
    report: dict[str, Any] = {
        "machine": machine(),
        "gpus": gpus,
        "seconds": seconds,
        "batch": batch,
    }
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmpdir = Path(tmp)
        now = time.time()
        start_ms = int((now - seconds - 5) * 1000)
        start_ms -= start_ms % 1000
        clock = time.time
        backends = [("sqlite", f"sqlite:///{tmpdir / 'bench.db'}")]
        if pg_url:
            backends.append(("postgresql", bench_postgres_url(pg_url)))
        for name, url in backends:
            if name == "postgresql":
                _reset_postgres(url)
            store = _migrated_store(url, clock)
            ceiling = (
                SqliteCeiling(tmpdir / "ceiling.db") if name == "sqlite" else PostgresCeiling(url)
            )
            try:
                report[f"ingest_{name}"] = ingest(
                    store, ceiling, TelemetryShape(gpus), start_ms, seconds, batch
                )
            finally:
                ceiling.close()
                store.close()
            report[f"size_{name}"] = bytes_per_sample(url, size_gpus, size_minutes)
            report[f"query_{name}"] = day_query(url)
    return report


def bytes_per_sample(url: str, gpus: int, minutes: int) -> dict[str, Any]:
    """Bytes at rest per sample after ``minutes`` of a ``gpus`` fleet are compacted."""
    if url.startswith("postgresql"):
        _reset_postgres(url)
    else:
        Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
    seconds = minutes * 60
    start_ms = int(time.time() * 1000) - (seconds + 600) * 1000
    start_ms -= start_ms % 60_000
    store = _migrated_store(url, time.time)
    shape = TelemetryShape(gpus, seed=1)
    written = 0
    try:
        for samples in shape.samples(start_ms, seconds):
            written += store.write(samples).accepted
        started = time.perf_counter()
        report = store.compact()
        compact_s = time.perf_counter() - started
        sizes = bytes_at_rest(store.engine, vacuum=True)
    finally:
        store.close()
    total = sum(sizes.values())
    return {
        "series": len(shape.keys),
        "samples": written,
        "bytes": sizes,
        "bytes_per_sample": total / written,
        "sample_bytes_per_sample": (
            sizes["samples_chunk"] + sizes.get("samples_hour", 0) + sizes["samples_head_batch"]
        )
        / written,
        "compaction_samples_per_second": report.samples / compact_s,
    }


def day_query(url: str, runs: int = 20) -> dict[str, Any]:
    """One series, one day at 1 s, compacted, queried at a 1-minute step (from the 1-minute
    tier) and at a 90 s step (from raw samples)."""
    if url.startswith("postgresql"):
        _reset_postgres(url)
    else:
        Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
    now = time.time()
    start_ms = int((now - 86_400 - 600) * 1000)
    start_ms -= start_ms % 60_000
    store = _migrated_store(url, time.time)
    key = SeriesKey("gpu_memory_temperature_celsius", {"host": "day", "gpu": "0"})
    rng = np.random.default_rng(2)
    values = np.round(50 + np.cumsum(rng.choice([-1.0, 0, 0, 1.0], 86_400)) / 10)
    try:
        for hour in range(24):
            store.write(
                Sample(key, start_ms + (hour * 3600 + i) * 1000, float(values[hour * 3600 + i]))
                for i in range(3600)
            )
        # As the running service holds a day: its periodic compaction has re-packed every
        # closed hour (one pass takes at most ``HOURS_PER_PASS`` of them).
        while store.compact().hours:
            pass
        selector = parse_selector('gpu_memory_temperature_celsius{host="day"}')
        begin, end = start_ms / 1000, start_ms / 1000 + 86_400
        timings = []
        for _ in range(runs):
            t0 = time.perf_counter()
            result = store.range_query(selector, begin, end, 60, Aggregation.AVG)
            timings.append(time.perf_counter() - t0)
        raw_timings = []
        for _ in range(max(3, runs // 4)):
            t0 = time.perf_counter()
            store.range_query(selector, begin, end, 90, Aggregation.AVG)
            raw_timings.append(time.perf_counter() - t0)
    finally:
        store.close()
    return {
        "points": len(result.series[0].points),
        "tier": result.tier,
        "median_ms": statistics.median(timings) * 1000,
        "p95_ms": sorted(timings)[int(0.95 * (len(timings) - 1))] * 1000,
        "raw_step90_median_ms": statistics.median(raw_timings) * 1000,
    }


def write_json(report: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=2) + "\n")


def fleet_scenario(gpus: int, *, duration: str = "1h", pods: bool = False) -> dict[str, Any]:
    """A mixed fleet of ``gpus`` GPUs (multiple of 64), 8 nodes a rack, four SKUs; ``pods``:
    Kubernetes pod labels on every device line of a GPU that serves, as the exporters write."""
    skus = ("MI300X", "H200", "MI355X", "H100")
    racks = [{"name": f"r{i}", "nodes": 8, "sku": skus[i % 4]} for i in range(gpus // 64)]
    for rack in racks if pods else ():
        rack["pods"] = True
    return {"name": "bench", "duration": duration, "seed": 3, "racks": racks}


def bench_sim(*, gpus: int, steps: int) -> dict[str, Any]:
    """Simulated seconds per wall second at 1 s steps, and the cost of rendering every page."""
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import scenario_from_dict

    scenario = scenario_from_dict(fleet_scenario(gpus))
    t0 = time.perf_counter()
    sim = Simulation(scenario, start_unix=1_800_000_000)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        sim.step()
    step_s = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    lines = 0
    for node in range(len(sim.fleet.nodes)):
        lines += (sim.node_page(node) or "").count("\n")
    for service in range(len(sim.fleet.services)):
        lines += sim.service_page(service).count("\n")
    render_s = time.perf_counter() - t0
    return {
        "machine": machine(),
        "gpus": sim.fleet.size,
        "services": len(sim.fleet.services),
        "steps": steps,
        "build_and_warm_up_seconds": build_s,
        "step_milliseconds": step_s * 1000,
        "faster_than_real_time": scenario.step / step_s,
        "render_all_pages_seconds": render_s,
        "page_lines": lines,
        "faster_than_real_time_with_1s_scrapes": scenario.step / (step_s + render_s),
    }


def _scenario_toml(scenario: dict[str, Any]) -> str:
    lines = [
        f'name = "{scenario["name"]}"',
        f'duration = "{scenario["duration"]}"',
        f"seed = {scenario['seed']}",
    ]
    for rack in scenario["racks"]:
        lines += ["", "[[racks]]", *(f"{k} = {json.dumps(v)}" for k, v in rack.items())]
    for job in scenario.get("workload", {}).get("training", []):
        lines += ["", "[[workload.training]]", *(f"{k} = {json.dumps(v)}" for k, v in job.items())]
    return "\n".join(lines) + "\n"


def _page_of(kind: str, gpus: int, pods: bool = False) -> str:
    """One page holding ``gpus`` GPUs of one exporter (node pages of the simulator, joined)."""
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import scenario_from_dict

    sku = "MI300X" if kind == "dme" else "H100"
    scenario = scenario_from_dict(
        {
            "name": "page",
            "duration": "1h",
            "seed": 4,
            "racks": [{"name": "r0", "nodes": gpus // 8, "sku": sku, "pods": pods}],
        }
    )
    sim = Simulation(scenario, start_unix=1_800_000_000)
    sim.step()
    return "".join(sim.node_page(i) or "" for i in range(len(sim.fleet.nodes)))


def parse_rates(kind: str, gpus: int, rounds: int = 20, pods: bool = False) -> dict[str, Any]:
    """Lines per second: hbmwatch's cached parser + translation, and prometheus_client's."""
    from prometheus_client.parser import text_string_to_metric_families

    from hbmwatch.collector.exposition import SeriesCache, parse
    from hbmwatch.collector.sources.dcgm import DcgmTranslator
    from hbmwatch.collector.sources.dme import DmeTranslator

    page = _page_of(kind, gpus, pods)
    lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    cache = SeriesCache()
    translator = DmeTranslator() if kind == "dme" else DcgmTranslator()
    t0 = time.perf_counter()
    translator.translate_text(page, 0)
    first = time.perf_counter() - t0

    def best(call: Any) -> float:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        return min(times)

    parse_only = best(lambda: parse(page, cache))
    parse(page, cache)
    translated = best(lambda: translator.translate_text(page, 0))
    reference = best(lambda: [s for f in text_string_to_metric_families(page) for s in f.samples])
    return {
        "kind": kind,
        "gpus": gpus,
        "lines": lines,
        "bytes": len(page),
        "first_scrape_lines_per_second": lines / first,
        "parse_lines_per_second": lines / parse_only,
        "translate_lines_per_second": lines / translated,
        "prometheus_client_lines_per_second": lines / reference,
        "speedup_parse": reference / parse_only,
        "speedup_translate": reference / translated,
    }


def scrape_to_store(
    gpus: int, rounds: int, workdir: Path | None = None, pods: bool = False
) -> dict[str, Any]:
    """Scrape a simulated fleet (served by another process) into SQLite, round after round."""
    import asyncio
    import subprocess
    import sys

    from hbmwatch.collector.engine import BatchingSink, ScrapeEngine
    from hbmwatch.collector.spool import Spool
    from hbmwatch.collector.targets import Target, TargetSet
    from hbmwatch.collector.writer import SpoolingWriter
    from hbmwatch.runtime.service import tune_gc
    from hbmwatch.settings import CollectorSettings

    scenario = fleet_scenario(gpus, pods=pods)
    scenario["workload"] = {
        "training": [{"name": f"job{r['name']}", "racks": [r["name"]]} for r in scenario["racks"]]
    }
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        (folder / "fleet.toml").write_text(_scenario_toml(scenario))
        targets_file = folder / "targets.json"
        # The exporters run on the GPU hosts, not beside hbmwatch: a slow simulated clock
        # (one render of every page per simulated step) keeps them off this host's cores.
        argv = [sys.executable, "-m", "hbmwatch.cli", "sim", str(folder / "fleet.toml"),
                "--port", "0", "--speed", "0.01", "--targets", str(targets_file),
                "--truth", str(folder / "truth.json")]  # fmt: skip
        sim = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not targets_file.exists() or not targets_file.read_text().strip():
                if time.monotonic() > deadline or sim.poll() is not None:
                    raise RuntimeError("the simulator did not start")
                time.sleep(0.2)
            listed = json.loads(targets_file.read_text())
            targets = [Target(t["kind"], t["url"], t["labels"], 1.0, 30.0) for t in listed]
            store = _migrated_store(f"sqlite:///{folder / 'collect.db'}", time.time)
            # The slow clock serves each page unchanged for many rounds: read them as pages
            # that change every scrape, which is what this figure measures.
            settings = CollectorSettings(flush_samples=50_000, skip_unchanged_pages=False)
            sink = BatchingSink(
                SpoolingWriter(store.write, Spool(folder / "spool", 2**30)),
                settings.flush_samples,
                settings.flush_seconds,
            )
            engine = ScrapeEngine(TargetSet(settings, targets), sink, settings)

            async def run() -> tuple[float, int, int]:
                async with engine:
                    await engine.scrape_round()  # registers every series
                    await sink.flush()
                    tune_gc()
                    before = sink.totals.accepted
                    t0 = time.perf_counter()
                    for _ in range(rounds):
                        await engine.scrape_round()
                        await sink.flush()
                    return time.perf_counter() - t0, sink.totals.accepted - before, len(targets)

            elapsed, stored, n_targets = asyncio.run(run())
            store.close()
        finally:
            sim.terminate()
            sim.wait(timeout=30)
    return {
        "gpus": gpus,
        "targets": n_targets,
        "rounds": rounds,
        "samples": stored,
        "seconds": elapsed,
        "samples_per_second": stored / elapsed,
        "round_seconds": elapsed / rounds,
    }


def bench_collect(*, gpus: int, page_gpus: int, rounds: int, pods: bool = False) -> dict[str, Any]:
    return {
        "machine": machine(),
        "pods": pods,
        "parse_dme": parse_rates("dme", page_gpus, pods=pods),
        "parse_dcgm": parse_rates("dcgm", page_gpus, pods=pods),
        "scrape_to_store": scrape_to_store(gpus, rounds, pods=pods),
    }


def bench_detect(*, gpus: int, minutes: int, workdir: Path | None = None) -> dict[str, Any]:
    """Detection cycles over each newest minute of a simulated fleet, scraped into SQLite.

    The fleet runs through the real path (HTTP exporters and vLLM pages, scrape engine,
    store, detection runner) on the simulated clock, with a cycle every 60 simulated
    seconds; three faults give the detectors findings to open and rank.
    """
    import asyncio
    import statistics

    from hbmwatch.evaluation.run import run_scenario
    from hbmwatch.simulator.scenario import scenario_from_dict

    spec = fleet_scenario(gpus, duration=f"{minutes}m")
    spec["faults"] = [
        {"kind": "coolant_degradation", "target": {"rack": "r0"}, "onset": "90s", "ramp": "60s"},
        {"kind": "noisy_neighbour", "target": {"host": "r1-node0", "gpu": 1}, "onset": "60s"},
        {"kind": "pcie_replay_storm", "target": {"host": "r2-node3", "gpu": 4}, "onset": "60s"},
    ]
    result = asyncio.run(
        run_scenario(scenario_from_dict(spec), detect_every_s=60.0, workdir=workdir)
    )
    cycles = [
        {
            "end_s": (c.end_ms - c.start_ms) / 1000.0,
            "seconds": c.seconds,
            "samples": c.samples,
            "gpus": c.gpus,
            "workloads": c.workloads,
            "opened": len(c.opened),
            "detectors": c.detector_seconds,
            "stages": c.stage_seconds,
        }
        for c in result.cycles_detail
        if c.gpus
    ]
    warm = [c["seconds"] for c in cycles[1:]] or [c["seconds"] for c in cycles]
    return {
        "machine": machine(),
        "gpus": gpus,
        "minutes": minutes,
        "cycles": cycles,
        "first_cycle_seconds": cycles[0]["seconds"] if cycles else None,
        "warm_cycle_median_seconds": statistics.median(warm) if warm else None,
        "warm_cycle_max_seconds": max(warm) if warm else None,
        "samples_per_cycle": statistics.median([c["samples"] for c in cycles]) if cycles else 0,
        "findings": len(result.findings),
        "wall_seconds": result.wall_seconds,
    }
