"""Load phases for a device check, as in DOMAIN.md's H200 trace: idle, HBM copy, GEMM, rest.

python3 scripts/gpu_load.py --phase-seconds 15 [--idle-seconds 200] [--latency-csv FILE]
python3 scripts/gpu_load.py --phases idle:150,copy:60,rest:90,gemm:60,rest:45

``--phases`` runs the named phases in order (idle and rest sleep, copy streams HBM, gemm
multiplies bf16 matrices until the power cap holds), so a capture can keep two loads apart.

With ``--latency-csv`` a request loop (a 64 MiB copy on its own stream, timed one by one)
runs through every phase, and each second's p50/p99 over the last 10 s and the requests in
them are written in the canonical long layout, so ``hbmwatch score-file`` can read the
latency beside the NVML trace.
"""

from __future__ import annotations

import argparse
import csv
import socket
import threading
import time

import torch

PHASE_WORDS = {"idle": "idle", "copy": "hbm copy", "gemm": "gemm", "rest": "rest"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase-seconds", type=float, default=15.0)
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument("--latency-csv", default=None)
    parser.add_argument("--phases", default=None, help="name:seconds,... (idle, copy, gemm, rest)")
    args = parser.parse_args()
    seconds = args.phase_seconds
    idle = args.idle_seconds if args.idle_seconds is not None else seconds
    default = f"idle:{idle},copy:{seconds},gemm:{seconds},rest:{seconds}"
    phases = [(n, float(t)) for n, t in (p.split(":") for p in (args.phases or default).split(","))]
    dev = torch.device("cuda")
    stop = threading.Event()
    if args.latency_csv:
        threading.Thread(target=requests, args=(args.latency_csv, stop), daemon=True).start()
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)  # 2 GiB
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    for name, length in phases:
        print(f"{time.time():.1f} {PHASE_WORDS[name]}", flush=True)
        end = time.time() + length
        if name in ("idle", "rest"):
            time.sleep(length)
            continue
        while time.time() < end:
            for _ in range(20):
                if name == "copy":
                    dst.copy_(src)
                else:
                    torch.matmul(a, b)
            torch.cuda.synchronize()
    print(f"{time.time():.1f} done", flush=True)
    stop.set()
    time.sleep(1.5)


def requests(path: str, stop: threading.Event, window_s: float = 10.0) -> None:
    """Timed small copies on their own stream; per second, the window's p50/p99."""
    stream = torch.cuda.Stream()
    src = torch.empty(64 * 1024**2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    labels = f'host="{socket.gethostname()}",gpu="0",service="probe",phase="e2e"'
    done: list[tuple[float, float]] = []
    next_write = time.time() + 1.0
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["metric", "labels", "timestamp", "value"])
        while not stop.is_set():
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                dst.copy_(src)
            stream.synchronize()
            now = time.time()
            done.append((now, time.perf_counter() - t0))
            time.sleep(0.002)
            if now >= next_write:
                next_write += 1.0
                recent = sorted(d for t, d in done if t > now - window_s)
                done = [(t, d) for t, d in done if t > now - window_s]
                if not recent:
                    continue
                for q, name in ((0.5, "0.5"), (0.99, "0.99")):
                    value = recent[min(len(recent) - 1, int(q * len(recent)))]
                    out.writerow(
                        [
                            "workload_latency_seconds",
                            f'{{{labels},quantile="{name}"}}',
                            f"{now:.3f}",
                            f"{value:.6g}",
                        ]
                    )
                out.writerow(
                    ["workload_window_requests", f"{{{labels}}}", f"{now:.3f}", len(recent)]
                )
                f.flush()


if __name__ == "__main__":
    main()
