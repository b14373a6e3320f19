"""The fleet day ``hbmwatch bench promql`` queries: canonical series, their values, and both
copies of them (hbmwatch's SQLite store and OpenMetrics text for a real Prometheus).

Values come from seeded processes with the shapes real sensors have: each GPU's load follows
a daily cycle with noise, and temperatures (whole degrees), power (milliwatts), bandwidth and
utilisation ratios, clocks and throttle flags follow it; energy, fabric and PCIe byte
counters climb at load-dependent rates and now and then reset (a driver reload); error and
throttle counters move rarely; a few links lose bandwidth for a while.

One pass over the day, an hour at a time: the hour's values are written to the store through
its fast path (``Store.write_rows``, ids resolved once), compacted into the minute and hour
tiers as the service would, and appended to one OpenMetrics file per metric family (a
family's lines must be contiguous), which are joined for ``promtool tsdb
create-blocks-from openmetrics``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from hbmwatch.records import SeriesKey
from hbmwatch.store.store import Store
from hbmwatch.validation import HbmwatchError

HOUR_MS = 3_600_000
#: The latency quantiles each GPU's service reports, and their typical values in seconds.
LATENCY_PARTS = (("ttft", "0.5"), ("ttft", "0.99"), ("e2e", "0.5"), ("e2e", "0.99"))
LATENCY_TYPICAL = np.array([0.08, 0.25, 2.0, 6.0])
DAY_S = 86_400.0
Progress = Callable[[str, int, int], None]


def _quiet(_stage: str, _done: int, _total: int) -> None:
    return None


@dataclass(frozen=True)
class DaySpec:
    """What is generated; equal specs give equal data (the databases are reused on it)."""

    gpus: int = 1024
    hours: int = 24
    interval_s: int = 300
    seed: int = 1
    links: int = 4
    stacks: int = 4

    def check(self) -> None:
        if self.gpus < 8 or self.gpus % 8:
            raise HbmwatchError("gpus must be a positive multiple of 8 (8 GPUs a node)")
        if self.interval_s <= 0 or 3600 % self.interval_s:
            raise HbmwatchError("the scrape interval must divide an hour (1, 2, ... 60, 120 s)")
        if self.hours < 1:
            raise HbmwatchError("hours must be at least 1")

    @property
    def steps_per_hour(self) -> int:
        return 3600 // self.interval_s

    def params(self) -> dict[str, Any]:
        return asdict(self)


def gpu_labels(g: int) -> dict[str, str]:
    """Racks of 8 nodes of 8 GPUs; racks alternate between an AMD and an NVIDIA SKU."""
    amd = (g // 64) % 2 == 0
    return {
        "cluster": "bench",
        "rack": f"r{g // 64:02d}",
        "host": f"node{g // 8:04d}",
        "gpu": str(g % 8),
        "sku": "MI300X" if amd else "H200",
        "vendor": "amd" if amd else "nvidia",
    }


@dataclass
class Family:
    """One metric's series over the fleet: which GPU each belongs to, its extra labels."""

    metric: str
    keys: list[SeriesKey]
    gpu: np.ndarray  # the GPU index of each series
    part: np.ndarray  # the stack, link or direction index (0 when none)


