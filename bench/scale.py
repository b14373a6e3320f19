"""``hbmwatch bench scale``: collector processes remote-writing to VictoriaMetrics, beside
Prometheus scraping the same simulated fleet in the same run.

One fleet (``hbmwatch sim`` in its own process, on a slow simulated clock so that serving
its pages costs little) is scraped in three phases, one after another (a small machine's
cores are shared): A, one ``hbmwatch collect`` into a fresh VictoriaMetrics; B, two,
``--shard 0/2`` and ``1/2``, into another; C, the baseline, a real Prometheus with a
scrape config listing the same pages at the same interval.

Each phase warms up (series registered, first samples stored), then is measured over a
window: CPU-seconds (user + sys, ``/proc/<pid>/stat``) of every process at both ends, and
the samples the engine holds inside the window (``count_over_time``).  At the end of a
collector phase, what the collectors say they wrote ("collector stopped") must all be
counted in VictoriaMetrics: both numbers are reported, and a difference is loud.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from hbmwatch.bench.benchmarks import _scenario_toml, machine
from hbmwatch.bench.engines import (
    EngineProcess,
    EngineUnavailable,
    PrometheusServer,
    VictoriaMetrics,
)
from hbmwatch.runtime.service import migrate
from hbmwatch.settings import Settings, StoreSettings

#: Every series: the selector behind each count.
ALL = '{__name__=~".+"}'
#: Simulated seconds per wall second: one render of each page every 100 s.
FLEET_SPEED = 0.01
Progress = Callable[[str, int, int], None]


def _quiet(stage: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class ScaleSpec:
    gpus: int = 256
    seconds: float = 60.0
    interval_s: float = 1.0
    warmup_s: float = 10.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds of ``pid`` and its waited-for children, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def racks_of(gpus: int) -> list[dict[str, Any]]:
    """``gpus`` (a multiple of 8) on racks of up to 8 nodes of 8 GPUs, four SKUs in turn."""
    skus = ("MI300X", "H200", "MI355X", "H100")
    nodes, racks = gpus // 8, []
    while nodes > 0:
        racks.append({"name": f"r{len(racks)}", "nodes": min(8, nodes),
                      "sku": skus[len(racks) % 4]})  # fmt: skip
        nodes -= 8
    return racks


def fleet_toml(gpus: int) -> str:
    """``racks_of(gpus)`` with a training job a rack: the shape ``bench collect`` scrapes
    (exporter pages of 8 GPUs each, one step-time page a job), not a vLLM page per GPU."""
    racks = racks_of(gpus)
    jobs = [{"name": f"job{r['name']}", "racks": [r["name"]]} for r in racks]
    return _scenario_toml({"name": "scale", "duration": "24h", "seed": 3, "racks": racks,
                           "workload": {"training": jobs}})  # fmt: skip


@contextmanager
def simulated_fleet(
    folder: Path,
    gpus: int,
    *,
    toml: str | None = None,
    speed: float = FLEET_SPEED,
    exporter_refresh_s: float = 0.0,
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The fleet's process and its targets ({kind, url, labels}); ``toml`` is the scenario
    (``fleet_toml(gpus)`` when None); ``exporter_refresh_s`` > 0: node exporters' pages
    change only that often (dcgm-exporter's default is 30 s)."""
    (folder / "fleet.toml").write_text(toml or fleet_toml(gpus))
    targets_file = folder / "targets.json"
    argv = [sys.executable, "-m", "hbmwatch.cli", "sim", str(folder / "fleet.toml"),
            "--port", "0", "--speed", str(speed), "--targets", str(targets_file),
            "--truth", str(folder / "truth.json")]  # fmt: skip
    if exporter_refresh_s:
        argv += ["--exporter-refresh", f"{exporter_refresh_s:g}"]
    with (folder / "sim.log").open("w") as log_file:
        sim = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not targets_file.exists() or not targets_file.read_text().strip():
            if time.monotonic() > deadline or sim.poll() is not None:
                raise RuntimeError(f"the simulated fleet did not start; see {folder}/sim.log")
            time.sleep(0.2)  # polling a condition, with a deadline
        yield sim.pid, json.loads(targets_file.read_text())
    finally:
        sim.terminate()
        sim.wait(timeout=30)


