#!/usr/bin/env python3
"""Load benchmark of `slope serve`: open-loop arrivals, TTFT percentiles, SLO attainment, goodput.

Sends POST /v1/completions with the prompt as token ids, max_tokens=1 and a `ttft_slo_ms` field,
at Poisson arrivals of a given rate (or at the times of a replayed trace), and measures each
request's TTFT as the time to its response. A 429 counts as a reject; anything else that is not
a 200 (or no answer at all) as an error. The server's own figures come from the response's
extension field: slope.predicted_ttft_ms, slope.ttft_ms, slope.queue_ms.

  # one rate, 60 s of arrivals, a named length mix
  bench_serve.py --url http://127.0.0.1:8080 --rate 2 --duration 60 --mix mixed-256-8k --slo-ms 2000
  # a sweep, one CSV row per rate (the series' name in the plot is --label)
  bench_serve.py --url ... --sweep 0.5,1,2,4 --duration 60 --label "slo 2 instances" --csv slo.csv
  # the TTFT-versus-throughput figure: one series per CSV, and the planner's predicted curves
  bench_serve.py --plot fig.png slo.csv fcfs.csv --planner-curves plan.csv --slo-ms 2000

Arrivals are drawn from --seed, so two runs with the same seed, rate, duration and mix send the
same requests at the same times (the comparison of schedulers depends on it). Needs aiohttp
(scripts/bench_serve_requirements.txt; scripts/serve-venv.sh makes a venv with it) and, for
--plot, gnuplot. Documentation: docs/serving-scheduler.md.
"""

import argparse
import asyncio
import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

# Named length mixes: (tokens, weight). mixed-256-8k is the comparison: powers of two
# from 256 to 8192, equally likely (so about half the requests are 1K or shorter and the 8K ones
# carry most of the work).
MIXES = {
    "mixed-256-8k": [(256, 1), (512, 1), (1024, 1), (2048, 1), (4096, 1), (8192, 1)],
    "short-256-1k": [(256, 1), (512, 1), (1024, 1)],
    "long-8k-32k": [(8192, 1), (16384, 1), (32768, 1)],
}

SUMMARY_FIELDS = [
    "label", "offered_rps", "duration_s", "sent", "ok", "rejected", "errors", "retry_after_missing",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "slo_met", "slo_attainment", "admitted_attainment",
    "goodput_rps", "throughput_rps", "predicted_vs_measured", "prediction_mae_ms", "server_ttft_p50_ms",
    "queue_p50_ms", "queue_p90_ms", "wall_s",
]
REQUEST_FIELDS = ["label", "offered_rps", "index", "send_s", "tokens", "slo_ms", "status", "ttft_ms",
                  "predicted_ttft_ms", "server_ttft_ms", "queue_ms", "retry_after", "error"]


def die(msg):
    print(f"bench_serve.py: {msg}", file=sys.stderr)
    sys.exit(2)


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def read_mix(spec):
    """A named mix, or a file of `tokens weight` lines (comma or space separated, # comments)."""
    if spec in MIXES:
        return MIXES[spec]
    if not os.path.exists(spec):
        die(f"--mix {spec!r}: neither a named mix ({', '.join(MIXES)}) nor a file")
    mix = []
    with open(spec) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].replace(",", " ").split()
            if not line:
                continue
            try:
                tokens = int(line[0])
                weight = float(line[1]) if len(line) > 1 else 1.0
            except ValueError:
                die(f"{spec}:{n}: expected `tokens [weight]`, got {' '.join(line)!r}")
            if tokens < 1 or not weight > 0:
                die(f"{spec}:{n}: tokens must be >= 1 and the weight > 0")
            mix.append((tokens, weight))
    if not mix:
        die(f"{spec}: no `tokens [weight]` lines")
    return mix