def families(spec: DaySpec) -> list[Family]:
    """The series of the day: 46 a GPU at 4 links and 4 stacks, 5 of them its service's."""
    out: list[Family] = []
    labels = [gpu_labels(g) for g in range(spec.gpus)]

    def add(
        metric: str, extra: list[dict[str, str]] | None = None, by_vendor: bool = False
    ) -> None:
        parts = extra or [{}]
        keys, gpus, idx = [], [], []
        for g, base in enumerate(labels):
            if metric.startswith("workload_"):  # a service on every GPU: placement labels
                base = {k: base[k] for k in ("cluster", "rack", "host", "gpu")}
                base |= {"service": f"llm{g % 4}", "model": "llama-3-70b"}
            for i, more in enumerate(parts):
                if by_vendor:
                    more = {**more, "fabric": "xgmi" if base["vendor"] == "amd" else "nvlink"}
                keys.append(SeriesKey(metric, {**base, **more}))
                gpus.append(g)
                idx.append(i)
        out.append(Family(metric, keys, np.array(gpus), np.array(idx)))

    links = [str(n) for n in range(spec.links)]
    add("gpu_hotspot_temperature_celsius")
    add("gpu_memory_temperature_celsius")
    add("gpu_hbm_stack_temperature_celsius", [{"stack": str(s)} for s in range(spec.stacks)])
    add("gpu_memory_bandwidth_utilization_ratio")
    add("gpu_utilization_ratio")
    add("gpu_power_watts")
    add("gpu_power_limit_watts")
    add("gpu_energy_joules_total")
    add("gpu_clock_hertz", [{"domain": "compute"}, {"domain": "memory"}])
    reasons = [{"reason": "hbm_thermal"}, {"reason": "power"}]
    add("gpu_throttle_seconds_total", reasons)
    add("gpu_throttle_active", reasons)
    directions = [{"link": n, "direction": d} for n in links for d in ("rx", "tx")]
    add("gpu_fabric_bytes_total", directions, by_vendor=True)
    add("gpu_fabric_errors_total", [{"link": n, "error": "crc"} for n in links], by_vendor=True)
    add("gpu_fabric_link_bandwidth_bytes_per_second", [{"link": n} for n in links], True)
    add("gpu_pcie_bytes_total", [{"direction": "rx"}, {"direction": "tx"}])
    add("gpu_pcie_replays_total")
    add("gpu_pcie_recoveries_total")
    add("gpu_pcie_naks_total", [{"direction": "rx"}, {"direction": "tx"}])
    add("gpu_pcie_link_width_lanes")
    add("gpu_pcie_link_speed_transfers_per_second")
    latency = [{"phase": p, "quantile": q} for p, q in LATENCY_PARTS]
    add("workload_latency_seconds", latency)
    add("workload_requests_total", [{"phase": "e2e"}])
    return out


