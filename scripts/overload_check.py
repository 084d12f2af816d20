#!/usr/bin/env python3
"""The checks of an overload run (scripts/bench_overload.sh), printed, in OUT/checks.json, and in
the exit code (1 if any fails), and the figure OUT/overload.png.

  overload_check.py OUT --slo-ms 5000 [--rate R --duration S] [--rss-factor 1.25]

Reads what bench_overload.sh leaves in OUT: requests.csv (bench_serve.py, one row per request
sent), rss.csv (t_s, front_mib, instances_mib, total_mib, one row a second), health.status and
health.json (GET /health after the load), metrics.txt (GET /metrics), server.exit (the front's
exit status after SIGTERM). The checks:

  ttft_p99      the admitted (200) requests' p99 TTFT, measured at the client, <= the SLO. With
                --relax-when-busy (the CI test), on a machine whose passes scattered around the
                scheduler's own predictions by more than --busy-error (default 0.1) on average
                (slope_instance_prediction_error; 0.06 in the quiet 10-minute run, 0.07-0.11 in
                the quiet comparison, 0.12 beside one build, 0.5 beside several; a 90 s run
                beside one build had its p99 at 5.27 s for a 5 s target) the check is the p95
                instead, and says so
  answered      every request sent was answered 200 or 429 (no error, no missing answer), and
                the server counted as many completions requests as were sent
  health        /health answered 200 with status "ok" and every instance ready
  drained       the front exited 0 on SIGTERM
  rss_bounded   the maximum of the last quarter of the run <= rss_factor x that of the second
                quarter (the first holds the warm-up: the weights' pages touched, the layer
                buffers growing to the longest prompt; docs/serving.md, "Memory under load")

The figure: RSS (front, instances, total) and each request's TTFT over time, the 429s marked.
It uses matplotlib when the venv has it, else gnuplot, else says that there is no figure.
"""

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys


