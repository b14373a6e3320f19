"""Load phases for a device check, as in DOMAIN.md's H200 trace: idle, HBM copy, GEMM, rest.

python3 scripts/gpu_load.py --phase-seconds 15
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase-seconds", type=float, default=15.0)
    seconds = parser.parse_args().phase_seconds
    dev = torch.device("cuda")
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)  # 2 GiB
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    print(f"{time.time():.1f} idle", flush=True)
    time.sleep(seconds)
    print(f"{time.time():.1f} hbm copy", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()
    print(f"{time.time():.1f} gemm", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    print(f"{time.time():.1f} rest", flush=True)
    time.sleep(seconds)
    print(f"{time.time():.1f} done", flush=True)


if __name__ == "__main__":
    main()