class Values:
    """The processes behind the values, advanced an hour (``block``) at a time."""

    def __init__(self, spec: DaySpec, fams: list[Family]) -> None:
        self.spec, self.fams = spec, fams
        self.rng = np.random.default_rng(spec.seed)
        g = spec.gpus
        self.phase = self.rng.uniform(0, 2 * np.pi, g)
        self.base_temp = self.rng.uniform(42, 58, g)
        self.noise = np.zeros(g)
        self.counters = {
            f.metric: np.floor(self.rng.uniform(0, 1e6, len(f.keys)) * _counter_scale(f.metric))
            for f in fams
            if f.metric.endswith("_total")
        }
        self.degraded = np.zeros(g, dtype=bool)
        self.pcie_degraded = np.zeros(g, dtype=bool)

    def block(self, first_step: int, n: int) -> dict[str, np.ndarray]:
        """Every family's values for steps ``first_step .. first_step + n`` (series x n)."""
        spec, rng = self.spec, self.rng
        t = (first_step + np.arange(n)) * spec.interval_s
        load = np.empty((spec.gpus, n))
        for j in range(n):  # AR(1) noise around the daily cycle
            self.noise = 0.9 * self.noise + rng.normal(0, 0.05, spec.gpus)
            load[:, j] = 0.55 + 0.3 * np.sin(2 * np.pi * t[j] / DAY_S + self.phase) + self.noise
        load = np.clip(load, 0.02, 1.0)
        mem = np.round(self.base_temp[:, None] + 30 * load + rng.normal(0, 0.4, load.shape))
        power = np.round(150 + 550 * load + rng.normal(0, 8, load.shape), 3)
        out: dict[str, np.ndarray] = {}
        for f in self.fams:
            out[f.metric] = self._family(f, load, mem, power)
        return out

    def _family(self, f: Family, load: np.ndarray, mem: np.ndarray, power: np.ndarray) -> Any:
        rng, n, dt = self.rng, load.shape[1], self.spec.interval_s
        g, shape = f.gpu, (len(f.keys), load.shape[1])
        name = f.metric
        if name == "gpu_memory_temperature_celsius":
            return mem
        if name == "gpu_hotspot_temperature_celsius":
            return mem + 6 + np.round(rng.normal(0, 0.5, shape))
        if name == "gpu_hbm_stack_temperature_celsius":
            return mem[g] + (f.part[:, None] % 3) - 1 + np.round(rng.normal(0, 0.4, shape))
        if name in ("gpu_memory_bandwidth_utilization_ratio", "gpu_utilization_ratio"):
            return np.round(np.clip(load + rng.normal(0, 0.03, shape), 0, 1), 2)
        if name == "gpu_power_watts":
            return power
        if name == "gpu_power_limit_watts":
            return np.full(shape, 750.0)
        if name == "gpu_clock_hertz":
            drop = (load[g] > 0.9) & (f.part[:, None] == 0)
            return np.where(f.part[:, None] == 0, np.where(drop, 1.9e9, 2.1e9), 1.3e9)
        if name == "gpu_throttle_active":
            hot = np.where(f.part[:, None] == 0, mem[g] > 85, power[g] > 690)
            return hot.astype(float)
        if name == "gpu_fabric_link_bandwidth_bytes_per_second":
            self.degraded ^= rng.random(self.spec.gpus) < 0.0005  # a link retrains, recovers
            bad = self.degraded[g] & (f.part == 0)
            return np.repeat(np.where(bad, 25e9, 50e9)[:, None], n, axis=1)
        if name in ("gpu_pcie_link_width_lanes", "gpu_pcie_link_speed_transfers_per_second"):
            if name == "gpu_pcie_link_width_lanes":  # retrains to x8 now and then, recovers
                self.pcie_degraded ^= rng.random(self.spec.gpus) < 0.0003
            slow = self.pcie_degraded[g]
            best, worse = (16.0, 8.0) if name == "gpu_pcie_link_width_lanes" else (32e9, 16e9)
            return np.repeat(np.where(slow, worse, best)[:, None], n, axis=1)
        if name == "workload_latency_seconds":
            typical = LATENCY_TYPICAL[f.part][:, None] * (0.6 + 0.8 * load[g])
            return np.round(typical * rng.lognormal(0, 0.1, shape), 4)
        return self._counter(f, load, mem, power, dt)

    def _counter(self, f: Family, load: Any, mem: Any, power: Any, dt: int) -> np.ndarray:
        """Increments by the family's rate; a reset (driver reload) now and then."""
        rng, g, shape = self.rng, f.gpu, (len(f.keys), load.shape[1])
        name = f.metric
        if name == "gpu_energy_joules_total":
            inc = power * dt
        elif name == "gpu_fabric_bytes_total":
            inc = np.round(load[g] * 40e9 * dt * rng.uniform(0.9, 1.1, shape))
        elif name == "gpu_pcie_bytes_total":
            inc = np.round(load[g] * 8e9 * dt * rng.uniform(0.8, 1.2, shape))
        elif name == "workload_requests_total":
            inc = np.round(load[g] * 20 * dt * rng.uniform(0.9, 1.1, shape))
        elif name == "gpu_throttle_seconds_total":
            hot = np.where(f.part[:, None] == 0, mem[g] > 85, power[g] > 690)
            inc = hot * rng.uniform(0, dt, shape)
        else:  # error counters: rare events
            inc = (rng.random(shape) < 0.001).astype(float) * rng.integers(1, 5, shape)
        values = self.counters[name][:, None] + np.cumsum(inc, axis=1)
        resets = rng.random(shape) < 2e-5
        for i, j in zip(*np.nonzero(resets), strict=True):
            values[i, j:] -= values[i, j] - inc[i, j]  # restart from this step's increment
        self.counters[name] = values[:, -1].copy()
        return np.round(values, 3)


def _counter_scale(metric: str) -> float:
    """Where counters stand at the start of the day (errors: tens, bytes: terabytes)."""
    scales = {"gpu_fabric_bytes_total": 1e6, "gpu_pcie_bytes_total": 1e5,
              "gpu_throttle_seconds_total": 0.1, "gpu_energy_joules_total": 1.0,
              "workload_requests_total": 1.0}  # fmt: skip
    return scales.get(metric, 1e-4)


