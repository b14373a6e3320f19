"""``hbmwatch bench api``: the API's read latency over a loaded fleet day (issue 7).

Must-hold: the p99 latency of a one-GPU-day range query at a 1-minute step, and of an
incident detail, is under 100 ms on SQLite with a 1,024-GPU day of data loaded.

Load phase (once; the database is reused while its sidecar ``<db>.json`` matches the
parameters): the simulated fleet's exporter and vLLM pages are read by the collector's own
translators, which gives the exact series and label sets production stores (device series
per GPU plus workload latency quantiles per service).  Values then come from the
simulator's physics for the gauges it models (temperatures, per-stack HBM, power, clocks,
utilisation, memory) and from per-series processes seeded by those real scrapes for the
rest (counters at their scraped rates, latency quantiles wandering around theirs).  Every
sample goes in through ``Store.write_rows`` and ``Store.compact``, so the minute chunks and
hourly rollups are what the service would have built.  One incident (a rack losing
coolant: GPU heat, throttling, p99 regressions with ranked causes) goes through the alert
engine into the store.

Measure phase: ``api.main.create_app`` served by uvicorn in its own process on 127.0.0.1;
sequential httpx requests after a warm-up; beside them the same range queries called on
the store in-process, so the cost of HTTP and JSON shows.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from hbmwatch import metrics
from hbmwatch.bench.benchmarks import machine
from hbmwatch.query import parse_selector
from hbmwatch.records import Evidence, Finding, RankedCause, SeriesKey, Severity
from hbmwatch.settings import AlertSettings, Settings, StoreSettings
from hbmwatch.store.store import Store
from hbmwatch.validation import HbmwatchError

FORMAT = 2  # bump when what the load phase writes changes: old databases are rebuilt
QUERY_METRIC = "gpu_memory_temperature_celsius"
SKUS = ("MI300X", "H200", "MI355X", "H100")
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
#: Values the simulator computes itself: canonical metric -> its readings array.
SIMULATED = {
    m: m
    for m in (
        "gpu_hotspot_temperature_celsius",
        "gpu_memory_temperature_celsius",
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_energy_joules_total",
        "gpu_utilization_ratio",
        "gpu_memory_bandwidth_utilization_ratio",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
    )
}
WANDERING = ("workload_latency_seconds", "workload_window_requests")
#: Written every second, the collector's default interval, whatever the others' interval:
#: the range query reads these, and its cost depends on their chunks' size.
FINE_METRICS = (QUERY_METRIC,)
FINE_INTERVAL = 1

Progress = Callable[[str, int, int], None]


class ApiMissing(HbmwatchError):
    """The API does not serve the routes the benchmark measures."""


def _quiet(_stage: str, _done: int, _total: int) -> None:
    return None


# -- the fleet and its values ---------------------------------------------------------------
def fleet_spec(gpus: int, hours: int, interval: int, seed: int) -> dict[str, Any]:
    """Racks of up to 8 nodes of 8 GPUs, four SKUs in turn; a vLLM service on every GPU."""
    if gpus < 8 or gpus % 8:
        raise ValueError("gpus must be a positive multiple of 8 (8 GPUs a node)")
    nodes, racks = gpus // 8, []
    for i in range(0, nodes, 8):
        racks.append({"name": f"r{i // 8}", "nodes": min(8, nodes - i), "sku": SKUS[i // 8 % 4]})
    return {
        "name": "bench-api",
        "duration": f"{hours + 1}h",
        "seed": seed,
        "step": interval,
        "racks": racks,
    }


class FleetDay:
    """The simulated fleet as the collector would store it, one sample step at a time."""

    def __init__(self, gpus: int, hours: int, interval: int, seed: int, start_s: float) -> None:
        from hbmwatch.simulator.runner import Simulation
        from hbmwatch.simulator.scenario import scenario_from_dict

        self.interval = interval
        spec = fleet_spec(gpus, hours, interval, seed)
        self.sim = Simulation(scenario_from_dict(spec), start_unix=start_s - 60)
        self._translators = self._make_translators()
        before = self._scrape()
        self.sim.advance_to(60.0)  # the first sample of the day: latency windows are full
        now = self._scrape()
        self.keys = sorted(now, key=lambda k: k.text)
        self.base = np.array([now[k] for k in self.keys])
        self._rng = np.random.default_rng(seed)
        self._plan_sim()
        self._plan_synthetic(np.array([before.get(k, np.nan) for k in self.keys]))
        self._walk = np.zeros(len(self.keys))

    def _make_translators(self) -> list[tuple[str, int, Any]]:
        from hbmwatch.collector.engine import translator_for
        from hbmwatch.collector.targets import Target
        from hbmwatch.settings import CollectorSettings

        fleet, settings, out = self.sim.fleet, CollectorSettings(), []
        for node in fleet.nodes:
            labels = {"cluster": node.cluster, "rack": node.rack_name, "host": node.host}
            target = Target(node.exporter, "http://sim/metrics", labels, 1.0, 1.0)
            out.append(("node", node.index, translator_for(target, settings)))
        for s in fleet.services:
            node, gpu = fleet.nodes[s.node], fleet.gpus[s.gpu]
            labels = {
                "cluster": node.cluster,
                "rack": node.rack_name,
                "host": node.host,
                "gpu": gpu.device.gpu,
                "service": s.name,
            }
            if gpu.partitions > 1:
                labels["partition"] = str(s.partition)
            target = Target("vllm", f"http://sim/services/{s.name}/metrics", labels, 1.0, 1.0)
            out.append(("service", s.index, translator_for(target, settings)))
        return out

    def _scrape(self) -> dict[SeriesKey, float]:
        """Every page of the fleet now, through the collector's translators."""
        ts, out = int(self.sim.now_unix * 1000), {}
        for kind, index, translator in self._translators:
            page = self.sim.node_page(index) if kind == "node" else self.sim.service_page(index)
            if page:
                out.update((s[0], s[2]) for s in translator.translate_text(page, ts).samples)
        return out

    def _source(self, key: SeriesKey) -> tuple[str, int, float] | None:
        """Which readings array (and column, and scale) a series' value comes from."""
        if key.metric == "gpu_hbm_stack_temperature_celsius":
            return "stack", int(key.label("stack", "-1")), 1.0
        if key.metric == "gpu_clock_hertz":
            name = {"compute": "compute_mhz", "memory": "memory_mhz"}.get(key.label("domain"))
            return (name, -1, 1e6) if name else None
        name = SIMULATED.get(key.metric)
        return (name, -1, 1.0) if name else None

    def _plan_sim(self) -> None:
        """Series whose scraped value equals the simulator's reading follow the simulator."""
        where = {(g.device.host, g.device.gpu): g.index for g in self.sim.fleet.gpus}
        groups: dict[tuple[str, int, float], tuple[list[int], list[int]]] = {}
        for i, key in enumerate(self.keys):
            src, gpu = self._source(key), where.get((key.label("host"), key.label("gpu")))
            if src is not None and gpu is not None and not key.label("partition"):
                rows, gpus = groups.setdefault(src, ([], []))
                rows.append(i)
                gpus.append(gpu)
        self.simulated = np.zeros(len(self.keys), dtype=bool)
        self._groups = []
        for (name, col, scale), (rows, gpus) in groups.items():
            r, g = np.array(rows), np.array(gpus)
            value = self._reading(name, col, scale, g)
            ok = np.isclose(value, self.base[r], rtol=0.02, atol=1e-6)  # exporters round
            self._groups.append((name, col, scale, r[ok], g[ok]))
            self.simulated[r[ok]] = True
        fine = np.array([k.metric in FINE_METRICS for k in self.keys])
        self.fine = fine & self.simulated if self.interval > FINE_INTERVAL else fine & False

    def _reading(self, name: str, col: int, scale: float, gpus: np.ndarray) -> np.ndarray:
        array = self.sim.readings[name]
        return (array[gpus, col] if col >= 0 else array[gpus]) * scale

    def _plan_synthetic(self, before: np.ndarray) -> None:
        counters = {m.name for m in metrics.METRICS.values() if m.is_counter}
        counter = np.array([k.metric in counters for k in self.keys])
        free = ~self.simulated
        self.counter = free & counter
        rate = np.nan_to_num((self.base - before) / 60.0, nan=0.0)
        self.rate = np.where(self.counter, np.clip(rate, 0, None), 0.0)
        self.flag = free & np.array([k.metric == "gpu_throttle_active" for k in self.keys])
        self.wander = free & np.array([k.metric in WANDERING for k in self.keys])
        self.whole = np.array([k.metric == "workload_window_requests" for k in self.keys])
        self.state = self.base.copy()

    def _fill_simulated(self, out: np.ndarray) -> None:
        for name, col, scale, rows, gpus in self._groups:
            out[rows] = self._reading(name, col, scale, gpus)

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """This step's value of every series (in ``keys`` order), and each second's value of
        the fine series (``fine`` rows x seconds of the step); then advance one step."""
        out = self.state.copy()
        self._fill_simulated(out)
        rng, n, dt = self._rng, len(self.keys), self.interval
        flip = rng.random(n) < 0.02
        out[self.flag] = np.where(flip, 1.0 - self.base, self.base)[self.flag]
        self._walk = 0.9 * self._walk + rng.normal(0.0, 0.05, n)
        wander = self.base * np.exp(self._walk)
        wander = np.where(self.whole, np.round(wander), wander)
        out[self.wander] = wander[self.wander]
        bump = (rng.random(n) < 0.0005) & (self.rate == 0)
        grow = self.rate * dt * rng.uniform(0.8, 1.2, n) + bump
        self.state = np.where(self.counter, np.round(self.state + grow, 3), self.state)
        # Physics only: the day's latency quantiles come from the scraped ones (above), and
        # simulating every request of 1,024 services would cost 0.3 s a step.
        self.sim._advance(dt, record=False)
        self.sim.readings = self.sim.exposition.readings()
        after = out.copy()
        self._fill_simulated(after)
        return out, self._seconds(out[self.fine], after[self.fine])

    def _seconds(self, now: np.ndarray, after: np.ndarray) -> np.ndarray:
        """A 1 s sensor between two steps: the physics in between, read noise, whole degrees."""
        share = np.arange(self.interval // FINE_INTERVAL) / (self.interval // FINE_INTERVAL)
        between = now[:, None] + (after - now)[:, None] * share[None, :]
        return np.round(between + self._rng.normal(0.0, 0.3, between.shape))


# -- the load phase ---------------------------------------------------------------------------
def _sidecar(db: Path) -> Path:
    return db.with_name(db.name + ".json")


def _db_files(db: Path) -> list[Path]:
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def _url(db: Path) -> str:
    return f"sqlite:///{db}"


def open_bench_store(db: Path) -> Store:
    """The benchmark's store, migrated first (as ``hbmwatch migrate`` would)."""
    from hbmwatch.store.engine import create_store_engine
    from hbmwatch.store.migrate import upgrade
    from hbmwatch.store.store import open_store

    engine = create_store_engine(_url(db))
    upgrade(engine)
    engine.dispose()
    return open_store(StoreSettings(url=_url(db)))


def _params(gpus: int, hours: int, interval: int, seed: int) -> dict[str, Any]:
    return {"format": FORMAT, "gpus": gpus, "hours": hours, "interval_s": interval, "seed": seed,
            "fine_metrics": list(FINE_METRICS), "fine_interval_s": FINE_INTERVAL}  # fmt: skip


def ensure_loaded(
    db: Path,
    *,
    gpus: int,
    hours: int,
    interval: int,
    seed: int,
    rebuild: bool,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """The sidecar of a loaded database with these parameters; loads one if needed.

    A database whose sidecar names other parameters, or a load that never finished, is
    rebuilt; a file without a sidecar is someone else's and is only replaced on ``rebuild``.
    """
    if 60 % interval:
        raise ValueError("the sample interval must divide 60 s (1, 2, 3, 4, 5, 6, 10, ... 60)")
    params, sidecar = _params(gpus, hours, interval, seed), _sidecar(db)
    meta = json.loads(sidecar.read_text()) if sidecar.exists() else None
    if meta and not rebuild and meta.get("complete") and meta["params"] == params and db.exists():
        return meta | {"reused": True}
    if db.exists() and meta is None and not rebuild:
        raise HbmwatchError(f"{db} exists and is not a bench api database; pass --rebuild")
    for path in [*_db_files(db), sidecar]:
        path.unlink(missing_ok=True)
    end_ms = int(time.time() * 1000) // HOUR_MS * HOUR_MS  # the day ends before now
    meta = {
        "params": params,
        "complete": False,
        "start_ms": end_ms - hours * HOUR_MS,
        "end_ms": end_ms,
    }
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    store = open_bench_store(db)
    try:
        meta |= load_day(store, gpus, hours, interval, seed, meta["start_ms"], progress)
        meta["incident"] = make_incident(store, meta["start_ms"], meta["end_ms"])
    finally:
        store.close()
    meta["complete"] = True
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    return meta | {"reused": False}


def _step_rows(day: FleetDay, ids: np.ndarray, ts: int) -> list[tuple[int, int, float]]:
    """One step's ``(timestamp_ms, series_id, value)`` rows: every series at ``ts``, except
    the fine ones, which get a row for each second of the step."""
    values, seconds = day.values()
    coarse = ~day.fine
    rows = list(zip(repeat(ts), ids[coarse].tolist(), values[coarse].tolist(), strict=False))
    fine_ids = ids[day.fine].tolist()
    for j, column in enumerate(seconds.T.tolist()):
        rows += zip(repeat(ts + j * FINE_INTERVAL * 1000), fine_ids, column, strict=False)
    return rows


def load_day(
    store: Store,
    gpus: int,
    hours: int,
    interval: int,
    seed: int,
    start_ms: int,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Write ``hours`` of the fleet through ``write_rows``, compacting each hour as written."""
    started = time.perf_counter()
    progress("building the simulated fleet and scraping it", 0, 1)
    day = FleetDay(gpus, hours, interval, seed, start_ms / 1000)
    resolved = store.resolve(day.keys)
    bad = {k.text: str(v) for k, v in resolved.items() if not isinstance(v, int)}
    if bad:
        raise HbmwatchError(f"{len(bad)} series refused, e.g. {next(iter(bad.items()))}")
    ids = np.array([resolved[k] for k in day.keys])
    build_s = time.perf_counter() - started
    progress("building the simulated fleet and scraping it", 1, 1)
    steps, per_hour = hours * 3600 // interval, 3600 // interval
    grace = int(store.settings.compaction_grace_seconds * 1000)
    spent = {"generate": 0.0, "write": 0.0, "compact": 0.0}
    samples = 0
    for step in range(steps):
        t0 = time.perf_counter()
        ts = start_ms + step * interval * 1000
        rows = _step_rows(day, ids, ts)
        t1 = time.perf_counter()
        result = store.write_rows(rows)
        if result.accepted != len(rows):
            raise HbmwatchError(f"the store refused samples at {ts}: {result.errors[:3]}")
        samples += result.accepted
        t2 = time.perf_counter()
        if (step + 1) % per_hour == 0:
            store.compact(now_ms=ts + interval * 1000 + grace)
        spent["generate"] += t1 - t0
        spent["write"] += t2 - t1
        spent["compact"] += time.perf_counter() - t2
        progress(f"loading {gpus} GPUs x {hours} h", step + 1, steps)
    return {
        "series": len(ids),
        "series_per_gpu": len(ids) / gpus,
        "simulated_series": int(day.simulated.sum()),
        "fine_series": int(day.fine.sum()),
        "services": len(day.sim.fleet.services),
        "samples": samples,
        "chunk_rows": len(ids) * hours * 60,
        "rollup_1h_rows": len(ids) * hours,
        "load_seconds": time.perf_counter() - started,
        "build_seconds": build_s,
        **{f"{k}_seconds": v for k, v in spent.items()},
    }


# -- the incident ----------------------------------------------------------------------------
GPU_ENTITY = ("cluster", "rack", "host", "gpu", "sku")
WORKLOAD_ENTITY = ("cluster", "rack", "host", "gpu", "service", "model", "phase")


def _finding(kind: str, entity: dict[str, str], severity: Severity, summary: str,
             span: tuple[int, int], evidence: list[Evidence],
             causes: list[RankedCause]) -> Finding:  # fmt: skip
    from hbmwatch.detectors.base import make_finding

    start, now = span
    return make_finding(kind=kind, detector="bench", entity=entity, severity=severity,
                        summary=summary, started_ms=start, raised_ms=start, updated_ms=now,
                        evidence=evidence, causes=causes)  # fmt: skip


def _thermal(key: SeriesKey, i: int, t0: int, now: int) -> Finding:
    """The i-th hottest GPU of the rack: an HBM thermal excursion."""
    from hbmwatch.taxonomy import Cause, FindingKind

    hot, rise, span = 96.0 - i * 0.5, 14.0 - i * 0.3, (t0 + 60_000 + i * 5_000, now)
    evidence = [
        Evidence(key.text, "temperature_c", hot, None, *span),
        Evidence(key.text, "rise_over_load_baseline_c", rise, 8.0, *span, note="+1.2 C/min"),
        Evidence(key.text, "headroom_to_slowdown_c", 95.0 - hot, 3.0),
    ]
    causes = [
        RankedCause(Cause.COOLING, 0.74, summary="the whole rack rises together"),
        RankedCause(Cause.MEMORY_BANDWIDTH, 0.18, summary="bandwidth near its peak"),
    ]
    severity = Severity.CRITICAL if hot >= 95 else Severity.WARNING
    entity = {k: key.label(k) for k in GPU_ENTITY}
    summary = f"HBM at {hot:.0f} C, +{rise:.1f} C over its baseline"
    return _finding(FindingKind.THERMAL_EXCURSION, entity, severity, summary, span, evidence,
                    causes)  # fmt: skip


def _throttle(key: SeriesKey, i: int, t0: int, now: int) -> Finding:
    from hbmwatch.taxonomy import Cause, FindingKind

    span = (t0 + 180_000 + i * 5_000, now)
    series = key.text.replace(QUERY_METRIC, "gpu_throttle_seconds_total")
    evidence = [Evidence(series, "throttle_residency_ratio", 0.42, 0.1, *span)]
    entity = {**{k: key.label(k) for k in GPU_ENTITY}, "reason": "hbm_thermal"}
    return _finding(FindingKind.THROTTLE, entity, Severity.WARNING,
                    "hbm_thermal throttle 42% of the last 5 minutes", span, evidence,
                    [RankedCause(Cause.HBM_THERMAL_THROTTLE, 0.9)])  # fmt: skip


def _regression(key: SeriesKey, temp: SeriesKey, i: int, t0: int, now: int) -> Finding:
    """A p99 regression of a service on a hot GPU, its causes ranked with lagged evidence."""
    from hbmwatch.taxonomy import Cause, FindingKind

    span = (t0 + 240_000 + i * 10_000, now)
    window = (span[0] - 600_000, now)
    heat = Evidence(temp.text, "memory_temperature change vs the 600 s before",
                    11.5, 3.0, *window, lag_seconds=45.0, strength=0.87)  # fmt: skip
    clock = Evidence(heat.series.replace(QUERY_METRIC, "gpu_clock_hertz"),
                     "clock change vs the 600 s before", -0.18, -0.05, *window,
                     lag_seconds=20.0, strength=0.64)  # fmt: skip
    causes = [
        RankedCause(Cause.COOLING, 0.61, (heat,), "memory heat led the p99 by 45 s"),
        RankedCause(Cause.HBM_THERMAL_THROTTLE, 0.27, (clock,), "clocks fell"),
        RankedCause(Cause.NONE, 0.12, (), "unexplained share"),
    ]
    evidence = [
        Evidence(key.text, "p99_over_baseline_ratio", 2.4, 1.5, *span),
        Evidence(key.text, "p99_seconds", 3.1, 1.9, *span, note="baseline 1.29 s"),
    ]
    entity = {k: key.label(k) for k in WORKLOAD_ENTITY if key.label(k)}
    summary = f"p99 of {key.label('service')} 2.4x its baseline"
    return _finding(FindingKind.P99_REGRESSION, entity, Severity.CRITICAL, summary, span,
                    evidence, causes)  # fmt: skip


def _rack(temps: list[SeriesKey], t0: int, now: int) -> Finding:
    from hbmwatch.taxonomy import Cause, FindingKind

    evidence = [
        Evidence(f"mean over rack r0: {QUERY_METRIC}", "rack_mean_rise_c", 12.0, 5.0),
        Evidence("GPUs of rack r0", "fraction_of_gpus_rising", 0.94, 0.5),
    ]
    entity = {"cluster": temps[0].label("cluster"), "rack": "r0"}
    summary = f"rack r0: {min(24, len(temps))} GPUs +12.0 C over their baselines together"
    cause = RankedCause(Cause.COOLING, 0.83, summary="inlet steady, every GPU of the rack rising")
    return _finding(FindingKind.THERMAL_EXCURSION, entity, Severity.WARNING, summary,
                    (t0 + 90_000, now), evidence, [cause])  # fmt: skip


def _gpu(key: SeriesKey) -> tuple[str, str]:
    return key.label("host"), key.label("gpu")


def make_incident(store: Store, start_ms: int, end_ms: int) -> dict[str, Any]:
    """Rack r0 loses coolant three hours before the day ends: one incident, ~40 alerts.

    The findings go through the alert engine (``Alerting``), which opens the incident,
    ranks its causes and stores it with its alerts, as ``hbmwatch up`` would.
    """
    from hbmwatch.alerts.runner import Alerting

    temps = store.series(parse_selector(f'{QUERY_METRIC}{{rack="r0"}}'), limit=10_000)
    p99 = parse_selector('workload_latency_seconds{rack="r0",quantile="0.99",phase="e2e"}')
    by_gpu = {_gpu(k): k for k in temps}
    t0 = max(start_ms, end_ms - 3 * HOUR_MS)
    first, later = t0 + 5 * MINUTE_MS, t0 + 15 * MINUTE_MS
    findings = [_rack(temps, t0, later)]
    findings += [_thermal(k, i, t0, later) for i, k in enumerate(temps[:24])]
    findings += [_throttle(k, i, t0, later) for i, k in enumerate(temps[:8])]
    on_hot = [k for k in store.series(p99, limit=10_000) if by_gpu.get(_gpu(k)) in temps[:8]]
    findings += [_regression(k, by_gpu[_gpu(k)], i, t0, later) for i, k in enumerate(on_hot)]
    alerting = Alerting(store, AlertSettings())
    alerting.start()
    early = [f for f in findings if f.started_ms <= first]
    store.findings.save(findings)
    alerting.process(early, now_ms=first)
    alerting.process(findings, now_ms=later)
    (incident,) = store.alerts.incidents(limit=10)
    return {
        "id": incident.id,
        "alerts": len(incident.alerts),
        "causes": len(incident.causes),
        "evidence": len(incident.evidence),
        "timeline": len(incident.timeline),
    }


# -- the measure phase -----------------------------------------------------------------------
def serve_forever(db: Path) -> None:
    """The API over the benchmark's database on a free port of 127.0.0.1 (prints the port)."""
    import uvicorn

    from hbmwatch import log
    from hbmwatch.api.main import create_app
    from hbmwatch.runtime.service import tune_gc
    from hbmwatch.store.store import open_store

    log.configure("warning")
    settings = Settings(store=StoreSettings(url=_url(db)))
    app = create_app(settings, open_store(settings.store))
    tune_gc()  # as `hbmwatch up` does after start-up
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, access_log=False, log_level="warning"
    )
    _announcing_server()(config).run()


def _announcing_server() -> type:
    import uvicorn

    class Announcing(uvicorn.Server):
        """Binds port 0 itself and prints the port once it listens.

        (A socket made with ``socket.socket()`` and passed in has ``proto`` 0, so asyncio
        leaves TCP_NODELAY off on its connections, and every keep-alive response then
        waits about 40 ms for the client's delayed ACK.)
        """

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            print(self.servers[0].sockets[0].getsockname()[1], flush=True)

    return Announcing


@contextlib.contextmanager
def served(db: Path, wait_s: float = 30.0) -> Iterator[tuple[str, int]]:
    """A separate process serving the API (as `hbmwatch up` would); yields its base URL and
    its PID (for its CPU time)."""
    with tempfile.TemporaryFile() as errors:
        argv = [sys.executable, "-m", "hbmwatch.bench.api", str(db)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            port = (proc.stdout.readline() if proc.stdout else "").strip()
            if not port.isdigit():
                proc.wait(timeout=wait_s)
                errors.seek(0)
                tail = errors.read().decode(errors="replace")[-2000:]
                raise HbmwatchError(f"the API process did not start:\n{tail}")
            yield f"http://127.0.0.1:{port}", proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=wait_s)


Read = tuple[float, int, int]  # seconds, response bytes, points or alerts returned


class LocalReads:
    """The two reads called on the store in-process: no HTTP, no JSON (the baseline)."""

    def __init__(self, store: Store, meta: dict[str, Any]) -> None:
        self.store, self.meta, self.tier = store, meta, ""

    def range(self, selector: str) -> Read:
        from hbmwatch.query import Aggregation

        start, end = self.meta["start_ms"] / 1000, self.meta["end_ms"] / 1000
        t0 = time.perf_counter()
        result = self.store.range_query(parse_selector(selector), start, end, 60, Aggregation.AVG)
        elapsed, self.tier = time.perf_counter() - t0, result.tier
        return elapsed, 0, sum(len(s.points) for s in result.series)

    def incident(self) -> Read:
        incident_id = self.meta["incident"]["id"]
        t0 = time.perf_counter()
        self.store.alerts.incident(incident_id)
        alerts = self.store.alerts.alerts(incident_id=incident_id, limit=5000)
        return time.perf_counter() - t0, 0, len(alerts)


class HttpReads:
    """The same reads as GETs on the served API (one keep-alive connection, sequential)."""

    def __init__(self, client: Any, meta: dict[str, Any]) -> None:
        self.client, self.meta, self.tier = client, meta, ""
        self.params = {"start": meta["start_ms"] // 1000, "end": meta["end_ms"] // 1000,
                       "step": "60", "agg": "avg"}  # fmt: skip

    def get(self, path: str, params: dict[str, Any] | None = None) -> tuple[float, Any]:
        t0 = time.perf_counter()
        response = self.client.get(path, params=params)
        elapsed = time.perf_counter() - t0
        if response.status_code == 404 and path.endswith("query_range"):
            raise ApiMissing(f"GET {path}: 404")
        if response.status_code != 200:
            raise HbmwatchError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
        return elapsed, response

    def range(self, selector: str) -> Read:
        elapsed, response = self.get("/api/v1/query_range", {"query": selector, **self.params})
        body = response.json()
        self.tier = body["tier"]
        return elapsed, len(response.content), sum(len(s["points"]) for s in body["series"])

    def incident(self) -> Read:
        elapsed, response = self.get(f"/api/v1/incidents/{self.meta['incident']['id']}")
        detail = response.json()
        return elapsed, len(response.content), len(detail.get("alert_list", []))


def _check_routes(client: Any) -> None:
    response = client.get("/openapi.json")
    paths = set(response.json().get("paths", {})) if response.status_code == 200 else set()
    wanted = {"/api/v1/query_range": "/api/v1/query_range",
              "/api/v1/incidents/{id}": "/api/v1/incidents/{"}  # fmt: skip
    missing = [name for name, prefix in wanted.items() if not any(
        p.startswith(prefix) and p.count("/") == name.count("/") for p in paths)]  # fmt: skip
    if missing:
        raise ApiMissing(f"the API does not serve {', '.join(missing)} (404)")


def _timed(read: Callable[..., Read], args: list[Any]) -> dict[str, Any]:
    """Percentiles of ``read`` over ``args`` (one call each), with what the calls returned."""
    done = [read(*a) for a in args]
    ms = np.array([d[0] for d in done]) * 1000.0
    out: dict[str, Any] = {"requests": len(ms), "mean_ms": float(ms.mean())}
    out |= {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 95, 99)}
    out |= {"max_ms": float(ms.max()), "returned": sorted({d[2] for d in done})}
    if any(d[1] for d in done):
        out["bytes"] = float(np.mean([d[1] for d in done]))
    return out


def _warm_up(reads: LocalReads | HttpReads, selectors: list[str]) -> None:
    for selector in selectors:
        reads.range(selector)
        reads.incident()


def measure(
    local: LocalReads, http: HttpReads | None, every_gpu: list[str], repeated: list[str],
    warmup: int,
) -> dict[str, Any]:  # fmt: skip
    """First reads of GPU-days (half the GPUs each way), then repeated reads, then incidents.

    Every first read comes before any repeated one, so neither path finds pages the other
    brought in: a first read costs what the page cache holds of that GPU's day.
    """
    cold_local, cold_http = every_gpu[1::2], every_gpu[::2]
    out: dict[str, Any] = {
        "in_process": {"first_read": _timed(local.range, [[s] for s in cold_local])}
    }
    if http is not None:
        _warm_up(http, cold_local[:warmup])  # the process's own first calls, on read GPUs
        out["http"] = {"first_read": _timed(http.range, [[s] for s in cold_http])}
    for name, reads in (("in_process", local), ("http", http)):
        if reads is not None:
            _warm_up(reads, repeated[:warmup])
            out[name]["query_range"] = _timed(reads.range, [[s] for s in repeated[warmup:]])
            out[name]["incident"] = _timed(reads.incident, [[] for _ in repeated[warmup:]])
            out[name]["tier"] = reads.tier
    return out


def _selectors(store: Store, count: int, seed: int) -> tuple[list[str], list[str]]:
    """Every GPU's memory temperature once (shuffled), and ``count`` random picks."""
    keys = store.series(parse_selector(QUERY_METRIC), limit=100_000)
    every = [f'{QUERY_METRIC}{{host="{k.label("host")}",gpu="{k.label("gpu")}"}}' for k in keys]
    rng = np.random.default_rng(seed)
    return [every[i] for i in rng.permutation(len(every))], [
        every[i] for i in rng.integers(0, len(every), count)
    ]


def _db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in _db_files(db) if p.exists())