def query(engine: EngineProcess, promql: str, at: float | None = None) -> float:
    """The one number an instant query answers (0 when it answers nothing)."""
    data: dict[str, Any] = {"query": promql}
    if at is not None:
        data["time"] = f"{at:.3f}"
    answer = httpx.post(engine.url + "/api/v1/query", data=data, timeout=120).json()
    if answer.get("status") != "success":
        raise RuntimeError(f"{engine.name} refused {promql}: {answer.get('error')}")
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def self_metric(engine: EngineProcess, name: str) -> float:
    """The engine's own counter ``name`` from its /metrics page, summed over its labels."""
    lines = httpx.get(engine.url + "/metrics", timeout=30).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith((name + " ", name + "{")))  # fmt: skip


def appended(engine: EngineProcess) -> float:
    """Samples the engine has taken in: appended to Prometheus' head, inserted into VM."""
    if isinstance(engine, PrometheusServer):
        return self_metric(engine, "prometheus_tsdb_head_samples_appended_total")
    return self_metric(engine, "vm_rows_inserted_total")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.25)  # polling a condition, with a deadline


def measure(
    spec: ScaleSpec,
    engine: EngineProcess,
    pids: dict[str, list[int]],
    stage: str,
    progress: Progress,
) -> dict[str, Any]:
    """Warm up, then the window: CPU of each role's processes, samples the engine holds."""
    wait_for(lambda: appended(engine) > 0, f"the first samples in {engine.name}")
    _tick(f"{stage}: warm-up", spec.warmup_s, progress)
    before = {role: sum(cpu_seconds(p) for p in ps) for role, ps in pids.items()}
    prometheus = isinstance(engine, PrometheusServer)
    appended_before = appended(engine) if prometheus else 0.0
    start = time.time()
    _tick(f"{stage}: measuring", spec.seconds, progress)
    end = time.time()
    cpu = {role: sum(cpu_seconds(p) for p in ps) - before[role] for role, ps in pids.items()}
    window = f"[{int((end - start) * 1000)}ms]"
    rounds = (end - start) / spec.interval_s
    if not prometheus:  # VictoriaMetrics counts every sample of the window
        samples = query(engine, f"sum(count_over_time({ALL}{window}))", at=end)
        per_series = query(engine, f"avg(count_over_time({ALL}{window}))", at=end)
        return {"window_s": end - start, "samples": samples, "cpu_s": cpu,
                "rounds_kept": per_series / rounds}  # fmt: skip
    # Prometheus refuses count_over_time across names (same labels once the name is dropped):
    # its own counter counts every sample appended, its scrape series count the rest.
    samples = appended(engine) - appended_before
    page = query(engine, f"sum(sum_over_time(scrape_samples_post_metric_relabeling{window}))",
                 at=end)  # fmt: skip
    kept = query(engine, f"avg(count_over_time(up{window}))", at=end)
    return {"window_s": end - start, "samples": samples, "cpu_s": cpu, "page_samples": page,
            "rounds_kept": kept / rounds}  # fmt: skip


def _tick(stage: str, seconds: float, progress: Progress) -> None:
    """Let ``seconds`` of the run pass (the span being measured), showing it."""
    total = max(1, round(seconds))
    end = time.monotonic() + seconds
    for done in range(total):
        progress(stage, done, total)
        time.sleep(max(0.0, min(1.0, end - time.monotonic())))
    time.sleep(max(0.0, end - time.monotonic()))
    progress(stage, total, total)


