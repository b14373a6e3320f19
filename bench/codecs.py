"""``hbmwatch bench codec``: bytes at rest per sample for each chunk format and chunk length.

The same samples (the store benchmark's ``TelemetryShape``, and canonical samples translated
from the simulator's DCGM and vLLM pages) are encoded by codec version 1 (zlib) and version 2
(pcodec), in chunks of a minute and of an hour per series.  Each variant's rows are written
into a table of ``samples_chunk``'s layout, with and without the minute statistics (hour
chunks: rows of ``samples_hour``'s layout, the minute statistics packed as the store's hour
pass packs them), and the series registry is measured in a real store and spread over a day
of 1 s samples.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hbmwatch.bench.benchmarks import TelemetryShape, _migrated_store, machine
from hbmwatch.bench.engines import EngineUnavailable
from hbmwatch.bench.realprom import SeriesSamples, create_blocks
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store import codec
from hbmwatch.store.bench import bytes_at_rest, chunk_rows_bytes
from hbmwatch.store.chunks import MinuteStats, pack_minutes
from hbmwatch.store.tiers import HOUR_MS, MINUTE_MS

DAY_SAMPLES = 86_400
SPANS = {"minute": MINUTE_MS, "hour": HOUR_MS}
CODECS = {"zlib (v1)": codec.VERSION, "pcodec (v2)": codec.VERSION_PCO}


@dataclass
class Dataset:
    """Samples sorted by series, then time; ``starts`` marks each series' first sample."""

    name: str
    keys: list[SeriesKey]
    sid: np.ndarray
    ts: np.ndarray
    values: np.ndarray

    @property
    def samples(self) -> int:
        return len(self.ts)


def telemetry(gpus: int, minutes: int, start_ms: int) -> Dataset:
    """The store benchmark's synthetic fleet, one sample a second per series."""
    shape = TelemetryShape(gpus, seed=1)
    seconds = minutes * 60
    matrix = np.array([shape.tick() for _ in range(seconds)]).T
    n = len(shape.keys)
    ts = np.tile(start_ms + np.arange(seconds, dtype=np.int64) * 1000, n)
    sid = np.repeat(np.arange(n, dtype=np.int64), seconds)
    return Dataset("telemetry", shape.keys, sid, ts, matrix.ravel().copy())


