#!/usr/bin/env bash
# Issue 16 on a real GPU: `hbmwatch up` with the NVML source and no simulator, its samples
# remote-written to a real VictoriaMetrics on the same host and read back from it by the
# detectors and the /prometheus API, while scripts/gpu_load.py idles, copies HBM, runs GEMM
# and rests. Writes to $OUT (or ./device-out): up.log, findings.txt, summary.txt.
# Needs: .devbin/victoria-metrics and .whl/*.whl (the packages the GPU image lacks), carried.
set -euo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
work=$(mktemp -d)
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
.devbin/victoria-metrics -storageDataPath="$work/vm" -httpListenAddr=127.0.0.1:8428 \
  -search.latencyOffset=0s -loggerLevel=WARN > "$work/vm.log" 2>&1 &
vm=$!
cat > "$work/hbmwatch.toml" <<EOF
[store]
url = "sqlite:///$work/state.db"
[store.remote]
write_url = "http://127.0.0.1:8428/api/v1/write"
query_url = "http://127.0.0.1:8428"
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
for i in $(seq 100); do curl -sf 127.0.0.1:8428/health >/dev/null && break; sleep 0.2; done
python3 -P -m hbmwatch.cli migrate --config "$work/hbmwatch.toml"
python3 -P -m hbmwatch.cli up --config "$work/hbmwatch.toml" > "$out/up.log" 2>&1 &
up=$!
for i in $(seq 300); do
  curl -sf 127.0.0.1:8427/healthz >/dev/null && break
  kill -0 $up 2>/dev/null || { tail -30 "$out/up.log"; exit 1; }
  sleep 0.2
done
python3 scripts/gpu_load.py --phases "${PHASES:-idle:150,copy:45,gemm:60,rest:45}" > "$out/load_phases.txt" 2>&1
sleep 15  # the last detection cycles over the rest phase
q() { curl -s "http://127.0.0.1:$1" --data-urlencode "query=$2"; echo; }
{
  echo "== samples in VictoriaMetrics, by metric"
  q 8428/api/v1/query 'sort_desc(sum by (__name__) (count_over_time({__name__=~"gpu_.*|hbm_.*|nvlink_.*|pcie_.*|xgmi_.*"}[1h])))'
  echo "== remote-write counters of hbmwatch"
  curl -s 127.0.0.1:8427/metrics | grep -E "^hbmwatch_remote_write|^hbmwatch_store_samples" || true
  echo "== read back through hbmwatch's /prometheus (the engine's query API under it)"
  q 8427/prometheus/api/v1/query 'max_over_time(gpu_power_watts[10m])'
  q 8427/prometheus/api/v1/query 'max_over_time(gpu_memory_temperature_celsius[10m])'
  q 8427/prometheus/api/v1/query 'min_over_time(gpu_clock_hertz[10m])'
  echo "== alerts and incidents over the REST API"
  curl -s "127.0.0.1:8427/api/v1/alerts?limit=20"; echo
  curl -s "127.0.0.1:8427/api/v1/incidents?limit=20"; echo
} > "$out/summary.txt" 2>&1
kill -INT $up; wait $up || true
kill $vm; wait $vm || true
python3 - "$work/state.db" > "$out/findings.txt" <<'PY'
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "SELECT kind, severity, detector, started_ms, ended_ms, summary FROM findings ORDER BY started_ms"
).fetchall()
print(len(rows), "findings")
for kind, sev, det, start, end, summary in rows:
    print(kind, sev, det, start, end, summary[:200])
PY
cat "$out/load_phases.txt" "$out/summary.txt" "$out/findings.txt"
grep -E "warning|error" "$out/up.log" | head -20 || true