class OpenMetricsFiles:
    """One file per family while the day is generated; ``join`` makes promtool's input."""

    def __init__(self, folder: Path, fams: list[Family]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.heads = {f.metric: [_om_series(k) for k in f.keys] for f in fams}
        self.files: dict[str, IO[str]] = {
            f.metric: (folder / f"{f.metric}.part").open("w") for f in fams
        }

    def append(self, metric: str, ts_ms: np.ndarray, values: np.ndarray) -> None:
        stamps = [f" {t // 1000}.{t % 1000:03d}\n" for t in ts_ms.tolist()]
        out = self.files[metric]
        for head, row in zip(self.heads[metric], values.tolist(), strict=True):
            out.write("".join(f"{head} {v!r}{s}" for v, s in zip(row, stamps, strict=True)))

    def join(self, path: Path) -> int:
        """Every family's lines under its ``# TYPE`` (``unknown``: OpenMetrics would split
        ``_total`` off a counter's name), then ``# EOF``; returns the bytes written."""
        with path.open("w") as out:
            for metric, part in self.files.items():
                part.close()
                out.write(f"# TYPE {metric} unknown\n")
                with (self.folder / f"{metric}.part").open() as src:
                    shutil.copyfileobj(src, out, 1 << 22)
                (self.folder / f"{metric}.part").unlink()
            out.write("# EOF\n")
        return path.stat().st_size


def _om_series(key: SeriesKey) -> str:
    body = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in key.labels
    )
    return f"{key.metric}{{{body}}}"


def generate(
    spec: DaySpec, store: Store, om_path: Path, start_ms: int, progress: Progress = _quiet
) -> dict[str, Any]:
    """Write the day into the store (compacted hour by hour) and into ``om_path``."""
    spec.check()
    fams = families(spec)
    keys = [k for f in fams for k in f.keys]
    t0 = time.perf_counter()
    resolved = store.resolve(keys)
    bad = [str(v) for v in resolved.values() if not isinstance(v, int)]
    if bad:
        raise HbmwatchError(f"{len(bad)} series refused, e.g. {bad[0]}")
    ids = {f.metric: np.array([resolved[k] for k in f.keys]) for f in fams}
    spent = {"register": time.perf_counter() - t0, "generate": 0.0, "write": 0.0}
    spent |= {"compact": 0.0, "openmetrics": 0.0}
    values, om = Values(spec, fams), OpenMetricsFiles(om_path.parent / "parts", fams)
    per_hour, samples = spec.steps_per_hour, 0
    grace = int(store.settings.compaction_grace_seconds * 1000)
    for hour in range(spec.hours):
        t1 = time.perf_counter()
        block = values.block(hour * per_hour, per_hour)
        ts = start_ms + (hour * per_hour + np.arange(per_hour)) * spec.interval_s * 1000
        t2 = time.perf_counter()
        for j, stamp in enumerate(ts.tolist()):
            rows = [
                (stamp, sid, v)
                for f in fams
                for sid, v in zip(
                    ids[f.metric].tolist(), block[f.metric][:, j].tolist(), strict=True
                )
            ]
            result = store.write_rows(rows)
            if result.accepted != len(rows):
                raise HbmwatchError(f"the store refused samples at {stamp}: {result.errors[:3]}")
            samples += len(rows)
        t3 = time.perf_counter()
        store.compact(now_ms=int(ts[-1]) + spec.interval_s * 1000 + grace)
        t4 = time.perf_counter()
        for f in fams:
            om.append(f.metric, ts, block[f.metric])
        t5 = time.perf_counter()
        for key, a, b in (("generate", t1, t2), ("write", t2, t3), ("compact", t3, t4),
                          ("openmetrics", t4, t5)):  # fmt: skip
            spent[key] += b - a
        progress(f"generating {spec.gpus} GPUs x {spec.hours} h", hour + 1, spec.hours)
    t6 = time.perf_counter()
    om_bytes = om.join(om_path)
    spent["openmetrics"] += time.perf_counter() - t6
    return {
        "series": len(keys),
        "series_per_gpu": len(keys) / spec.gpus,
        "samples": samples,
        "openmetrics_bytes": om_bytes,
        **{f"{k}_seconds": round(v, 2) for k, v in spent.items()},
    }