def percentile(values, q):
    """Linear interpolation between closest ranks, as bench_serve.py reports it."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def served_completions(metrics_text):
    """The sum of slope_requests_total{endpoint="completions",...} over its codes."""
    total = 0.0
    for line in metrics_text.splitlines():
        m = re.match(r'slope_requests_total\{([^}]*)\}\s+(\S+)', line)
        if m and 'endpoint="completions"' in m.group(1):
            total += float(m.group(2))
    return int(total)


def prediction_error(metrics_text):
    """The mean over instances of slope_instance_prediction_error (|predicted - measured| / measured)."""
    vals = [float(m.group(1)) for m in re.finditer(r'^slope_instance_prediction_error\{[^}]*\}\s+(\S+)', metrics_text, re.M)]
    return sum(vals) / len(vals) if vals else math.nan


def rss_quarters(rows, load_s):
    """Max of total_mib in each quarter of [0, load_s]."""
    out = []
    for k in range(4):
        lo, hi = k * load_s / 4, (k + 1) * load_s / 4
        vals = [num(r["total_mib"]) for r in rows if lo <= num(r["t_s"]) < hi or (k == 3 and num(r["t_s"]) >= hi)]
        out.append(max(vals) if vals else math.nan)
    return out


def plot(out_dir, reqs, rss, slo_ms, title):
    png = os.path.join(out_dir, "overload.png")
    ok = [(num(r["send_s"]), num(r["ttft_ms"]) / 1e3) for r in reqs if r["status"] == "200"]
    rej = [num(r["send_s"]) for r in reqs if r["status"] == "429"]
    t = [num(r["t_s"]) for r in rss]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        fig, (a, b) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
        for key, label in (("total_mib", "total"), ("instances_mib", "instances (mpirun + ranks)"), ("front_mib", "front")):
            a.plot(t, [num(r[key]) for r in rss], label=label)
        a.set_ylabel("RSS (MiB)")
        a.set_ylim(bottom=0)
        a.legend(loc="lower right")
        a.grid(True)
        a.set_title(title)
        b.scatter([x for x, _ in ok], [y for _, y in ok], s=4, label="admitted: TTFT")
        b.scatter(rej, [0] * len(rej), s=4, marker="|", color="red", label="429")
        b.axhline(slo_ms / 1e3, color="black", linestyle=":", label="SLO")
        b.set_ylim(0, 1.1 * max([slo_ms / 1e3] + [y for _, y in ok]))
        b.set_xlabel("seconds since the start of the load")
        b.set_ylabel("TTFT (s)")
        b.legend(loc="upper right")
        b.grid(True)
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        return png, "matplotlib"
    if shutil.which("gnuplot"):
        dat = png + ".dat"
        with open(dat, "w") as f:
            for r in rss:
                f.write(f"{r['t_s']} {r['total_mib']} {r['instances_mib']} {r['front_mib']}\n")
            f.write("\n\n")
            for x, y in ok:
                f.write(f"{x} {y}\n")
            f.write("\n\n")
            for x in rej:
                f.write(f"{x} 0\n")
            f.write("\n\n")
        q = lambda s: "'" + s.replace("'", "''") + "'"
        script = "\n".join([
            "set terminal pngcairo size 1000,700 noenhanced",
            f"set output {q(png)}",
            "set multiplot layout 2,1",
            f"set title {q(title)}",
            "set ylabel 'RSS (MiB)'", "set yrange [0:*]", "set grid", "set key bottom right",
            f"plot {q(dat)} index 0 using 1:2 with lines lw 2 title 'total', "
            f"{q(dat)} index 0 using 1:3 with lines title 'instances (mpirun + ranks)', "
            f"{q(dat)} index 0 using 1:4 with lines title 'front'",
            "unset title", "set xlabel 'seconds since the start of the load'", "set ylabel 'TTFT (s)'",
            "set key top right", "set offsets 0, 0, graph 0.1, 0",
            f"plot {q(dat)} index 1 using 1:2 with points pt 7 ps 0.3 title 'admitted: TTFT', "
            + (f"{q(dat)} index 2 using 1:2 with points pt 2 ps 0.5 lc rgb 'red' title '429', " if rej else "")
            + f"{slo_ms / 1e3} with lines lc rgb 'black' dt 3 title 'SLO'",
            "unset multiplot",
        ])
        r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        os.remove(dat)
        if r.returncode != 0:
            return None, f"gnuplot failed: {r.stderr.strip()[:200]}"
        return png, "gnuplot (matplotlib is not in the venv)"
    return None, "no figure: neither matplotlib (in the venv) nor gnuplot is installed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the directory bench_overload.sh wrote")
    ap.add_argument("--slo-ms", type=float, required=True)
    ap.add_argument("--rate", type=float, default=0, help="the offered rate (for the report)")
    ap.add_argument("--duration", type=float, default=0, help="seconds of arrivals (default: from the requests)")
    ap.add_argument("--rss-factor", type=float, default=1.25)
    ap.add_argument("--relax-when-busy", action="store_true",
                    help="check the p95 instead of the p99 when the machine was busy (see above)")
    ap.add_argument("--busy-error", type=float, default=0.1)
    args = ap.parse_args()
    d = args.out

    reqs = read_csv(os.path.join(d, "requests.csv"))
    rss = read_csv(os.path.join(d, "rss.csv"))
    sent = len(reqs)
    ok = [r for r in reqs if r["status"] == "200" and not r["error"]]
    rejected = [r for r in reqs if r["status"] == "429"]
    errors = [r for r in reqs if not (r["status"] == "200" and not r["error"]) and r["status"] != "429"]
    unanswered = [r for r in reqs if r["status"] in ("", "0")]
    ttft = [num(r["ttft_ms"]) for r in ok]
    server_ttft = [num(r["server_ttft_ms"]) for r in ok if r["server_ttft_ms"]]
    met = sum(1 for r in ok if num(r["ttft_ms"]) <= num(r["slo_ms"]))
    duration = args.duration or max((num(r["send_s"]) for r in reqs), default=0)
    with open(os.path.join(d, "metrics.txt")) as f:
        metrics_text = f.read()
    counted = served_completions(metrics_text)
    error = prediction_error(metrics_text)
    busy = args.relax_when_busy and error > args.busy_error
    q = 95 if busy else 99
    with open(os.path.join(d, "health.status")) as f:
        health_code = f.read().strip()
    try:
        with open(os.path.join(d, "health.json")) as f:
            health = json.load(f)
    except (OSError, ValueError):
        health = {}
    with open(os.path.join(d, "server.exit")) as f:
        server_exit = f.read().strip()
    load_s = max((num(r["t_s"]) for r in rss), default=0)
    quarters = rss_quarters(rss, load_s)

    p99 = percentile(ttft, 99)
    checked = percentile(ttft, q)
    relaxed = (f"; the machine was busy (prediction error {error:.2f} > {args.busy_error}): checked at p95 "
               f"{checked:.0f} ms" if busy else f"; prediction error {error:.2f}")
    checks = {
        "ttft_p99": {"ok": bool(ttft) and checked <= args.slo_ms,
                     "detail": f"admitted p99 TTFT {p99:.0f} ms (client; server {percentile(server_ttft, 99):.0f} ms) "
                               f"against the SLO {args.slo_ms:.0f} ms; p50 {percentile(ttft, 50):.0f}, "
                               f"p90 {percentile(ttft, 90):.0f} ms; {met} of {len(ok)} admitted met it" + relaxed},
        "answered": {"ok": sent > 0 and not errors and not unanswered and len(ok) + len(rejected) == sent
                     and counted == sent,
                     "detail": f"sent {sent}, answered 200: {len(ok)}, 429: {len(rejected)}, errors {len(errors)} "
                               f"(no answer: {len(unanswered)}); the server counted {counted}"},
        "health": {"ok": health_code == "200" and health.get("status") == "ok"
                   and all(i.get("state") == "ready" for i in health.get("instances", [])),
                   "detail": f"/health {health_code} status {health.get('status')!r}, instances "
                             + ", ".join(f"{i.get('state')} (restarts {i.get('restarts')})" for i in health.get("instances", []))},
        "drained": {"ok": server_exit == "0", "detail": f"the front exited {server_exit} on SIGTERM"},
        "rss_bounded": {"ok": all(not math.isnan(q) for q in quarters) and quarters[3] <= args.rss_factor * quarters[1],
                        "detail": "max RSS per quarter " + " / ".join(f"{q:.0f}" for q in quarters)
                                  + f" MiB; the last within {args.rss_factor}x of the second: "
                                  + (f"{quarters[3] / quarters[1]:.3f}x" if quarters[1] > 0 else "n/a")},
    }
    title = (f"slope serve under overload: {args.rate:g} req/s of mixed-256-8k for {duration:.0f} s, "
             f"SLO {args.slo_ms:g} ms")
    png, how = plot(d, reqs, rss, args.slo_ms, title)
    summary = {"sent": sent, "ok": len(ok), "rejected": len(rejected), "errors": len(errors), "met": met,
               "goodput_rps": met / duration if duration else math.nan, "ttft_p99_ms": p99,
               "ttft_checked_quantile": q, "prediction_error": error,
               "rss_quarter_max_mib": quarters, "figure": png, "figure_how": how, "checks": checks}
    with open(os.path.join(d, "checks.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for name, c in checks.items():
        print(f"{'PASS' if c['ok'] else 'FAIL'} {name}: {c['detail']}")
    print(f"goodput {summary['goodput_rps']:.3f} req/s; figure: {png or '-'} ({how})")
    sys.exit(0 if all(c["ok"] for c in checks.values()) else 1)


if __name__ == "__main__":
    main()
