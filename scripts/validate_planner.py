#!/usr/bin/env python3
"""Validate the cost model against measured TTFT on this machine (issue 5, "Validation").

Reads `slope run --json` lines from scripts/bench_scaling.sh (default: the committed
measurements, docs/data/planner-validation.jsonl: 1x1, 1x2, u2, r2, pp2, tp2, u2r2) and
optionally scripts/bench_e2e.sh (--e2e), predicts every (configuration, length) point with `slope plan --predict` from the
calibrated profile of that rank layout, and prints a markdown table: configuration, tokens,
measured TTFT, predicted TTFT, relative error (predicted / measured - 1), the two largest
predicted phases, then the median and maximum |relative error|.

Repeated runs of one point are reduced to their median. Points measured while the machine was
disturbed can be left out with --exclude CONFIG:TOKENS[:DTYPE]=REASON (listed under the table
with the reason); a point whose peak probes (before / after, e2e only) differ by more than 20%
is flagged.

Usage: scripts/validate_planner.py [--slope build/release/slope] [--profiles-dir profiles]
         [--e2e bench-results/e2e.jsonl] [--scaling docs/data/planner-validation.jsonl]
         [--model models/bench-gpt-oss-bf16] [--no-engine-spec] [--json OUT] [--exclude ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict

# Rank layout of each configuration: (profile name, U, R, P, TP); profile names are the files
# `slope calibrate` wrote for that layout (docs/planner.md section 6).
CONFIGS = {
    "1x1": ("cpu-zen4-1c", 1, 1, 1, 1),
    "1x2": ("cpu-zen4-2c", 1, 1, 1, 1),
    "u2": ("cpu-zen4-2x1", 2, 1, 1, 1),
    "r2": ("cpu-zen4-2x1", 1, 2, 1, 1),
    "pp2": ("cpu-zen4-2x1", 1, 1, 2, 1),
    "tp2": ("cpu-zen4-2x1", 1, 1, 1, 2),
    "u2r2": ("cpu-zen4-4x1-oversub", 2, 2, 1, 1),
}
ORDER = ["1x2", "1x1", "u2", "r2", "pp2", "tp2", "u2r2"]


def load(path, default_config=None):
    rows = []
    if not os.path.exists(path):
        return rows
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "config" not in j:
            if default_config is None:
                continue
            j["config"] = default_config(j)
        rows.append(j)
    return rows


def e2e_config(j):
    return {1: "1x1", 2: "1x2"}.get(j.get("threads_per_rank"), f"1x{j.get('threads_per_rank')}")


def config_of(j):
    """Configuration name from the run's own mesh record (falls back to the label)."""
    m = j.get("mesh", {})
    u, r, p, t = m.get("ulysses", 1), m.get("ring", 1), m.get("pp", 1), m.get("tp", 1)
    if (u, r, p, t) == (1, 1, 1, 1):
        return {1: "1x1", 2: "1x2"}.get(j.get("threads_per_rank"), j["config"])
    name = "".join(f"{k}{v}" for k, v in (("u", u), ("r", r), ("pp", p), ("tp", t)) if v > 1)
    return name


