"""Read this host's GPUs with a local source for a while and write down what it saw.

    python -m hbmwatch.collector.probe nvml --seconds 60 --interval 0.5 --out nvml-probe.json \
        [--samples-csv trace.csv]

Every reading, its canonical name, unit and value range; what the device does not support;
the PCIe counter wraps seen; how long a collection takes.  ``--samples-csv`` also writes
every reading in the canonical long layout that ``hbmwatch score-file`` reads.  Used to
check a source against a real GPU (docs/collector.md records a run on an H200).  Needs only
the standard library, the source's vendor binding and this repository on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from hbmwatch import metrics


def probe(
    source: Any, seconds: float, interval: float, samples_csv: Path | None = None
) -> dict[str, Any]:
    readings: dict[str, list[tuple[float, float]]] = defaultdict(list)
    durations = []
    dropped: dict[str, int] = defaultdict(int)
    devices = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        collected = source.collect(int(time.time() * 1000))
        durations.append(time.perf_counter() - t0)
        for s in collected.samples:
            readings[s.series.text].append((s.timestamp_ms / 1000, s.value))
        for reason, n in collected.dropped.items():
            dropped[reason] += n
        devices.update({"/".join(k): vars_of(d) for k, d in collected.devices.items()})
        time.sleep(max(0.0, interval - (time.perf_counter() - t0)))
    if samples_csv is not None:
        write_long_csv(samples_csv, readings)
    series = {}
    for text, points in sorted(readings.items()):
        metric = text.split("{", 1)[0]
        values = [v for _, v in points]
        definition = metrics.get(metric)
        drops = sum(1 for a, b in itertools.pairwise(values) if b < a)
        series[text] = {
            "unit": definition.unit if definition else "?",
            "type": definition.type.value if definition else "?",
            "samples": len(values),
            "first": values[0],
            "last": values[-1],
            "min": min(values),
            "max": max(values),
            "decreases": drops if definition and definition.is_counter else None,
        }
    return {
        "source": getattr(source, "kind", type(source).__name__),
        "seconds": seconds,
        "interval": interval,
        "collections": len(durations),
        "collect_ms_median": sorted(durations)[len(durations) // 2] * 1000 if durations else None,
        "devices": devices,
        "unsupported": {
            gpu: sorted(names) for gpu, names in getattr(source, "unsupported", {}).items()
        },
        "dropped": dict(dropped),
        "series": series,
    }


def write_long_csv(path: Path, readings: dict[str, list[tuple[float, float]]]) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["metric", "labels", "timestamp", "value"])
        for text, points in sorted(readings.items()):
            metric, brace, rest = text.partition("{")
            for ts, value in points:
                out.writerow([metric, brace + rest, f"{ts:.3f}", repr(value)])


def vars_of(device: Any) -> dict[str, str]:
    return {f: getattr(device, f) for f in device.__slots__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", choices=["nvml"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples-csv", type=Path, default=None)
    args = parser.parse_args(argv)
    from hbmwatch.collector.sources.nvml import NvmlCollector, import_pynvml

    source = NvmlCollector(import_pynvml())
    source.open()
    try:
        report = probe(source, args.seconds, args.interval, args.samples_csv)
    finally:
        source.close()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{report['collections']} collections, {len(report['series'])} series, "
        f"unsupported: {report['unsupported']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