def simulated(nodes: int, minutes: int, start_ms: int) -> Dataset:
    """Canonical samples of a simulated H100 rack: DCGM node pages and one vLLM page a GPU."""
    from hbmwatch.collector.sources.dcgm import DcgmTranslator
    from hbmwatch.collector.sources.inference import InferenceTranslator
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import scenario_from_dict

    racks = [{"name": "r0", "nodes": nodes, "sku": "H100"}]
    scenario = scenario_from_dict({"name": "codec", "duration": "2h", "seed": 4, "racks": racks})
    sim = Simulation(scenario, start_unix=start_ms // 1000)
    fleet = sim.fleet
    at = [{"cluster": n.cluster, "rack": n.rack_name, "host": n.host} for n in fleet.nodes]
    node_tr = [DcgmTranslator(labels) for labels in at]
    service_tr = [  # the target labels ``hbmwatch sim --targets`` gives a vLLM page
        InferenceTranslator({**at[s.node], "gpu": fleet.gpus[s.gpu].device.gpu, "service": s.name})
        for s in fleet.services
    ]
    ids: dict[SeriesKey, int] = {}
    rows: list[tuple[int, int, float]] = []
    for second in range(minutes * 60):
        sim.step()
        ts = start_ms + second * 1000
        pages = [(t, sim.node_page(i) or "") for i, t in enumerate(node_tr)]
        pages += [(t, sim.service_page(i)) for i, t in enumerate(service_tr)]
        for translator, page in pages:
            for s in translator.translate_text(page, ts).samples:
                rows.append((ids.setdefault(s.series, len(ids)), s.timestamp_ms, s.value))
    data = np.array(rows, dtype=np.float64)
    order = np.lexsort((data[:, 1], data[:, 0]))
    data = data[order]
    sid = data[:, 0].astype(np.int64)
    return Dataset("simulated", list(ids), sid, data[:, 1].astype(np.int64), data[:, 2].copy())


def chunks(data: Dataset, span_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """First row of every (series, window) chunk and each chunk's window start."""
    window = data.ts - data.ts % span_ms
    new = np.r_[True, (data.sid[1:] != data.sid[:-1]) | (window[1:] != window[:-1])]
    starts = np.flatnonzero(new)
    return starts, window[starts]


def encode_variant(data: Dataset, version: int, span_ms: int) -> dict[str, Any]:
    """Encode every chunk, decode it back, and size its rows with and without statistics."""
    starts, lo = chunks(data, span_ms)
    t0 = time.process_time()
    enc = codec.encode_segments(lo, data.ts, data.values, starts, version)
    encode_s = time.process_time() - t0
    t0 = time.process_time()
    for blob, start in zip(enc.blobs, lo.tolist(), strict=True):
        codec.decode(blob, start)
    decode_s = time.process_time() - t0
    ends = np.r_[starts[1:], data.samples]
    sids, los, last_ms = data.sid[starts].tolist(), lo.tolist(), data.ts[ends - 1].tolist()
    bare = list(zip(sids, los, enc.blobs, strict=True))
    if span_ms == HOUR_MS:  # the store's samples_hour rows: minute statistics packed
        t0 = time.process_time()
        minutes = packed_minutes(data)
        encode_s += time.process_time() - t0
        hour_rows = list(zip(sids, los, minutes, enc.blobs, strict=True))
        with_stats = chunk_rows_bytes(hour_rows, 4)
    full = [
        (s, t, int(c), float(a), float(b), float(u), float(z), blob, m)
        for s, t, c, a, b, u, z, blob, m in zip(
            sids, los, enc.count, enc.min, enc.max, enc.sum, enc.last, enc.blobs, last_ms,
            strict=True,
        )
    ]  # fmt: skip
    n = data.samples
    if span_ms != HOUR_MS:
        with_stats = chunk_rows_bytes(full, 9)
    return {
        "chunks": len(starts),
        "blob_bytes_per_sample": sum(map(len, enc.blobs)) / n,
        "rows_bytes_per_sample": chunk_rows_bytes(bare, 3) / n,
        "rows_with_stats_bytes_per_sample": with_stats / n,
        "encode_cpu_s_per_million": encode_s / n * 1e6,
        "decode_cpu_s_per_million": decode_s / n * 1e6,
    }


def packed_minutes(data: Dataset) -> list[bytes]:
    """Each hour chunk's packed minute statistics, as ``samples_hour.minutes`` holds them."""
    m_starts, m_lo = chunks(data, MINUTE_MS)
    m_ends = np.r_[m_starts[1:], data.samples]
    v = data.values
    cols = (
        m_lo, m_ends - m_starts, np.minimum.reduceat(v, m_starts),
        np.maximum.reduceat(v, m_starts), np.add.reduceat(v, m_starts), v[m_ends - 1],
        data.ts[m_ends - 1],
    )  # fmt: skip
    h_starts, h_lo = chunks(data, HOUR_MS)
    bounds = np.r_[np.searchsorted(m_starts, h_starts), len(m_starts)].tolist()
    stats = [MinuteStats(*(c[a:b] for c in cols)) for a, b in itertools.pairwise(bounds)]
    return pack_minutes(h_lo.tolist(), stats)


def minute_stats_bytes(data: Dataset) -> float:
    """Bytes per sample of the 1-minute tier alone (statistics rows, no blobs)."""
    starts, lo = chunks(data, MINUTE_MS)
    ends = np.r_[starts[1:], data.samples]
    v = data.values
    rows = [
        (s, t, int(e - a), float(v[a:e].min()), float(v[a:e].max()), float(v[a:e].sum()),
         float(v[e - 1]), None, int(data.ts[e - 1]))
        for s, t, a, e in zip(data.sid[starts].tolist(), lo.tolist(), starts, ends, strict=True)
    ]  # fmt: skip
    return chunk_rows_bytes(rows, 9) / data.samples


def registry_bytes_per_series(keys: list[SeriesKey], workdir: Path) -> float:
    """The ``series`` table's bytes per series in a real SQLite store."""
    url = f"sqlite:///{workdir / 'registry.db'}"
    store = _migrated_store(url, time.time)
    now_ms = int(time.time() * 1000)
    try:
        written = store.write([Sample(k, now_ms, 0.0) for k in keys]).accepted
        if written != len(keys):
            raise RuntimeError(f"registry benchmark: {len(keys) - written} series refused")
        sizes = bytes_at_rest(store.engine, vacuum=True)
    finally:
        store.close()
    return sizes["series"] / len(keys)


def prometheus_block(data: Dataset, workdir: Path) -> dict[str, Any]:
    """The baseline: the same samples as a Prometheus block (``promtool tsdb
    create-blocks-from openmetrics``), its files (chunks, index) per sample."""
    bounds = np.flatnonzero(np.r_[True, data.sid[1:] != data.sid[:-1], True])
    series = [
        SeriesSamples(data.keys[int(data.sid[a])], data.ts[a:b], data.values[a:b])
        for a, b in itertools.pairwise(bounds.tolist())
    ]
    try:
        tsdb = create_blocks(series, workdir / f"prometheus-{data.name}")
    except EngineUnavailable as exc:
        return {"skipped": str(exc)}
    files = [p for p in tsdb.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    index = sum(p.stat().st_size for p in files if p.name == "index")
    return {"bytes_per_sample": size / data.samples,
            "chunk_bytes_per_sample": (size - index) / data.samples,
            "index_bytes_per_series": index / len(series)}  # fmt: skip


def measure(data: Dataset, workdir: Path) -> dict[str, Any]:
    """Every codec at every chunk length on one dataset, and Prometheus' block of it."""
    per_series = registry_bytes_per_series(data.keys, workdir)
    report: dict[str, Any] = {
        "series": len(data.keys),
        "samples": data.samples,
        "registry_bytes_per_series": per_series,
        "registry_bytes_per_sample_day": per_series / DAY_SAMPLES,
        "minute_stats_bytes_per_sample": minute_stats_bytes(data),
        "variants": {},
    }
    for codec_name, version in CODECS.items():
        for span_name, span_ms in SPANS.items():
            got = encode_variant(data, version, span_ms)
            got["day_bytes_per_sample"] = (
                got["rows_with_stats_bytes_per_sample"] + report["registry_bytes_per_sample_day"]
            )
            report["variants"][f"{codec_name}, per {span_name}"] = got
    report["prometheus_block"] = prometheus_block(data, workdir)
    return report


def bench_codec(
    *, gpus: int, nodes: int, minutes: int, workdir: Path | None = None
) -> dict[str, Any]:
    """Bytes at rest per sample and codec CPU on the telemetry shape and the simulator."""
    start_ms = (int(time.time()) // 3600 - 3) * HOUR_MS
    report: dict[str, Any] = {"machine": machine(), "minutes": minutes}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        datasets = [telemetry(gpus, minutes, start_ms)]
        if nodes:
            datasets.append(simulated(nodes, minutes, start_ms))
        for data in datasets:
            report[data.name] = measure(data, Path(tmp))
    return report