def predict(slope, model, profile, mesh, tokens, dtype, no_engine):
    cmd = [slope, "plan", "--predict", "--model", model, "--hardware", profile, "--mesh",
           ",".join(str(x) for x in mesh), "--context", str(tokens), "--dtype", dtype, "--json"]
    if no_engine:
        cmd.append("--no-engine-spec")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slope", default=None, help="slope binary (default: build/release/slope)")
    ap.add_argument("--profiles-dir", default="profiles")
    ap.add_argument("--e2e", default="", help="scripts/bench_e2e.sh lines (one rank), if any")
    ap.add_argument("--scaling", default="docs/data/planner-validation.jsonl")
    ap.add_argument("--extra", action="append", default=[], help="more slope run --json files (e.g. u2r2 runs)")
    ap.add_argument("--model", default="models/bench-gpt-oss-bf16")
    ap.add_argument("--dtypes", default="bf16", help="dtypes to validate, comma-separated (bf16,f32)")
    ap.add_argument("--no-engine-spec", action="store_true", help="predict without the profile's engine object")
    ap.add_argument("--exclude", action="append", default=[], help="CONFIG:TOKENS[:DTYPE]=REASON: leave a point out")
    ap.add_argument("--drop", action="append", default=[],
                    help="SOURCE:CONFIG:TOKENS=REASON: drop the runs of one file (e2e, scaling, extra) at a point")
    ap.add_argument("--json", default=None, help="also write the points as JSON to this file")
    a = ap.parse_args()
    slope = a.slope or "build/release/slope"

    runs = [dict(j, _source="e2e") for j in (load(a.e2e, e2e_config) if a.e2e else [])] + \
        [dict(j, _source="scaling") for j in load(a.scaling)]
    for f in a.extra:
        runs += [dict(j, _source="extra") for j in load(f, lambda j: "extra")]
    drops = {}
    for d in a.drop:
        key, _, reason = d.partition("=")
        src, cfg, n = key.split(":")
        drops[(src, cfg, int(n))] = reason or "dropped"
    dropped = []
    dtypes = set(a.dtypes.split(","))
    excluded = {}
    for e in a.exclude:
        key, _, reason = e.partition("=")
        parts = key.split(":")
        excluded[(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "bf16")] = reason or "excluded"

    points = defaultdict(list)
    for j in runs:
        if j.get("dtype") not in dtypes or j.get("batch", 1) != 1:
            continue
        if os.path.basename(j.get("model", a.model).rstrip("/")) != os.path.basename(a.model.rstrip("/")) and "model" in j:
            if not j["model"].endswith(os.path.basename(a.model)):
                continue
        cfg = config_of(j)
        if cfg not in CONFIGS:
            continue
        if (j["_source"], cfg, j["num_tokens"]) in drops:
            dropped.append((j["_source"], cfg, j["num_tokens"], j["ttft_ms"] / 1e3, drops[(j["_source"], cfg, j["num_tokens"])]))
            continue
        points[(cfg, j["num_tokens"], j["dtype"])].append(j)

    rows, left_out = [], []
    for (cfg, n, dt) in sorted(points, key=lambda k: (ORDER.index(k[0]), k[2], k[1])):
        js = points[(cfg, n, dt)]
        meas = statistics.median(j["ttft_ms"] for j in js) / 1e3
        flags = []
        for j in js:
            probes = j.get("peak_probe") or []
            vals = [p.get("bf16" if dt == "bf16" else "fp32", 0) for p in probes]
            if len(vals) == 2 and min(vals) < 0.8 * max(vals):
                flags.append("peak probes differ >20%")
        prof_name, U, R, P, TP = CONFIGS[cfg]
        chunk = js[0].get("mesh", {}).get("pp_chunk", 0) if P > 1 else 0
        mesh = (U, R, P, TP, chunk) if P > 1 else (U, R, P, TP)
        profile = os.path.join(a.profiles_dir, prof_name + ".json")
        if not os.path.exists(profile):
            left_out.append((cfg, n, dt, meas, f"no profile {profile}"))
            continue
        pr = predict(slope, a.model, profile, mesh, n, "fp32" if dt == "f32" else dt, a.no_engine_spec)
        pred = pr["ttft_s"]
        ph = sorted(pr["phases_s"].items(), key=lambda kv: -kv[1])
        row = {"config": cfg, "mesh": pr["mesh_name"], "dtype": dt, "tokens": n, "runs": len(js),
               "measured_s": meas, "predicted_s": pred, "rel_error": pred / meas - 1,
               "phases_s": pr["phases_s"], "flags": flags, "profile": prof_name}
        if (cfg, n, dt) in excluded:
            row["excluded"] = excluded[(cfg, n, dt)]
            left_out.append((cfg, n, dt, meas, f"{excluded[(cfg, n, dt)]} (predicted {pred:.2f} s, {pred / meas - 1:+.1%})"))
        row["sources"] = sorted({j["_source"] for j in js})
        rows.append(row)
        row["top_phases"] = ", ".join(f"{k} {v:.2f}" for k, v in ph[:2])

    kept = [r for r in rows if "excluded" not in r]
    print("| config | mesh | dtype | tokens | measured TTFT s | predicted TTFT s | rel. error | largest predicted phases (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in kept:
        note = " (" + "; ".join(r["flags"]) + ")" if r["flags"] else ""
        print(f"| {r['config']} | {r['mesh']} | {r['dtype']} | {r['tokens']} | {r['measured_s']:.2f} | "
              f"{r['predicted_s']:.2f} | {r['rel_error']:+.1%}{note} | {r['top_phases']} |")
    if kept:
        errs = [abs(r["rel_error"]) for r in kept]
        worst = max(kept, key=lambda r: abs(r["rel_error"]))
        print(f"\n{len(kept)} points; |relative error| median {statistics.median(errs):.1%}, "
              f"max {max(errs):.1%} ({worst['config']} at {worst['tokens']}); "
              f"signed median {statistics.median(r['rel_error'] for r in kept):+.1%}")
    for src, cfg, n, t, why in dropped:
        print(f"- run dropped: {src} {cfg} {n} tokens, {t:.2f} s: {why}")
    for cfg, n, dt, meas, why in left_out:
        print(f"- left out: {cfg} {dt} {n} tokens (measured {meas:.2f} s): {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
