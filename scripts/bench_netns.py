#!/usr/bin/env python3
"""TTFT against link bandwidth across 2 network namespaces, against the planner's prediction.

For each link rate (tc tbf on both ends of each node's veth, scripts/netns-cluster.sh shape),
mesh (1 rank per node, 1 thread per rank) and prompt length: run `slope run` REPS times over
MPI/TCP between the namespaces, and `slope plan --predict` with a copy of the 1-core profile
whose network fields are the link's. Prints one JSON object per point (measured TTFT per rep,
per-rank comm/wait times, predicted TTFT and exposed-communication terms).

Usage (root): scripts/bench_netns.py --slope build/release/slope --model DIR
              [--rates 1gbit,10gbit,25gbit] [--meshes ring2,ulysses2,pp2] [--lengths 4096]
              [--reps 2] [--profile profiles/cpu-zen4-1c.json] [--latency-us 50]
              [--delay 1ms] [--loss 0.1%] [--mtu 9000]
--delay and --loss are added on every link with the rate (netem, or the user-space link of
scripts/netns-link.py where the kernel has no netem: then a link carries about 1 Gbit/s at
most, at MTU 9000); the profile's latency is then the delay's share of a message's one-way
trip (2 x delay: both ends' links) plus --latency-us.
Makes the cluster (prefix slope-b) and takes it down at the end.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "netns-cluster.sh")
MESHES = {"ring2": (["--ring", "2"], "1,2,1,1"), "ulysses2": (["--ulysses", "2"], "2,1,1,1"),
          "pp2": (["--pp", "2"], "1,1,2,1")}


def gbit(rate):
    units = {"gbit": 1.0, "mbit": 1e-3}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    raise SystemExit(f"rate {rate}: use Ngbit or Nmbit")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slope", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rates", default="1gbit,10gbit,25gbit")
    ap.add_argument("--meshes", default="ring2,ulysses2,pp2")
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profile", default=os.path.join(ROOT, "profiles", "cpu-zen4-1c.json"))
    ap.add_argument("--latency-us", type=float, default=50.0)
    ap.add_argument("--delay", default="", help="added each way on every link, e.g. 1ms")
    ap.add_argument("--loss", default="", help="frames dropped on every link, e.g. 0.1%%")
    ap.add_argument("--mtu", type=int, default=0, help="every link's MTU (default: the script's 1500)")
    a = ap.parse_args()
    delay_us = 0.0
    if a.delay:
        unit = {"us": 1.0, "ms": 1e3, "s": 1e6}
        u = next((u for u in ("us", "ms", "s") if a.delay.endswith(u)), None)
        if u is None:
            raise SystemExit(f"--delay {a.delay}: use Nus, Nms or Ns")
        delay_us = float(a.delay[: -len(u)]) * unit[u]
    latency_us = a.latency_us + 2 * delay_us
    env = dict(os.environ, SLOPE_NETNS_PREFIX="slope-b", SLOPE_NETNS_BRIDGE="slope-bbr0",
               SLOPE_NETNS_SUBNET="10.79.0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    if a.mtu:
        env["SLOPE_NETNS_MTU"] = str(a.mtu)
    up = subprocess.run(["bash", CLUSTER, "up", "2"], env=env)
    if up.returncode != 0:
        return up.returncode
    base = json.load(open(a.profile))
    tmp = tempfile.mkdtemp(prefix="slope-bench-netns-")
    try:
        for rate in a.rates.split(","):
            extra = (["--delay", a.delay] if a.delay else []) + (["--loss", a.loss] if a.loss else [])
            subprocess.run(["bash", CLUSTER, "shape", "all", "--rate", rate, *extra], env=env, check=True)
            prof = copy.deepcopy(base)
            gbs = gbit(rate) / 8  # GB/s
            prof["network"].update(bandwidth_gbs_per_node=gbs, bandwidth_gbs_per_device=gbs,
                                   latency_us=latency_us,
                                   description=f"veth between network namespaces, tc tbf {rate}"
                                               f"{' + ' + a.delay if a.delay else ''}{' + ' + a.loss + ' loss' if a.loss else ''}")
            prof["node"]["devices_per_node"] = 1
            # The planner keeps Ulysses inside a node, so for ulysses=2 the two namespaces are
            # described as one node of 2 devices whose all-to-all link is the veth's.
            prof_u = copy.deepcopy(prof)
            prof_u["node"]["devices_per_node"] = 2
            prof_u["node"]["alltoall"] = {"bandwidth_gbs": gbs, "latency_us": latency_us}
            ppath = os.path.join(tmp, f"profile-{rate}.json")
            json.dump(prof, open(ppath, "w"))
            json.dump(prof_u, open(ppath + ".u", "w"))
            for mesh in a.meshes.split(","):
                flags, spec = MESHES[mesh]
                hw = ppath + ".u" if mesh.startswith("ulysses") else ppath
                for n in a.lengths.split(","):
                    pp = subprocess.run(
                        [a.slope, "plan", "--predict", "--model", a.model, "--hardware", hw,
                         "--mesh", spec, "--context", n, "--json"], capture_output=True, text=True)
                    if pp.returncode != 0:
                        raise SystemExit(f"slope plan --predict {mesh} {n}: {pp.stderr.strip()}")
                    pred = json.loads(pp.stdout.splitlines()[0])
                    reps = []
                    for _ in range(a.reps):
                        p = subprocess.run(
                            ["bash", CLUSTER, "mpirun", "1", "--", a.slope, "run", "--model",
                             a.model, "--random-tokens", n, "--threads", "1", "--json", "--quiet",
                             *flags], env=env, capture_output=True, text=True)
                        if p.returncode != 0:
                            print(p.stderr[-3000:], file=sys.stderr)
                            raise SystemExit(f"{mesh} {n} at {rate}: exit {p.returncode}")
                        r = json.loads(p.stdout.strip().splitlines()[-1])
                        reps.append({"ttft_ms": r["ttft_ms"],
                                     "comm_ms": [x["communication_ms"] for x in r["per_rank"]],
                                     "wait_ms": [x["communication_wait_ms"] for x in r["per_rank"]],
                                     "pipe_ms": [x["pipeline_wait_ms"] for x in r["per_rank"]],
                                     "sent_mb": [x["bytes_sent"] / 1e6 for x in r["per_rank"]]})
                    best = min(x["ttft_ms"] for x in reps)
                    out = {"rate": rate, "delay": a.delay, "loss": a.loss, "mesh": mesh, "tokens": int(n), "reps": reps,
                           "measured_ms_min": best, "predicted_ms": pred["ttft_s"] * 1e3,
                           "ratio": best / (pred["ttft_s"] * 1e3), "predicted_phases_s":
                           {k: v for k, v in pred["phases_s"].items() if v}}
                    print(json.dumps(out), flush=True)
    finally:
        subprocess.run(["bash", CLUSTER, "down"], env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
