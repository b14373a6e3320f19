"""``hbmwatch bench promql``: each dashboard query over a fleet day, hbmwatch beside Prometheus.

The day (``bench/promql_day.py``) goes into hbmwatch's SQLite store and, through ``promtool
tsdb create-blocks-from openmetrics``, into a real Prometheus; both are reused while the
folder's ``day.json`` matches the parameters.  Each query is a range query over the day at
a Grafana-like step, run ``runs`` times against hbmwatch's ``/prometheus/api/v1/query_range``
(``api.main.create_app`` under uvicorn, in its own process, as ``hbmwatch up`` serves it)
and against Prometheus' ``/api/v1/query_range``, alternately, over one keep-alive connection
each.  Each server's CPU time comes from ``/proc/<pid>/stat`` around each request.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from hbmwatch.bench.api import served
from hbmwatch.bench.promql_day import (
    HOUR_MS,
    DaySpec,
    Progress,
    _quiet,
    families,
    generate,
    gpu_labels,
)
from hbmwatch.validation import HbmwatchError

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards" / "json"
#: Dashboard-style queries over the canonical series, for dashboards that hold no PromQL over
#: stored series.
_FLEET = '{cluster=~"$cluster"}'
_GPU = '{host="$host", gpu="$gpu"}'
_RATE = "[$__rate_interval]"
REPRESENTATIVE: tuple[tuple[str, str], ...] = (
    ("hottest HBM by rack", f"max by (cluster, rack) (gpu_memory_temperature_celsius{_FLEET})"),
    ("10 hottest GPUs", f"topk(10, max by (host, gpu) (gpu_memory_temperature_celsius{_FLEET}))"),
    ("fleet HBM p99", f"quantile(0.99, gpu_memory_temperature_celsius{_FLEET})"),
    ("power by rack", f"sum by (rack) (gpu_power_watts{_FLEET})"),
    ("GPUs throttling by reason", f"sum by (reason) (gpu_throttle_active{_FLEET})"),
    ("GPU: HBM and hotspot", '{__name__=~"gpu_memory_temperature_celsius|'
     'gpu_hotspot_temperature_celsius", host="$host", gpu="$gpu"}'),
    ("GPU: HBM stacks, peak",
     f"max_over_time(gpu_hbm_stack_temperature_celsius{_GPU}[$__interval])"),
    ("GPU: throttle residency", f"rate(gpu_throttle_seconds_total{_GPU}{_RATE})"),
    ("GPU: fabric by link", f"rate(gpu_fabric_bytes_total{_GPU}{_RATE})"),
    ("GPU: energy per hour", f"increase(gpu_energy_joules_total{_GPU}[1h])"),
    ("fabric throughput per GPU",
     f"sum by (host, gpu) (rate(gpu_fabric_bytes_total{_FLEET}{_RATE}))"),
    ("fabric errors per GPU",
     f"sum by (host, gpu) (increase(gpu_fabric_errors_total{_FLEET}{_RATE})) > 0"),
    ("degraded links",
     f"min by (host, gpu, link) (gpu_fabric_link_bandwidth_bytes_per_second{_FLEET}) < 5e10"),
    ("PCIe per rack", f"sum by (rack) (rate(gpu_pcie_bytes_total{_FLEET}{_RATE}))"),
)  # fmt: skip
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class Query:
    name: str
    expr: str
    source: str  # "dashboard <file>" or "representative"


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s"


def variables(spec: DaySpec) -> dict[str, str]:
    """The dashboards' variables as a user would pick them: the fleet, a GPU in its middle."""
    middle = gpu_labels(spec.gpus // 2 + 2)
    return {k: middle[k] for k in ("cluster", "rack", "host", "gpu")}


def substitute(expr: str, spec: DaySpec, step_s: int) -> str | None:
    """Grafana's variables filled in (``$__rate_interval`` as Grafana computes it with the
    datasource's scrape interval set to the bench's); None if one is unknown."""
    interval_s, range_s = spec.interval_s, spec.hours * 3600
    builtins = {
        "__interval": _duration(step_s),
        "__rate_interval": _duration(max(step_s + interval_s, 4 * interval_s)),
        "__range": _duration(range_s),
        "__interval_ms": str(step_s * 1000),
        **variables(spec),
    }
    unknown: list[str] = []

    def fill(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in builtins:
            unknown.append(name)
            return m.group(0)
        return builtins[name]

    out = _VAR.sub(fill, expr)
    return None if unknown else out


def dashboard_queries(
    folder: Path, generated: set[str]
) -> tuple[list[Query], list[dict[str, str]]]:
    """Every panel expression that reads only series the bench generates; and the ones left
    out, with why."""
    found, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if not expr or target.get("hide"):
                    continue
                names = {n for n in _NAME.findall(expr) if n.startswith(("gpu_", "workload_"))}
                names |= {n for n in _NAME.findall(expr) if n.startswith("hbmwatch_")}
                title = f"{path.stem}: {panel.get('title', '?')} [{target.get('refId', '?')}]"
                if not names or not names <= generated:
                    missing = ", ".join(sorted(names - generated)) or "no canonical series"
                    why = f"reads series the bench does not generate ({missing})"
                    skipped.append({"query": title, "why": why})
                    continue
                found.append(Query(title, expr, f"dashboard {path.name}"))
    return found, skipped


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def queries(
    spec: DaySpec, step_s: int, dashboards: Path = DASHBOARDS
) -> tuple[list[Query], list[dict]]:
    """The dashboards' queries over stored series, variables filled; the representative set
    when the dashboards have none (before they spoke PromQL over the store)."""
    board, skipped = dashboard_queries(dashboards, {f.metric for f in families(DaySpec(gpus=8))})
    chosen = board or [Query(n, e, "representative") for n, e in REPRESENTATIVE]
    out = []
    for q in chosen:
        expr = substitute(q.expr, spec, step_s)
        if expr is None:
            skipped.append({"query": q.name, "why": "a variable the bench cannot fill"})
        else:
            out.append(Query(q.name, expr, q.source))
    return out, skipped


# -- the day, loaded once --------------------------------------------------------------------
def ensure_day(
    folder: Path, spec: DaySpec, *, rebuild: bool, progress: Progress = _quiet
) -> dict[str, Any]:
    """``day.json`` of a loaded folder (hbmwatch.db, tsdb/) with these parameters."""
    from hbmwatch.bench.api import open_bench_store
    from hbmwatch.bench.realprom import binaries

    spec.check()
    promtool, _ = binaries()
    sidecar = folder / "day.json"
    meta = json.loads(sidecar.read_text()) if sidecar.exists() else None
    if meta and not rebuild and meta.get("complete") and meta["params"] == spec.params():
        return meta | {"reused": True}
    if folder.exists() and meta is None and any(folder.iterdir()) and not rebuild:
        raise HbmwatchError(f"{folder} holds something else; pass --rebuild or another --dir")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    end_ms = int(time.time() * 1000) // HOUR_MS * HOUR_MS  # the day ends before now
    meta = {"params": spec.params(), "complete": False, "end_ms": end_ms,
            "start_ms": end_ms - spec.hours * HOUR_MS}  # fmt: skip
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    store = open_bench_store(folder / "hbmwatch.db")
    try:
        meta["load"] = generate(spec, store, folder / "data.om", meta["start_ms"], progress)
    finally:
        store.close()
    progress("promtool tsdb create-blocks-from openmetrics", 0, 1)
    t0 = time.perf_counter()
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(folder / "data.om"),
         str(folder / "tsdb")], capture_output=True, text=True, timeout=6 * 3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise HbmwatchError(f"promtool failed: {(done.stderr or done.stdout)[-500:]}")
    meta["load"]["promtool_seconds"] = round(time.perf_counter() - t0, 2)
    (folder / "data.om").unlink()
    shutil.rmtree(folder / "parts", ignore_errors=True)
    progress("promtool tsdb create-blocks-from openmetrics", 1, 1)
    meta["load"]["sqlite_bytes"] = _bytes(folder / "hbmwatch.db")
    meta["load"]["tsdb_bytes"] = _bytes(folder / "tsdb")
    meta["complete"] = True
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    return meta | {"reused": False}


def _bytes(path: Path) -> int:
    if path.is_file():
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the two servers -------------------------------------------------------------------------
@contextlib.contextmanager
def hbmwatch_server(db: Path) -> Iterator[tuple[str, int]]:
    """``create_app`` over the day's store under uvicorn in its own process (the server of
    ``hbmwatch bench api``); yields the Prometheus-compatible base URL and the PID."""
    with served(db, wait_s=60.0) as (base_url, pid):
        yield f"{base_url}/prometheus", pid


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    name: str
    url: str
    pid: int
    client: httpx.Client
    extra: dict[str, str] = field(default_factory=dict)

    def ask(self, expr: str, start: int, end: int, step: int, keep: bool = False) -> dict[str, Any]:
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        params |= self.extra
        cpu0, t0 = cpu_seconds(self.pid), time.perf_counter()
        response = self.client.get(f"{self.url}/api/v1/query_range", params=params)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(self.pid) - cpu0
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if response.status_code != 200 or body.get("status") != "success":
            error = body.get("error") or response.text[:200]
            return {"wall": wall, "cpu": cpu, "error": f"{response.status_code}: {error}"}
        result = body["data"]["result"]
        points = sum(len(s.get("values", ())) for s in result)
        out = {"wall": wall, "cpu": cpu, "series": len(result), "points": points,
               "bytes": len(response.content), "warnings": body.get("warnings", [])}  # fmt: skip
        return out | {"result": result} if keep else out


def agree(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> bool:
    """The same series, timestamps and values (relative 1e-9, NaN equal to NaN): what a
    panel would draw, not only as many points."""

    def table(result: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
        return {json.dumps(s["metric"], sort_keys=True): [(float(t), float(v)) for t, v in
                s["values"]] for s in result}  # fmt: skip

    a, b = table(ours), table(theirs)
    if a.keys() != b.keys():
        return False
    return all(
        len(a[k]) == len(b[k])
        and all(
            ta == tb and (va == vb or (va != va and vb != vb) or abs(va - vb) <= 1e-9 * abs(vb))
            for (ta, va), (tb, vb) in zip(a[k], b[k], strict=True)
        )
        for k in a
    )


def _stats(samples: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [s["error"] for s in samples if "error" in s]
    walls = np.array([s["wall"] for s in samples]) * 1000
    out: dict[str, Any] = {
        "p50_ms": round(float(np.percentile(walls, 50)), 2),
        "p99_ms": round(float(np.percentile(walls, 99)), 2),
        "cpu_s_per_run": round(float(np.nanmean([s["cpu"] for s in samples])), 4),
    }
    if errors:
        out["error"] = errors[0]
    else:
        out |= {k: samples[-1][k] for k in ("series", "points", "bytes", "warnings")}
    return out


def measure(
    servers: list[Server],
    qs: list[Query],
    meta: dict[str, Any],
    step: int,
    runs: int,
    budget_s: float,
    progress: Progress = _quiet,
) -> list[dict[str, Any]]:
    """Each query once on each server to warm up, then ``runs`` times, alternately; a query
    stops after 3 runs once it has taken ``budget_s`` (the row says how many ran)."""
    start, end = meta["start_ms"] // 1000, meta["end_ms"] // 1000
    rows = []
    for i, q in enumerate(qs):
        began = time.monotonic()
        first = {s.name: s.ask(q.expr, start, end, step, keep=True) for s in servers}
        timed: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
        for n in range(runs):
            if n >= 3 and time.monotonic() - began > budget_s:
                break
            for server in servers:
                timed[server.name].append(server.ask(q.expr, start, end, step))
        row: dict[str, Any] = {"query": q.name, "expr": q.expr, "source": q.source,
                               "runs": len(timed[servers[0].name])}  # fmt: skip
        for name, samples in timed.items():
            row[name] = _stats(samples)
        h, p = row.get("hbmwatch", {}), row.get("prometheus", {})
        if "error" not in h and "error" not in p and p.get("p50_ms"):
            row["ratio_p50"] = round(h["p50_ms"] / p["p50_ms"], 2)
            row["same_series"] = h["series"] == p["series"]
            row["same_points"] = h["points"] == p["points"]
            warm_h, warm_p = first.get("hbmwatch", {}), first.get("prometheus", {})
            row["same_values"] = (
                "result" in warm_h
                and "result" in warm_p
                and agree(warm_h["result"], warm_p["result"])
            )
        rows.append(row)
        progress(f"{len(qs)} queries x {runs} runs on each server", i + 1, len(qs))
    return rows


def bench_promql(
    *,
    folder: Path,
    spec: DaySpec,
    step: int,
    runs: int,
    rebuild: bool = False,
    budget_s: float = 60.0,
    dashboards: Path = DASHBOARDS,
    resolution: str = "auto",
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Load (or reuse) the day, serve it from both, time every query; the JSON report."""
    from hbmwatch.bench.benchmarks import machine
    from hbmwatch.bench.realprom import RealPrometheus

    meta = ensure_day(folder, spec, rebuild=rebuild, progress=progress)
    qs, skipped = queries(spec, step, dashboards)
    with (
        hbmwatch_server(folder / "hbmwatch.db") as (hbm_url, hbm_pid),
        RealPrometheus(folder / "tsdb") as prom,
        httpx.Client(timeout=600) as c1,
        httpx.Client(timeout=600) as c2,
    ):
        extra = {} if resolution == "auto" else {"resolution": resolution}
        servers = [Server("hbmwatch", hbm_url, hbm_pid, c1, extra),
                   Server("prometheus", prom.url, prom.process.pid, c2)]  # fmt: skip
        rows = measure(servers, qs, meta, step, runs, budget_s, progress)
    return {
        "machine": machine(),
        "params": spec.params(),
        "step_s": step,
        "runs": runs,
        "query_budget_s": budget_s,
        "range": {"start_ms": meta["start_ms"], "end_ms": meta["end_ms"]},
        "reused": meta["reused"],
        "load": meta["load"],
        "hbmwatch_server": "create_app under uvicorn, its own process, HTTP on 127.0.0.1",
        "hbmwatch_resolution": resolution,
        "prometheus_server": "prometheus 2.42 over the promtool-built TSDB, HTTP on 127.0.0.1",
        "dashboards": str(dashboards),
        "queries": rows,
        "skipped": skipped,
    }


if __name__ == "__main__":  # pragma: no cover - a manual entry point
    print(json.dumps(bench_promql(folder=Path(sys.argv[1]), spec=DaySpec(gpus=8, hours=1),
                                  step=300, runs=2), indent=2))  # fmt: skip
