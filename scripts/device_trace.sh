#!/usr/bin/env bash
# A real trace for `hbmwatch score-file`: NVML at 1 Hz for about five minutes while
# scripts/gpu_load.py idles (200 s: the detectors' warm-up), copies HBM, runs GEMM and rests
# (30 s each), with a timed request loop on its own stream. Writes to $OUT (or ./device-out):
# nvml_samples.csv and latency.csv (canonical long layout), nvml_probe.json, load_phases.txt.
set -euo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 scripts/gpu_load.py --idle-seconds 200 --phase-seconds 30 \
  --latency-csv "$out/latency.csv" > "$out/load_phases.txt" 2>&1 &
load=$!
python3 -m collector.probe nvml --seconds 292 --interval 1 --out "$out/nvml_probe.json" \
  --samples-csv "$out/nvml_samples.csv"
wait "$load" || true
cat "$out/load_phases.txt"
wc -l "$out"/*.csv
