#!/usr/bin/env bash
# Issues 17-19 on a real GPU, in one run: `hbmwatch up` with the NVML source into its SQLite
# store (no simulator) while scripts/gpu_load.py idles 60 s, then a short GEMM regression,
# rest, HBM copy, rest; the service's own CPU per sample stored; the detectors' findings and
# incidents over the REST API; a 1 Hz NVML capture with the workload's latency (a cold-start
# regression for `score-file`); and what NVML answers about errors and health (XID events,
# row remapping, retired pages, ECC, PCIe replays). Writes to $OUT (or ./device-out).
# At most 8 files land in $OUT (the device tool brings back no more); logs stay in a temp dir
# and the summary is printed. Needs .whl/*.whl (the packages the GPU image lacks), carried.
set -euo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
work=$(mktemp -d)
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
cat > "$work/hbmwatch.toml" <<EOF
[store]
url = "sqlite:///$work/state.db"
[collector]
local_sources = ["nvml"]
spool_dir = "$work/spool"
[simulator]
enabled = false
[detection]
settle_seconds = 3
[api]
port = 8427
EOF
python3 -P -m hbmwatch.cli migrate --config "$work/hbmwatch.toml"
python3 -P -m hbmwatch.cli up --config "$work/hbmwatch.toml" > "$work/up.log" 2>&1 &
up=$!
for i in $(seq 300); do
  curl -sf 127.0.0.1:8427/healthz >/dev/null && break
  kill -0 $up 2>/dev/null || { tail -30 "$work/up.log"; exit 1; }
  sleep 0.2
done
cpu() { awk '{print $14 + $15}' /proc/$up/stat; }
written() { curl -s 127.0.0.1:8427/metrics | awk '/^hbmwatch_store_samples_written_total/ {print $2}'; }
t0=$(date +%s.%N); c0=$(cpu); w0=$(written)
phases=${PHASES:-idle:60,gemm:30,rest:45,copy:30,rest:45}
python3 scripts/nvml_health_probe.py --listen-seconds 20 --out "$out/nvml_health.json" > "$work/nvml_health.log" 2>&1 &
health=$!
python3 scripts/gpu_load.py --phases "$phases" --latency-csv "$out/latency.csv" > "$out/load_phases.txt" 2>&1 &
load=$!
python3 -P -m hbmwatch.collector.probe nvml --seconds "${SECONDS_TOTAL:-212}" --interval 1 \
  --out "$out/nvml_probe.json" --samples-csv "$out/nvml_samples.csv"
wait "$load" || true
wait "$health" || true
sleep 5  # the last detection cycle over the rest phase
t1=$(date +%s.%N); c1=$(cpu); w1=$(written); hz=$(getconf CLK_TCK)
{
  python3 - "$t0" "$t1" "$c0" "$c1" "$w0" "$w1" "$hz" <<'PY'
import sys
t0, t1, c0, c1, w0, w1, hz = map(float, sys.argv[1:])
cpu = (c1 - c0) / hz
n = w1 - w0
print(f"hbmwatch up (NVML source, SQLite store, detectors, API): {cpu:.2f} CPU-s over "
      f"{t1 - t0:.0f} s wall, {n:.0f} samples stored, "
      f"{cpu / max(n, 1) * 1e6:.1f} CPU-s per 1M samples, {cpu / (t1 - t0):.3f} cores")
PY
  echo "== incidents"; curl -s "127.0.0.1:8427/api/v1/incidents?limit=20"; echo
  echo "== alerts"; curl -s "127.0.0.1:8427/api/v1/alerts?limit=20"; echo
  echo "== store metrics"; curl -s 127.0.0.1:8427/metrics | grep -E "^hbmwatch_store_|^hbmwatch_scrape" | head -30
} > "$work/summary.txt" 2>&1
kill -INT $up; wait $up || true
python3 - "$work/state.db" > "$out/findings.txt" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute(
    "SELECT kind, severity, detector, started_ms, ended_ms, summary FROM findings ORDER BY started_ms"
).fetchall()
print(len(rows), "findings")
for kind, sev, det, start, end, summary in rows:
    print(kind, sev, det, start, end, summary[:240])
for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
    print("table", name, db.execute(f"SELECT count(*) FROM {name}").fetchone()[0], "rows")
PY
cat "$out/load_phases.txt" "$work/summary.txt" "$out/findings.txt"
head -c 1500 "$work/nvml_health.log"; echo
grep -E "warning|error" "$work/up.log" | head -20 || true
wc -l "$out"/*.csv