def bench_api(
    *, gpus: int = 1024, hours: int = 24, db: Path = Path("hbmwatch-bench-api.db"),
    requests: int = 1000, rebuild: bool = False, interval: int = 60, seed: int = 7,
    warmup: int = 20, progress: Progress = _quiet,
) -> dict[str, Any]:  # fmt: skip
    """Load (or reuse) a fleet day, then time the API's two reads beside the in-process ones."""
    import httpx

    meta = ensure_loaded(db, gpus=gpus, hours=hours, interval=interval, seed=seed,
                         rebuild=rebuild, progress=progress)  # fmt: skip
    report: dict[str, Any] = {
        "machine": machine(), "sqlite": sqlite3.sqlite_version, "gpus": gpus, "hours": hours,
        "interval_s": interval, "db": str(db), "db_bytes": _db_bytes(db),
        "reused": meta["reused"], "load": {k: v for k, v in meta.items() if k.endswith(
            ("seconds", "series", "samples", "rows", "gpu", "services"))},
        "incident": meta["incident"], "requests": requests, "warmup": warmup, "target_ms": 100,
        "http": None, "met": None,
    }  # fmt: skip
    store = open_bench_store(db)
    every_gpu, repeated = _selectors(store, requests + warmup, seed)
    report["query_example"] = repeated[0]
    progress("timing the reads", 0, 1)
    try:
        with served(db) as (base_url, _), httpx.Client(base_url=base_url, timeout=60.0) as client:
            http: HttpReads | None = HttpReads(client, meta)
            try:
                _check_routes(client)
            except ApiMissing as exc:
                http, report["http_error"] = None, str(exc)
            report |= measure(LocalReads(store, meta), http, every_gpu, repeated, warmup)
    finally:
        store.close()
    progress("timing the reads", 1, 1)
    if report["http"] is not None:
        report["met"] = all(report["http"][k]["p99_ms"] < 100 for k in ("query_range", "incident"))
    return report


if __name__ == "__main__":
    serve_forever(Path(sys.argv[1]))
