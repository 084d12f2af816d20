#!/usr/bin/env python3
"""The short overload run of issue 17 (part 4) in CI: scripts/bench_overload.sh at 2x the
planner's capacity for SLOPE_OVERLOAD_S seconds (default 90) of the mixed-256-8k mix, with the
checks of the 10-minute run (scripts/overload_check.py): the admitted p99 TTFT within the SLO,
every request answered 200 or 429 and counted by the server, /health ok at the end, a clean
drain, RSS bounded. First, the checker itself is run on made-up runs that break each check
once, so that a checker that passes everything fails here.

  test_overload.py SLOPE_BINARY        (with the serve venv's python: scripts/serve-venv.sh)

The scheduler learns the machine's speed from its own passes (the admission bound,
docs/serving-scheduler.md), and on a quiet machine the check is the 10-minute run's: the
admitted p99 within the SLO. One thing is relaxed for CI: when the machine was busy (other jobs
on its cores made the passes scatter around the scheduler's own predictions by more than 25% on
average, slope_instance_prediction_error; 0.07-0.11 when quiet), the TTFT check is the p95.
Passes there slow down by 5-10x within seconds, and a p99 guarantee would need a bound no
window of past passes gives. The p95 still fails the old admission, whose admitted requests met
the target only 90.7% of the time on a quiet machine.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CHECK = os.path.join(ROOT, "scripts", "overload_check.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def fake_run(d, *, p99_over=False, missing=False, growing=False, degraded=False, miscounted=False, pred_error=0.1):
    """A made-up OUT directory: 200 requests, a third 429, TTFT 1-4 s; each flag breaks one check."""
    os.makedirs(d, exist_ok=True)
    fields = ["label", "offered_rps", "index", "send_s", "tokens", "slo_ms", "status", "ttft_ms",
              "predicted_ttft_ms", "server_ttft_ms", "queue_ms", "retry_after", "error"]
    with open(os.path.join(d, "requests.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for i in range(200):
            status = "429" if i % 3 == 0 else "200"
            ttft = 1000 + 15 * i if status == "200" else 3
            if p99_over and i in (4, 5):
                ttft = 6000
            error = ""
            if missing and i == 7:
                status, ttft, error = "0", "", "ServerDisconnectedError"
            w.writerow({"label": "fake", "offered_rps": 2, "index": i, "send_s": i / 2, "tokens": 256,
                        "slo_ms": 5000, "status": status, "ttft_ms": ttft, "predicted_ttft_ms": "",
                        "server_ttft_ms": ttft, "queue_ms": "", "retry_after": "1" if status == "429" else "",
                        "error": error})
    with open(os.path.join(d, "rss.csv"), "w") as f:
        f.write("t_s,front_mib,instances_mib,total_mib\n")
        for t in range(100):
            inst = 500 + min(t, 10) * 30 + (8 * t if growing else t % 3)
            f.write(f"{t},10,{inst},{inst + 10}\n")
    with open(os.path.join(d, "metrics.txt"), "w") as f:
        f.write(f'slope_requests_total{{endpoint="completions",code="200"}} {133 + (1 if miscounted else 0)}\n'
                f'slope_requests_total{{endpoint="completions",code="429"}} 67\n'
                f'slope_requests_total{{endpoint="prefill",code="200"}} 5\n'
                f'slope_instance_prediction_error{{instance="0",mesh="a"}} {pred_error}\n'
                f'slope_instance_prediction_error{{instance="1",mesh="b"}} {pred_error}\n')
    with open(os.path.join(d, "health.status"), "w") as f:
        f.write("503\n" if degraded else "200\n")
    with open(os.path.join(d, "health.json"), "w") as f:
        json.dump({"status": "degraded" if degraded else "ok",
                   "instances": [{"state": "ready", "restarts": 0}, {"state": "restarting" if degraded else "ready",
                                                                      "restarts": 1 if degraded else 0}]}, f)
    with open(os.path.join(d, "server.exit"), "w") as f:
        f.write("0\n")


def said_rate(out):
    """The rate bench_overload.sh offered, from its load.txt ("... = R requests/s ...")."""
    with open(os.path.join(out, "load.txt")) as f:
        return f.read().split("= ")[1].split()[0]


def run_checker(d, *extra):
    r = subprocess.run([sys.executable, CHECK, d, "--slo-ms", "5000", *extra], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_checker(tmp):
    d = os.path.join(tmp, "good")
    fake_run(d)
    rc, out = run_checker(d)
    check(rc == 0, f"the checker fails a good run:\n{out}")
    with open(os.path.join(d, "checks.json")) as f:
        c = json.load(f)
    check(c["sent"] == 200 and c["rejected"] == 67 and c["ok"] == 133, f"checks.json counts: {c}")
    for flag, name in (("p99_over", "ttft_p99"), ("missing", "answered"), ("growing", "rss_bounded"),
                       ("degraded", "health"), ("miscounted", "answered")):
        d = os.path.join(tmp, flag)
        fake_run(d, **{flag: True})
        rc, out = run_checker(d)
        check(rc == 1 and f"FAIL {name}" in out, f"the checker passes a run with {flag} ({name}):\n{out}")
        others = [line for line in out.splitlines() if line.startswith("FAIL") and not line.startswith(f"FAIL {name}")]
        check(not others, f"{flag} failed other checks too: {others}")
    # The CI relaxation: p95 instead of p99 only when the machine was busy (prediction error
    # over 0.1), and only when asked for.
    d = os.path.join(tmp, "busy")
    fake_run(d, p99_over=True, pred_error=0.5)
    rc, out = run_checker(d)
    check(rc == 1 and "FAIL ttft_p99" in out, f"a busy run's p99 over the SLO passes without --relax-when-busy:\n{out}")
    rc, out = run_checker(d, "--relax-when-busy")
    check(rc == 0 and "checked at p95" in out, f"--relax-when-busy does not check a busy run at p95:\n{out}")
    d = os.path.join(tmp, "quiet")
    fake_run(d, p99_over=True, pred_error=0.05)
    rc, out = run_checker(d, "--relax-when-busy")
    check(rc == 1 and "FAIL ttft_p99" in out, f"--relax-when-busy relaxes a quiet run:\n{out}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    slope = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="slope-overload-")
    try:
        test_checker(tmp)
        if failures:
            return 1
        duration = os.environ.get("SLOPE_OVERLOAD_S", "90")
        out = os.path.join(tmp, "run")
        env = dict(os.environ, SLOPE=slope)
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench_overload.sh"), out, duration, "2", "5000"],
                           env=env, capture_output=True, text=True, timeout=float(duration) + 600)
        print(r.stdout[-6000:])
        if r.returncode not in (0, 1):
            print(r.stderr[-4000:])
            check(False, f"bench_overload.sh exited {r.returncode}")
            return 1
        # The verdict for CI: the same checks, the TTFT one at p95 if the machine was busy.
        rc, verdict = run_checker(out, "--relax-when-busy", "--rate", said_rate(out), "--duration", duration)
        print("CI verdict (--relax-when-busy):\n" + verdict)
        with open(os.path.join(out, "checks.json")) as f:
            c = json.load(f)
        for name, v in c["checks"].items():
            check(v["ok"], f"{name}: {v['detail']}")
        check(rc == (0 if all(v["ok"] for v in c["checks"].values()) else 1),
              "overload_check.py's exit code disagrees with its checks")
        # The rate is 2x the planner's capacity, computed here from the cost model's predictions.
        with open(os.path.join(out, "predict.jsonl")) as f:
            service = [json.loads(line)["service_s"] for line in f if line.strip()]
        want = 2 * 2 / (sum(service) / len(service))
        said = float(said_rate(out))
        check(len(service) == 6 and abs(said - want) < 1e-3 * want, f"offered {said} req/s, want {want:.4f}")
        check(c["rejected"] > 0, "nothing was refused at 2x the capacity: the run did not overload the server")
        if failures:
            keep = os.path.join(tempfile.gettempdir(), "slope-overload-failed")
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(out, keep)
            print(f"the run's files are kept in {keep}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_overload:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
