#!/usr/bin/env bash
# The NVML collector against a real NVIDIA GPU for a minute under load (idle, HBM copy,
# GEMM, rest), writing what it read to $OUT (or ./device-out). Run on a GPU host from the
# repository root; needs nvidia-ml-py and PyTorch.
set -euo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import pynvml, sys; print('nvidia-ml-py', getattr(pynvml, '__version__', '?'))"
python3 scripts/gpu_load.py --phase-seconds 15 > "$out/load_phases.txt" 2>&1 &
load=$!
python -m hbmwatch.collector.probe nvml --seconds 62 --interval 0.5 --out "$out/nvml_probe.json"
wait "$load" || true
cat "$out/load_phases.txt"
python3 - "$out/nvml_probe.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("collections", r["collections"], "median collect ms", round(r["collect_ms_median"], 2))
print("unsupported", r["unsupported"])
for name, s in r["series"].items():
    print(f"{name:120s} {s['unit']:8s} min {s['min']:.6g} max {s['max']:.6g} last {s['last']:.6g}"
          f"{'' if s['decreases'] in (None, 0) else ' decreases ' + str(s['decreases'])}")
PY
