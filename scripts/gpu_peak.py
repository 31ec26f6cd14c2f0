#!/usr/bin/env python3
"""The device's own limits, measured with torch in the same run as tandem's figures (the
CUDA speed goals are shares of them): the bf16 matrix-product rate (8192 x 8192 x 8192,
best of 10) and the rate of a device-to-device copy of 2 GiB (bytes read + written, best of
10). One JSON line.

    python3 scripts/gpu_peak.py
"""
import json
import time

import torch


def best_of(reps, fn):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    product_s = best_of(10, lambda: torch.matmul(a, b, out=c))
    del a, b, c
    size = 2 << 30
    src = torch.empty(size, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_s = best_of(10, lambda: dst.copy_(src))
    print(json.dumps({
        "device": torch.cuda.get_device_name(),
        "bf16_matmul_tflop_per_s": 2 * n**3 / product_s / 1e12,
        "copy_traffic_gb_per_s": 2 * size / copy_s / 1e9,
    }))


if __name__ == "__main__":
    main()
