#!/usr/bin/env bash
# A real trace for `hbmwatch score-file`: NVML at 1 Hz for about six minutes while
# scripts/gpu_load.py idles (180 s: the detectors' warm-up), copies HBM, runs GEMM and rests
# (60 s each), with a timed request loop on its own stream. Writes to $OUT (or ./device-out):
# nvml_samples.csv and latency.csv (canonical long layout), nvml_probe.json, load_phases.txt.
# PHASES (gpu_load.py --phases) and SECONDS_TOTAL (the capture's length) change the plan, e.g.
# PHASES=idle:150,copy:60,rest:90,gemm:60,rest:45 SECONDS_TOTAL=407 keeps the copy and the GEMM apart.
set -euo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
phases=${PHASES:-idle:180,copy:60,gemm:60,rest:60}
python3 scripts/gpu_load.py --phases "$phases" \
  --latency-csv "$out/latency.csv" > "$out/load_phases.txt" 2>&1 &
load=$!
python -m hbmwatch.collector.probe nvml --seconds "${SECONDS_TOTAL:-362}" --interval 1 --out "$out/nvml_probe.json" \
  --samples-csv "$out/nvml_samples.csv"
wait "$load" || true
cat "$out/load_phases.txt"
wc -l "$out"/*.csv
