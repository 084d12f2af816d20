#!/usr/bin/env python3
"""A link cut under `slope serve`, with a steady load (issue 17, part 3: "the same by cutting a
link instead of killing a process").

usage: test_link_cut.py SLOPE_BINARY REPO_ROOT

scripts/netns-cluster.sh makes 2 "nodes" (network namespaces on a bridge). The server runs two
instances: ring=2 with one rank in each namespace (MPI over TCP on the veths only, started by
tests/serve/netns_launcher.sh), and ring=1 under plain mpirun in the root namespace. The front
itself stays in the root namespace: its connection to an instance's rank 0 is a unix socket in
the filesystem, which `ip netns exec` does not separate, so only the ranks' MPI traffic crosses
the veths. Two clients send completions one after another. Twice, while ring=2 computes, a
node's veth is set down (first node 1's, then node 0's, where rank 0 and its connection to the
front live):
  - the request in flight (or the next one dispatched there) gets a 5xx naming ring=2 within
    --timeout + 5 s of the cut, and nothing hangs;
  - ring=1 keeps serving, and none of its requests fails;
  - with the link back up, ring=2 is restarted (/health: ready, one more restart) and serves again.
At the end every request sent got exactly one answer (200 or a 5xx naming ring=2 during a cut),
and /metrics counts the same. Exit 77 (skipped) where namespaces cannot be made.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fault_util import Load, names_instance, wait_busy  # noqa: E402
from serve_util import Server  # noqa: E402

SLOPE, ROOT = sys.argv[1], sys.argv[2]
CLUSTER = os.path.join(ROOT, "scripts", "netns-cluster.sh")
TIMEOUT_S = 10
SLACK_S = 5
LENGTHS = [16, 64, 256, 1024, 2048, 4000]
# A prefix, bridge and subnet of this test's own (netns_meshes uses slope-t / 10.78.0).
ENV = dict(SLOPE_NETNS_PREFIX="slope-f", SLOPE_NETNS_BRIDGE="slope-fbr0", SLOPE_NETNS_SUBNET="10.79.0",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
VETH = "slopefv{}"  # the root side of node i's link (netns-cluster.sh: prefix without '-', then 'v')
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def link(node, state):
    subprocess.run(["ip", "link", "set", VETH.format(node), state], check=True)


def main():
    env = {**os.environ, **ENV}
    up = subprocess.run(["bash", CLUSTER, "up", "2"], env=env, capture_output=True, text=True)
    if up.returncode == 77:
        print("SKIP: " + up.stderr.strip())
        return 77
    try:
        if up.returncode != 0:
            raise SystemExit("netns-cluster.sh up 2 failed:\n" + up.stdout + up.stderr)
        os.environ.update(ENV)  # the server and its launcher find the test's namespaces
        with tempfile.TemporaryDirectory(prefix="slope-linkcut-") as tmp:
            run(tmp)
    finally:
        for node in (0, 1):
            subprocess.run(["ip", "link", "set", VETH.format(node), "up"], capture_output=True)
        subprocess.run(["bash", CLUSTER, "down"], env=env)
    print("PASS" if not failures else f"FAIL: {len(failures)} check(s)")
    return 1 if failures else 0


def run(tmp):
    model = os.path.join(tmp, "tiny")
    subprocess.run([SLOPE, "make-model", "--arch", "gpt-oss", "--preset", "tiny", "--seed", "5", "--out", model],
                   check=True, capture_output=True)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    launcher = f"bash {os.path.join(HERE, 'netns_launcher.sh')} {CLUSTER} {{np}}"
    srv = Server(SLOPE, model, ["ring=2", "ring=1"],
                 ["--scheduler", "fcfs", "--timeout", str(TIMEOUT_S), "--start-timeout", "120", "--launcher", launcher])
    load = None
    cuts = []
    try:
        _, _, h = srv.request("GET", "/health")
        ring2 = h["instances"][0]
        check(ring2["mesh"].startswith("pp=1,ring=2") and ring2["state"] == "ready",
              f"ring=2 across the namespaces is ready: {ring2}")
        ns_of = []
        for pid in ring2["pids"]:
            ns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()
            ns_of.append(ns)
        check(ns_of == ["slope-f0", "slope-f1"], f"ring=2's ranks run in the namespaces slope-f0 and slope-f1 ({ns_of})")
        mesh = ring2["mesh"]
        load = Load(srv.port, vocab, LENGTHS, clients=2, seed=11)
        time.sleep(3)
        for node in (1, 0):
            _, _, h = srv.request("GET", "/health")
            inst = h["instances"][0]
            restarts = inst["restarts"]
            label = f"node {node}'s link ({VETH.format(node)}) down"
            busy = wait_busy(inst["pids"], 60)
            cut = time.time()
            link(node, "down")
            # The affected request: a 5xx naming ring=2, within the timeout of the cut (or of its
            # dispatch, for a request sent to the instance after the cut).
            failed = None
            end = time.time() + 2 * TIMEOUT_S + 2 * SLACK_S
            while time.time() < end and failed is None:
                failed = next((r for r in load.snapshot() if r["answered"] >= cut and r["status"] != 200), None)
                time.sleep(0.1)
            time.sleep(2)
            link(node, "up")
            restored = time.time()
            check(failed is not None and isinstance(failed["status"], int) and 500 <= failed["status"] < 600 and
                  names_instance(failed.get("message"), mesh) and
                  failed["answered"] - max(cut, failed["sent"]) <= TIMEOUT_S + SLACK_S,
                  f"{label} (ranks computing: {busy}): a request gets a 5xx naming ring=2 "
                  f"{(failed['answered'] - cut) if failed else -1:.1f} s after the cut: "
                  f"{failed and failed['status']} {failed and failed.get('message', '')[:200]!r}")
            back = srv.wait_health(lambda x: x["instances"][0]["state"] == "ready" and
                                   x["instances"][0]["restarts"] == restarts + 1, 150)
            ready = time.time()
            check(back is not None, f"{label}: with the link back up ring=2 is restarted ({ready - restored:.1f} s)")
            served = False
            end = time.time() + 60
            while time.time() < end and not served:
                served = any(r["status"] == 200 and r.get("instance") == 0 and r["sent"] >= ready for r in load.snapshot())
                time.sleep(0.2)
            check(served, f"{label}: ring=2 serves the load again")
            others = [r for r in load.snapshot() if cut <= r["answered"] <= ready and r.get("instance") == 1]
            check(len(others) > 0, f"{label}: ring=1 served {len(others)} request(s) meanwhile")
            cuts.append({"cut": cut, "ready": ready})
        stopped = load.stop()
        check(stopped, "every client thread finished (no request hangs)")
        c = load.counts()
        recs = load.snapshot()
        print(f"     counts: {c}", flush=True)
        check(c["sent"] == c["answered"] == c["200"] + c["429"] + c["5xx"] and c["client_error"] == 0,
              f"every request sent got exactly one answer: sent {c['sent']} = 200 {c['200']} + 429 {c['429']} + "
              f"5xx {c['5xx']} (client errors {c['client_error']})")
        stray = [r for r in recs if r["status"] != 200 and r["status"] != 429 and not (
            names_instance(r.get("message"), mesh) and any(x["cut"] - 1 <= r["answered"] <= x["ready"] + 1 for x in cuts))]
        check(not stray, f"every failure names ring=2 during a cut ({[r.get('message', '')[:160] for r in stray[:3]]})")
        longest = max((r["answered"] - r["sent"] for r in recs), default=0)
        check(longest <= 2 * TIMEOUT_S + 2 * SLACK_S, f"no request waited long: the longest took {longest:.1f} s")
        _, _, text = srv.request("GET", "/metrics")
        counted = {}
        for line in text.splitlines():
            if line.startswith("slope_requests_total{") and 'endpoint="completions"' in line:
                code = line.split('code="')[1].split('"')[0]
                counted[code] = counted.get(code, 0) + int(float(line.rsplit(" ", 1)[1]))
        mine = {}
        for r in recs:
            mine[str(r["status"])] = mine.get(str(r["status"]), 0) + 1
        check(counted == mine, f"/metrics counts the same answers as the clients: {counted} vs {mine}")
        _, _, h = srv.request("GET", "/health")
        check(h["status"] == "ok" and [x["restarts"] for x in h["instances"]] == [2, 0],
              f"at the end both instances are ready, restarts {[x['restarts'] for x in h['instances']]} (want [2, 0])")
    finally:
        if load:
            load.stop()
        code = srv.stop()
        check(code == 0, f"SIGTERM after the cuts: exit 0 (got {code})")
        if failures:
            print(srv.stderr()[-6000:])


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still takes the namespaces down
    sys.exit(main())
