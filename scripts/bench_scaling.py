#!/usr/bin/env python3
"""Tables for scripts/bench_scaling.sh output: TTFT per configuration and prompt length, speed-up
against 1 rank x 1 thread, parallel efficiency (speed-up / ranks x threads), and the bytes each
rank sent against the analytic volume of its scheme (config.json of the model is read)."""
import json
import sys
from collections import defaultdict


def analytic_bytes_per_rank(cfg, config, n):
    """Bytes one rank sends for a prefill of n tokens under a 2-way scheme (f32 payloads)."""
    H, Hq, Hkv, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    full = sum(t == "full_attention" for t in types)
    sliding = len(types) - full
    W = cfg.get("sliding_window") or 0
    f = 4
    halo = (W - 1) * 2 * Hkv * D * f if W else 0  # one segment's window rows, all heads
    if config == "u2":
        # all-to-all of Q (half the heads), K/V (the KV heads the peer's queries read) and the
        # output back, for this rank's n/2 rows; sliding layers: halo from the previous rank.
        per_full = n / 2 * D * f * (Hq / 2 + 2 * (Hkv / 2) + Hq / 2)
        return full * per_full + sliding * halo / 2  # one of the two ranks sends the halo
    if config == "r2":
        # pass-KV ring, one step: this rank's K/V block (n/2 rows); zigzag: each rank sends one halo.
        return full * n / 2 * 2 * Hkv * D * f + sliding * halo
    if config == "pp2":
        return n * H * f / 2  # stage 0 sends every row's hidden state once (average over ranks)
    if config == "tp2":
        # two all-reduces of [n, H] per layer (after o_proj and after the MLP); this is the
        # payload each rank hands to MPI_Allreduce (a ring all-reduce moves 2(T-1)/T of it).
        return len(types) * 2 * n * H * f
    return 0.0


def main(path, config_json):
    cfg = json.load(open(config_json))
    runs = [json.loads(line) for line in open(path) if line.strip()]
    by = defaultdict(dict)
    for j in runs:
        by[j["num_tokens"]][j["config"]] = j
    cores = {"1x1": 1, "1x2": 2, "u2": 2, "r2": 2, "pp2": 2, "tp2": 2}
    print("| tokens | config | TTFT s | speed-up vs 1x1 | efficiency | vs 1x2 | sent MB/rank (measured) | analytic MB/rank | comm wait s (max rank) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sorted(by):
        base = by[n].get("1x1")
        two = by[n].get("1x2")
        for c in ["1x1", "1x2", "u2", "r2", "pp2", "tp2"]:
            j = by[n].get(c)
            if not j:
                continue
            t = j["ttft_ms"] / 1e3
            su = base["ttft_ms"] / j["ttft_ms"] if base else float("nan")
            vs2 = two["ttft_ms"] / j["ttft_ms"] if two else float("nan")
            ranks = j.get("per_rank", [])
            sent = sum(r["bytes_sent"] for r in ranks) / max(1, len(ranks)) / 1e6
            wait = max([r.get("communication_wait_ms", 0) + r.get("pipeline_wait_ms", 0) + r.get("tp_allreduce_ms", 0)
                        for r in ranks] + [0]) / 1e3
            ana = analytic_bytes_per_rank(cfg, c, n) / 1e6
            print(f"| {n} | {c} | {t:.2f} | {su:.2f} | {su / cores[c]:.0%} | {vs2:.2f} | {sent:.1f} | {ana:.1f} | {wait:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