def collector_config(folder: Path, name: str, vm: VictoriaMetrics, targets: Path,
                     spec: ScaleSpec) -> Path:  # fmt: skip
    """The TOML of one ``hbmwatch collect``: its own SQLite registry, samples to ``vm``."""
    store = StoreSettings(url=f"sqlite:///{folder / name}.db")
    migrate(Settings(store=store))
    lines = ['log_level = "info"', 'log_format = "json"', "[store]", f'url = "{store.url}"',
             "[store.remote]", f'write_url = "{vm.write_url}"', f'query_url = "{vm.url}"',
             "[collector]", f'target_file = "{targets}"', f"interval_seconds = {spec.interval_s}",
             f'spool_dir = "{folder / name}-spool"']  # fmt: skip
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def stopped_totals(log_path: Path) -> dict[str, Any]:
    """The collector's last "collector stopped" line (what it wrote, targets it scraped)."""
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"collector stopped"' in line:
            return dict(json.loads(line))
    raise RuntimeError(f"no 'collector stopped' line in {log_path}")


def collector_phase(
    folder: Path, spec: ScaleSpec, targets: Path, fleet_pid: int, shards: list[str | None],
    stage: str, progress: Progress,
) -> dict[str, Any]:  # fmt: skip
    """``len(shards)`` collector processes into a fresh VictoriaMetrics, measured."""
    folder.mkdir(parents=True)
    began = time.time()
    with VictoriaMetrics(folder / "vm") as vm:
        procs = []
        try:
            for i, shard in enumerate(shards):
                config = collector_config(folder, f"collector{i}", vm, targets, spec)
                argv = [sys.executable, "-m", "hbmwatch.cli", "collect", "--config", str(config),
                        *(["--shard", shard] if shard else [])]  # fmt: skip
                with (folder / f"collector{i}.log").open("w") as log_file:
                    procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                  stderr=log_file))  # fmt: skip
            roles = {"collector": [p.pid for p in procs], "engine": [vm.pid], "fleet": [fleet_pid]}
            result = measure(spec, vm, roles, stage, progress)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=120)
        totals = [stopped_totals(folder / f"collector{i}.log") for i in range(len(procs))]
        # Stored by the collectors: written at once, or spooled (a busy writer) and replayed.
        written = sum(int(t["written"]) + int(t["replayed"]) for t in totals)
        progress(f"{stage}: counting", 0, 1)
        stored = _settled_count(vm, written, began)
        progress(f"{stage}: counting", 1, 1)
    spooled = sum(int(t["spooled"]) for t in totals)
    return {**result, "processes": len(procs), "written": written, "stored": stored,
            "targets_scraped": sum(int(t["targets"]) for t in totals), "spooled": spooled,
            "left_in_spool": spooled - sum(int(t["replayed"]) for t in totals)}  # fmt: skip


def _settled_count(vm: VictoriaMetrics, written: int, since: float, timeout_s: float = 60.0) -> int:
    """VM's count of every sample since ``since`` (unix s), once it equals ``written`` or
    stops changing.  (VictoriaMetrics 1.79 answers nothing for ``{__name__=~".+"}[100y]``.)"""
    deadline, last, same = time.monotonic() + timeout_s, -1, 0
    while time.monotonic() < deadline:
        window = int(time.time() - since) + 60
        now = int(query(vm, f"sum(count_over_time({ALL}[{window}s]))"))
        if now == written:
            return now
        same = same + 1 if now == last else 0
        if same >= 8:  # two seconds without a change: what it has is all there is
            return now
        last = now
        time.sleep(0.25)  # polling a condition, with a deadline
    return last


