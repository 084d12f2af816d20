#!/usr/bin/env python3
"""scripts/bench_serve.py against tests/serve/fake_server.py for a few seconds: the summary CSV's
counts add up (sent = ok + rejected + errors), agree with the per-request CSV and with what the
server itself counted, the percentiles are ordered and the median is the per-request median,
and --plot draws a PNG. Run with the venv's python (scripts/serve-venv.sh)."""

import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "scripts", "bench_serve.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def main():
    tmp = tempfile.mkdtemp(prefix="slope-bench-serve-")
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_server.py"), "--base-ms", "5",
                               "--per-token-ms", "0.01", "--max-concurrency", "3", "--fail-every", "7"],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().split()
        if len(line) != 2 or line[0] != "port":
            print(f"FAIL: the fake server did not start (said {line!r})")
            return 1
        url = f"http://127.0.0.1:{line[1]}"
        summary, requests = os.path.join(tmp, "fake.csv"), os.path.join(tmp, "requests.csv")
        rates = [10.0, 80.0]
        r = subprocess.run([sys.executable, BENCH, "--url", url, "--sweep", ",".join(map(str, rates)), "--duration", "2",
                            "--mix", "mixed-256-8k", "--slo-ms", "60", "--vocab", "50", "--seed", "3", "--label",
                            "fake", "--csv", summary, "--requests-csv", requests, "--timeout", "30"],
                           capture_output=True, text=True, timeout=120)
        print(r.stdout, end="")
        check(r.returncode == 0, f"bench_serve.py exited {r.returncode}: {r.stderr}")
        if r.returncode != 0:
            return 1
        with open(summary, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(requests, newline="") as f:
            reqs = list(csv.DictReader(f))
        with urllib.request.urlopen(url + "/stats") as resp:
            import json
            stats = json.load(resp)

        check(len(rows) == len(rates), f"{len(rows)} summary rows for {len(rates)} rates")
        tot = {"sent": 0, "ok": 0, "rejected": 0, "errors": 0}
        for row in rows:
            n = {k: int(row[k]) for k in tot}
            for k in tot:
                tot[k] += n[k]
            rate = float(row["offered_rps"])
            check(n["sent"] > 0, f"rate {rate}: nothing sent")
            check(n["sent"] == n["ok"] + n["rejected"] + n["errors"],
                  f"rate {rate}: sent {n['sent']} != ok {n['ok']} + rejected {n['rejected']} + errors {n['errors']}")
            mine = [q for q in reqs if float(q["offered_rps"]) == rate]
            check(len(mine) == n["sent"], f"rate {rate}: {len(mine)} request rows, {n['sent']} sent")
            ok = [float(q["ttft_ms"]) for q in mine if q["status"] == "200" and not q["error"]]
            check(len(ok) == n["ok"], f"rate {rate}: {len(ok)} ok request rows, summary says {n['ok']}")
            check(sum(q["status"] == "429" for q in mine) == n["rejected"], f"rate {rate}: 429 rows != rejected")
            if ok:
                p50, p90, p99 = (float(row[k]) for k in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"))
                check(min(ok) <= p50 <= p90 <= p99 <= max(ok), f"rate {rate}: percentiles out of order: "
                      f"min {min(ok)} p50 {p50} p90 {p90} p99 {p99} max {max(ok)}")
                check(math.isclose(p50, statistics.median(ok), rel_tol=1e-4),
                      f"rate {rate}: p50 {p50} is not the median of the requests, {statistics.median(ok)}")
                if len(ok) >= 2:  # linear interpolation between ranks: statistics' "inclusive" method
                    q = statistics.quantiles(ok, n=100, method="inclusive")
                    check(math.isclose(p90, q[89], rel_tol=1e-4) and math.isclose(p99, q[98], rel_tol=1e-4),
                          f"rate {rate}: p90 {p90} / p99 {p99} are not the requests' {q[89]} / {q[98]}")
                met = sum(1 for q in mine if q["status"] == "200" and not q["error"]
                          and float(q["ttft_ms"]) <= float(q["slo_ms"]))
                check(int(row["slo_met"]) == met, f"rate {rate}: slo_met {row['slo_met']}, requests say {met}")
                check(math.isclose(float(row["goodput_rps"]), met / float(row["duration_s"]), rel_tol=1e-4),
                      f"rate {rate}: goodput is not met / duration")
                check(math.isclose(float(row["slo_attainment"]), met / n["sent"], rel_tol=1e-4),
                      f"rate {rate}: attainment is not met / sent")
                ratio = float(row["predicted_vs_measured"])
                # The fake predicts its own sleep, which the client's time includes (plus HTTP
                # overhead, large on a busy machine): at least ~1, and a number.
                check(0.9 <= ratio < math.inf, f"rate {rate}: measured/predicted {ratio} (the fake predicts its sleep)")
        check(rows[-1] and int(rows[-1]["rejected"]) > 0, "no 429 at 80 req/s against 3 slots")
        check(int(rows[-1]["retry_after_missing"]) == 0, "a 429 without Retry-After was counted")
        check(tot["errors"] > 0, "no errors counted though every 7th request fails")
        # What the server answered, counted on its side.
        check(stats["seen"] == tot["sent"], f"server saw {stats['seen']} requests, the tool sent {tot['sent']}")
        check(stats["ok"] == tot["ok"] and stats["rejected"] == tot["rejected"] and stats["errors"] == tot["errors"],
              f"server counted {stats}, the tool {tot}")

        # The plot, with a planner curve beside the measured series.
        if shutil.which("gnuplot"):
            curves = os.path.join(tmp, "plan.csv")
            with open(curves, "w") as f:
                f.write("context_tokens,deployment,kind,offered_rps,utilization,ttft_p50_s,ttft_p90_s\n")
                for k in range(1, 10):
                    f.write(f"8192,1x 1 rank,listed,{k},{k / 10},{0.05 + 0.01 * k},{0.06 + 0.02 * k}\n")
            png = os.path.join(tmp, "fig.png")
            r = subprocess.run([sys.executable, BENCH, "--plot", png, summary, "--planner-curves", curves, "--slo-ms",
                                "60"], capture_output=True, text=True, timeout=60)
            check(r.returncode == 0, f"--plot exited {r.returncode}: {r.stderr}")
            with open(png, "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", "--plot did not write a PNG")
        else:
            print("note: gnuplot not installed, --plot not tested")

        # Bad input is a clear error, not a traceback.
        r = subprocess.run([sys.executable, BENCH, "--url", url, "--rate", "1", "--mix", os.path.join(tmp, "nope")],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and "neither a named mix" in r.stderr, f"bad --mix: rc {r.returncode}, {r.stderr!r}")
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("bench_serve.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
