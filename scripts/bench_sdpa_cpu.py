#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention on the shapes of bench/attention.cpp: the peer
that issue 14's attention targets are measured against, run with the same thread count.

For each prompt length, causal and (optionally) sliding-window, f32 and bf16: the best of REPS
timed calls after a warm-up, and GFLOP/s counted as bench_attention counts them, 4 * D flops per
visible (query, key, head). Causal uses `is_causal=True` (PyTorch's CPU flash kernel); a window
needs an explicit boolean mask, which takes PyTorch off its flash kernel (said in the output).
One JSON object per case on stdout.

    scripts/bench_sdpa_cpu.py [--threads 2] [--lengths 4096,16384,32768] [--heads 4] [--kv-heads 1]
                              [--head-dim 64] [--window 128] [--window-max 16384] [--reps 3]
Needs torch (e.g. the venv of scripts/kv-venv.sh).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def visible_pairs(n, window):
    """(query, key) pairs with key <= query and query - key < window (0: no window)."""
    if window <= 0 or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=128, help="0: causal only")
    ap.add_argument("--window-max", type=int, default=16384,
                    help="longest prompt for the window case (its mask is N x N bytes)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    for n in (int(x) for x in a.lengths.split(",")):
        for dtype_name in a.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            q = torch.rand(1, a.heads, n, a.head_dim, dtype=dtype) * 2 - 1
            k = torch.rand(1, a.kv_heads, n, a.head_dim, dtype=dtype) * 2 - 1
            v = torch.rand(1, a.kv_heads, n, a.head_dim, dtype=dtype) * 2 - 1
            cases = [("causal", 0)]
            if a.window > 0 and n <= a.window_max:
                cases.append((f"window{a.window}", a.window))
            for name, window in cases:
                kw = {"is_causal": True, "enable_gqa": a.kv_heads != a.heads}
                if window:
                    i = torch.arange(n)
                    d = i[:, None] - i[None, :]
                    kw = {"attn_mask": (d >= 0) & (d < window), "enable_gqa": a.kv_heads != a.heads}
                F.scaled_dot_product_attention(q, k, v, **kw)  # warm-up
                best = float("inf")
                for _ in range(a.reps):
                    t = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, **kw)
                    best = min(best, time.perf_counter() - t)
                flops = 4.0 * a.head_dim * a.heads * visible_pairs(n, window)
                print(json.dumps({"peer": "torch-sdpa", "torch": torch.__version__, "threads": a.threads,
                                  "tokens": n, "mask": name, "dtype": dtype_name, "Hq": a.heads,
                                  "Hkv": a.kv_heads, "D": a.head_dim, "seconds": best,
                                  "gflops_per_s": flops / best / 1e9,
                                  "kernel": "flash (is_causal)" if not window else "masked (boolean attn_mask)"}),
                      flush=True)


if __name__ == "__main__":
    main()