def prometheus_config(targets: list[dict[str, Any]], interval_s: float) -> str:
    """The same pages at the same interval: one static config a target, its path a label."""
    statics = []
    for t in targets:
        url = httpx.URL(t["url"])
        statics.append({"targets": [f"{url.host}:{url.port}"],
                        "labels": {**t["labels"], "__metrics_path__": url.path}})  # fmt: skip
    interval = f"{int(interval_s * 1000)}ms"
    config = {"global": {"scrape_interval": interval, "scrape_timeout": interval},
              "scrape_configs": [{"job_name": "fleet", "static_configs": statics}]}  # fmt: skip
    return json.dumps(config, indent=1)  # YAML is a superset of JSON


def prometheus_phase(folder: Path, spec: ScaleSpec, targets: list[dict[str, Any]],
                     fleet_pid: int, progress: Progress) -> dict[str, Any]:  # fmt: skip
    config = prometheus_config(targets, spec.interval_s)
    with PrometheusServer(folder, config=config) as prometheus:
        roles = {"engine": [prometheus.pid], "fleet": [fleet_pid]}
        result = measure(spec, prometheus, roles, "C  Prometheus", progress)
    return {**result, "processes": 1}


def per_million(phase: dict[str, Any]) -> None:
    """CPU-seconds per million samples, by role and in all (the fleet is not counted)."""
    millions = phase["samples"] / 1e6 or float("nan")
    cpu = phase["cpu_s"]
    phase["samples_per_second"] = phase["samples"] / phase["window_s"]
    phase["cpu_per_million"] = {
        "collector": cpu["collector"] / millions if "collector" in cpu else None,
        "engine": cpu["engine"] / millions,
        "total": (cpu.get("collector", 0.0) + cpu["engine"]) / millions,
    }


PHASES = (
    ("A", "1 collector -> VictoriaMetrics", [None]),
    ("B", "2 collectors (shards 0/2, 1/2) -> VictoriaMetrics", ["0/2", "1/2"]),
)


def bench_scale(
    spec: ScaleSpec, *, workdir: Path | None = None, progress: Progress = _quiet
) -> dict[str, Any]:
    """Phases A, B and C over one fleet (module doc); a missing engine skips its phases."""
    report: dict[str, Any] = {"machine": machine(), "gpus": spec.gpus, "seconds": spec.seconds,
                              "interval_s": spec.interval_s, "warmup_s": spec.warmup_s,
                              "phases": [], "skipped": []}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        progress("starting the simulated fleet", 0, 1)
        with simulated_fleet(folder, spec.gpus) as (fleet_pid, targets):
            progress("starting the simulated fleet", 1, 1)
            report["targets"] = len(targets)
            targets_file = folder / "targets.json"
            for name, title, shards in PHASES:
                stage = f"{name}  {len(shards)} collector{'s' * (len(shards) > 1)}"
                try:
                    phase = collector_phase(folder / name, spec, targets_file, fleet_pid,
                                            shards, stage, progress)  # fmt: skip
                except EngineUnavailable as exc:
                    report["skipped"].append({"phase": name, "title": title, "why": str(exc)})
                    continue
                report["phases"].append({"name": name, "title": title, **phase})
            try:
                phase = prometheus_phase(folder / "C", spec, targets, fleet_pid, progress)
                title = "Prometheus scraping the same pages (baseline)"
                report["phases"].append({"name": "C", "title": title, **phase})
            except EngineUnavailable as exc:
                report["skipped"].append({"phase": "C", "title": "Prometheus", "why": str(exc)})
    for phase in report["phases"]:
        per_million(phase)
    _compare(report)
    return report


def _compare(report: dict[str, Any]) -> None:
    """Ratios to Prometheus, and the invariants a reader must not have to check."""
    phases = {p["name"]: p for p in report["phases"]}
    baseline = phases.get("C")
    for p in report["phases"]:
        if baseline is not None and p is not baseline:
            p["ratio_to_prometheus"] = (
                p["cpu_per_million"]["total"] / baseline["cpu_per_million"]["total"]
            )
        if "written" in p:
            p["all_counted"] = p["written"] == p["stored"]
            p["shards_partition"] = p["targets_scraped"] == report["targets"]