def read_trace(path, default_slo_ms):
    """A CSV with a header naming `t_s` (arrival, seconds from the start) and `tokens`, and
    optionally `slo_ms`."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        die(f"--trace {path}: {e.strerror}")
    if not rows or "t_s" not in rows[0] or "tokens" not in rows[0]:
        die(f"--trace {path}: expected a CSV header with columns t_s,tokens[,slo_ms]")
    out = []
    for n, r in enumerate(rows, 2):
        try:
            out.append((float(r["t_s"]), int(r["tokens"]), float(r.get("slo_ms") or default_slo_ms)))
        except ValueError:
            die(f"{path}:{n}: t_s, tokens and slo_ms must be numbers")
    out.sort()
    return out


def poisson_arrivals(rate, duration, mix, slo_ms, seed):
    rng = random.Random(seed)
    lengths = [t for t, _ in mix]
    weights = [w for _, w in mix]
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append((t, rng.choices(lengths, weights)[0], slo_ms))


async def one_request(session, args, index, send_s, tokens, slo_ms, rng_seed):
    import aiohttp

    rng = random.Random(rng_seed)
    body = {"model": args.model, "prompt": [rng.randrange(args.vocab) for _ in range(tokens)], "max_tokens": 1,
            "ttft_slo_ms": slo_ms}
    if args.best_effort:
        body["best_effort"] = True
    rec = {"index": index, "send_s": send_s, "tokens": tokens, "slo_ms": slo_ms, "status": 0, "ttft_ms": "",
           "predicted_ttft_ms": "", "server_ttft_ms": "", "queue_ms": "", "retry_after": "", "error": ""}
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    t0 = time.perf_counter()
    try:
        async with session.post(args.url.rstrip("/") + "/v1/completions", json=body, headers=headers) as resp:
            text = await resp.text()
            rec["ttft_ms"] = (time.perf_counter() - t0) * 1e3
            rec["status"] = resp.status
            if resp.status == 429:
                rec["retry_after"] = resp.headers.get("Retry-After", "")
            elif resp.status == 200:
                try:
                    ext = json.loads(text).get("slope") or {}
                except (ValueError, AttributeError):
                    ext = {}
                    rec["error"] = "200 with a body that is not a JSON object"
                for key, field in (("predicted_ttft_ms", "predicted_ttft_ms"), ("ttft_ms", "server_ttft_ms"),
                                   ("queue_ms", "queue_ms")):
                    if isinstance(ext.get(key), (int, float)):
                        rec[field] = float(ext[key])
            else:
                rec["error"] = f"HTTP {resp.status}: {text[:200]}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:200] or type(e).__name__
    return rec


async def run_load(args, arrivals):
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=args.timeout)
    # No connection limit: arrivals are open-loop, a slow server must not slow the sender.
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        for i, (t, tokens, slo_ms) in enumerate(arrivals):
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_request(session, args, i, t, tokens, slo_ms, args.seed * 1000003 + i)))
        recs = await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return recs, wall


def summarize(label, rate, duration, recs, wall):
    # Every request is exactly one of: ok (200 with a JSON body), rejected (429), error.
    ok = [r for r in recs if r["status"] == 200 and not r["error"]]
    rejected = [r for r in recs if r["status"] == 429]
    errors = [r for r in recs if not (r["status"] == 200 and not r["error"]) and r["status"] != 429]
    ttft = [r["ttft_ms"] for r in ok]
    met = [r for r in ok if r["ttft_ms"] <= r["slo_ms"]]
    pred = [(r["ttft_ms"], r["predicted_ttft_ms"]) for r in ok if r["predicted_ttft_ms"] != "" and r["predicted_ttft_ms"] > 0]
    queue = [r["queue_ms"] for r in ok if r["queue_ms"] != ""]
    server = [r["server_ttft_ms"] for r in ok if r["server_ttft_ms"] != ""]
    nan = math.nan
    return {
        "label": label,
        "offered_rps": rate,
        "duration_s": duration,
        "sent": len(recs),
        "ok": len(ok),
        "rejected": len(rejected),
        "errors": len(errors),
        "retry_after_missing": sum(1 for r in rejected if not r["retry_after"]),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p90_ms": percentile(ttft, 90),
        "ttft_p99_ms": percentile(ttft, 99),
        "slo_met": len(met),
        # Of everything sent (a reject misses), and of the admitted requests alone.
        "slo_attainment": len(met) / len(recs) if recs else nan,
        "admitted_attainment": len(met) / len(ok) if ok else nan,
        # Requests per second of the arrival window that met their SLO, and that were served.
        "goodput_rps": len(met) / duration,
        "throughput_rps": len(ok) / duration,
        # Mean of measured / predicted, and the mean absolute error of the prediction.
        "predicted_vs_measured": sum(m / p for m, p in pred) / len(pred) if pred else nan,
        "prediction_mae_ms": sum(abs(m - p) for m, p in pred) / len(pred) if pred else nan,
        "server_ttft_p50_ms": percentile(server, 50),
        "queue_p50_ms": percentile(queue, 50),
        "queue_p90_ms": percentile(queue, 90),
        "wall_s": wall,
    }


def fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def print_summary(s):
    print(f"[{s['label']}] offered {s['offered_rps']:g} req/s for {s['duration_s']:g} s: sent {s['sent']}, "
          f"ok {s['ok']}, rejected {s['rejected']} (429), errors {s['errors']}")
    print(f"  TTFT p50 {s['ttft_p50_ms']:.1f} ms, p90 {s['ttft_p90_ms']:.1f} ms, p99 {s['ttft_p99_ms']:.1f} ms; "
          f"SLO met {s['slo_met']} ({100 * s['slo_attainment']:.1f}% of sent, "
          f"{100 * s['admitted_attainment']:.1f}% of admitted); goodput {s['goodput_rps']:.3f} req/s")
    print(f"  measured/predicted TTFT {s['predicted_vs_measured']:.3f} (mean abs error "
          f"{s['prediction_mae_ms']:.1f} ms); server queue p50 {s['queue_p50_ms']:.1f} ms")
    if s["retry_after_missing"]:
        print(f"  warning: {s['retry_after_missing']} 429 answers had no Retry-After header")


def write_rows(path, fields, rows):
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: fmt(v) for k, v in r.items()})


# ---- the plot --------------------------------------------------------------------------------

def gp_quote(s):
    return "'" + str(s).replace("'", "''") + "'"


def plot(args):
    if not shutil.which("gnuplot"):
        die("--plot needs gnuplot (Debian: apt-get install gnuplot-nox)")
    series = []  # (title, [(x, p50, p90)])
    for path in args.csvs:
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            die(f"{path}: {e.strerror}")
        if rows and "throughput_rps" not in rows[0]:
            die(f"{path}: not a bench_serve.py summary CSV (no throughput_rps column)")
        by_label = {}
        for r in rows:
            by_label.setdefault(r["label"] or os.path.basename(path), []).append(r)
        for label, rs in by_label.items():
            pts = sorted((float(r["throughput_rps"]), float(r["ttft_p50_ms"]), float(r["ttft_p90_ms"]))
                         for r in rs if r["ttft_p90_ms"] not in ("", "nan"))
            series.append((label, pts, "measured"))
    if args.planner_curves:
        try:
            with open(args.planner_curves, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            die(f"{args.planner_curves}: {e.strerror}")
        if rows and "offered_rps" not in rows[0]:
            die(f"{args.planner_curves}: not a `slope plan --curve-out` CSV (no offered_rps column)")
        by = {}
        for r in rows:
            if args.planner_context and int(r["context_tokens"]) != args.planner_context:
                continue
            by.setdefault(f"planner {r['deployment']} @{r['context_tokens']} tok", []).append(
                (float(r["offered_rps"]), 1e3 * float(r["ttft_p50_s"]), 1e3 * float(r["ttft_p90_s"])))
        for title, pts in by.items():
            series.append((title, sorted(pts), "predicted"))
    if not series:
        die("--plot: no series (give bench_serve.py CSVs and/or --planner-curves)")
    data = args.plot + ".dat"
    plots = []
    with open(data, "w") as f:
        for k, (title, pts, kind) in enumerate(series):
            f.write(f"# {title}\n")
            for x, p50, p90 in pts:
                f.write(f"{x} {p50} {p90}\n")
            f.write("\n\n")
            lc = k + 1
            style = "linespoints pt 7" if kind == "measured" else "lines"
            plots.append(f"{gp_quote(data)} index {k} using 1:3 with {style} lw 2 lc {lc} title {gp_quote(title + ' p90')}")
            plots.append(f"{gp_quote(data)} index {k} using 1:2 with lines lw 1 dt 2 lc {lc} notitle")
    if args.slo_ms:
        plots.append(f"{args.slo_ms} with lines lc rgb 'black' dt 3 title 'SLO'")
    script = "\n".join([
        "set terminal pngcairo size 1000,650 noenhanced",
        f"set output {gp_quote(args.plot)}",
        "set key top left",
        f"set title {gp_quote(args.title or 'TTFT against throughput (solid p90, dashed p50)')}",
        "set xlabel 'throughput (requests/s served; planner: offered)'",
        "set ylabel 'TTFT (ms)'",
        "set yrange [0:*]",
        "set grid",
        "plot " + ", ".join(plots),
    ])
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if r.returncode != 0:
        die(f"gnuplot failed: {r.stderr.strip()}")
    os.remove(data)
    print(args.plot)


# ---- main ------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default %(default)s)")
    ap.add_argument("--api-key", default=os.environ.get("SLOPE_API_KEY", ""), help="sent as a bearer token")
    ap.add_argument("--model", default="slope", help="the request's model field (default %(default)s)")
    load = ap.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s")
    load.add_argument("--sweep", help="comma-separated rates, each run for --duration")
    load.add_argument("--trace", help="replay a CSV of t_s,tokens[,slo_ms] arrivals")
    ap.add_argument("--duration", type=float, default=30, help="seconds of arrivals per rate (default %(default)s)")
    ap.add_argument("--mix", default="mixed-256-8k",
                    help=f"length mix: {', '.join(MIXES)}, or a file of `tokens weight` lines (default %(default)s)")
    ap.add_argument("--slo-ms", type=float, default=2000, help="ttft_slo_ms of every request (default %(default)s)")
    ap.add_argument("--best-effort", action="store_true", help="send best_effort: true")
    ap.add_argument("--vocab", type=int, default=100, help="token ids are drawn from [0, VOCAB) (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="arrivals and prompts (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before a request counts as an error")
    ap.add_argument("--label", default="", help="the series' name in the CSV and the plot")
    ap.add_argument("--csv", help="append one summary row per rate to this CSV")
    ap.add_argument("--requests-csv", help="append one row per request to this CSV")
    ap.add_argument("--plot", metavar="PNG", help="draw the figure from the CSVs given after the options and exit")
    ap.add_argument("--planner-curves", help="with --plot: a `slope plan --curve-out` CSV to draw as predicted curves")
    ap.add_argument("--planner-context", type=int, default=0, help="with --planner-curves: only this context length")
    ap.add_argument("--title", default="", help="with --plot: the figure's title")
    ap.add_argument("csvs", nargs="*", help="with --plot: bench_serve.py summary CSVs, one series per label")
    args = ap.parse_args()

    if args.plot:
        plot(args)
        return
    if args.csvs:
        die(f"unexpected arguments {' '.join(args.csvs)} (CSV files are for --plot)")
    if args.vocab < 1:
        die("--vocab must be at least 1")
    if not args.slo_ms > 0:
        die("--slo-ms must be positive")
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        die("needs aiohttp: scripts/serve-venv.sh makes a venv with it (or pip install -r scripts/bench_serve_requirements.txt)")

    if args.trace:
        arrivals = read_trace(args.trace, args.slo_ms)
        span = max(t for t, _, _ in arrivals) if arrivals else 0
        duration = span if span > 0 else 1.0
        runs = [(len(arrivals) / duration, duration, arrivals)]
    else:
        if args.sweep:
            try:
                rates = [float(r) for r in args.sweep.split(",") if r.strip()]
            except ValueError:
                die(f"--sweep {args.sweep!r}: expected comma-separated rates, e.g. 0.5,1,2")
        elif args.rate is not None:
            rates = [args.rate]
        else:
            die("give --rate R, --sweep R1,R2,... or --trace FILE (or --plot PNG CSV...)")
        if not rates or any(not r > 0 for r in rates):
            die("rates must be positive")
        if not args.duration > 0:
            die("--duration must be positive")
        mix = read_mix(args.mix)
        runs = [(r, args.duration, poisson_arrivals(r, args.duration, mix, args.slo_ms, args.seed)) for r in rates]

    label = args.label or args.url
    for rate, duration, arrivals in runs:
        recs, wall = asyncio.run(run_load(args, arrivals))
        s = summarize(label, rate, duration, recs, wall)
        print_summary(s)
        if args.csv:
            write_rows(args.csv, SUMMARY_FIELDS, [s])
        if args.requests_csv:
            write_rows(args.requests_csv, REQUEST_FIELDS, [dict(r, label=label, offered_rps=rate) for r in recs])


if __name__ == "__main__":
    main()
