#!/usr/bin/env python3
"""Summarises `slope run --json` lines (one per run) as a markdown table.

Peaks per thread (shared/reference/machine-limits.md, 3.5 GHz Zen 5): fp32 224 GFLOP/s,
bf16 448 GFLOP/s. FLOPs are the engine's own exact count (linear layers with the active
experts, attention under its causal/window masks, lm_head for the last position)."""
import json
import sys

PEAK = {"f32": 224.0, "bf16": 448.0}


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| model | dtype | ranks x threads | mesh | tokens | TTFT s | tokens/s | GFLOP | GFLOP/s | % of nominal peak | same-run measured peak GFLOP/s | % of measured peak | peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for j in rows:
        threads = j.get("threads_per_rank", j.get("threads", 1))
        ranks = j.get("ranks", 1)
        peak = PEAK[j["dtype"]] * threads * ranks
        mesh = j.get("mesh", {})
        mesh_s = " ".join(f"{k}={v}" for k, v in mesh.items() if k != "pp_chunk" and v != 1) or "-"
        mem = max([r.get("peak_memory_bytes", 0) for r in j.get("per_rank", [])] + [j.get("peak_memory_bytes", 0)])
        key = "bf16" if j["dtype"] == "bf16" else "fp32"
        probes = [p[key] for p in j.get("peak_probe", [])]
        measured = sum(probes) / len(probes) if probes else float("nan")
        print(f"| {j.get('model', '?')} | {j['dtype']} | {ranks}x{threads} | {mesh_s} | {j['num_tokens']} | "
              f"{j['ttft_ms'] / 1e3:.2f} | {j['tokens_per_s']:.0f} | {j['gflop']:.0f} | {j['gflops_per_s']:.0f} | "
              f"{100 * j['gflops_per_s'] / peak:.0f}% | {' / '.join(f'{p:.0f}' for p in probes)} | "
              f"{100 * j['gflops_per_s'] / measured:.0f}% | {mem / 1e9:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
