#!/usr/bin/env python3
"""Rank failures under `slope serve`, with a steady load (issue 17, part 3).

usage: test_faults.py SLOPE_BINARY PYTHON_DIR

One server with three instances (ring=2, pp=2, ring=1; --timeout 10) on a generated tiny
gpt-oss model, under a load of three client threads sending completions one after another
(prompts of 16 to 4000 tokens; the fcfs scheduler, which spreads them over the three). While the load runs, `kill -9` of one rank of one instance:
  (a) before its first exchange: rank 1 of ring=2 is stopped (SIGSTOP) while the instance is
      idle, the load dispatches a request to it (rank 0 starts it and waits for rank 1), then
      rank 1 is killed;
  (b) mid-ring: rank 1 of ring=2 while both ranks compute a prefill;
  (c) mid-pipeline: rank 0 of pp=2 while both stages compute;
  (d) during a KV pull: a /v1/prefill's handle pulled with slope_client.pull from every rank,
      rank 1 of the instance killed once the client has received its first tensor;
  (e) four kills at random moments (seeded): a random instance, rank and delay;
  (f) ring=1's rank killed, then its replacement killed as it starts (before its hello).
Each time: the request in flight gets a 5xx naming the instance within --timeout + 5 s (for the
pull: a KvTransferError naming the rank), the other instances' requests all succeed meanwhile,
the instance is restarted (/health: ready, one more restart) and serves again, and the lease of
the pulled handle is gone (404) after the restart. At the end: every request sent got exactly
one answer (200, 429 or a 5xx naming an instance that was faulted at that moment; no client
error, no hang), the server's own counts (/metrics) equal the clients', each instance's
restart count equals the kills it took. Exit 0 only if every check passed.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SLOPE, PYDIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, PYDIR)

from fault_util import Load, names_instance, wait_busy, wait_idle  # noqa: E402
from serve_util import Server  # noqa: E402
import slope_client  # noqa: E402
from slope_client import transfer  # noqa: E402
from slope_client.transfer import KvTransferError  # noqa: E402

TIMEOUT_S = 10   # the instances' --timeout
SLACK_S = 5      # what the front's and mpirun's poll loops may add
LENGTHS = [16, 64, 256, 1024, 2048, 4000]  # 4000 tokens: about 0.3 s on ring=2
failures = []
faults = []      # {"what", "instance", "mesh", "start", "kill", "ready"}


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def instance(srv, i):
    _, _, h = srv.request("GET", "/health", timeout=10)
    return h["instances"][i]


def recover(srv, load, i, restarts_before, label):
    """The instance comes back (ready, one more restart) and serves a request of the load again."""
    back = srv.wait_health(lambda h: h["instances"][i]["state"] == "ready" and
                           h["instances"][i]["restarts"] == restarts_before + 1, 60)
    ready = time.time()
    check(back is not None, f"{label}: instance {i} restarted and ready (restarts {restarts_before + 1})")
    served = False
    end = time.time() + 30
    while time.time() < end and not served:
        served = any(r["status"] == 200 and r.get("instance") == i and r["sent"] >= ready for r in load.snapshot())
        time.sleep(0.2)
    check(served, f"{label}: the restarted instance {i} serves the load again")
    return ready


def fault_window_checks(load, f):
    """The affected request(s): a 5xx naming the instance, within the timeout of the kill; the
    others' requests meanwhile all succeed (some of them answered while it was down)."""
    recs = load.snapshot()
    hit = [r for r in recs if r["status"] != 200 and r["status"] != 429 and
           f["start"] <= r["answered"] <= f["kill"] + TIMEOUT_S + SLACK_S]
    named = [r for r in hit if isinstance(r["status"], int) and 500 <= r["status"] < 600 and
             names_instance(r.get("message"), f["mesh"])]
    in_flight = [r for r in named if r["sent"] < f["kill"] and "during the request" in r.get("message", "")]
    others = [r for r in recs if r["status"] == 200 and r.get("instance") != f["instance"] and
              f["kill"] <= r["answered"] <= f["ready"]]
    late = max((r["answered"] - f["kill"] for r in in_flight), default=0)
    return in_flight, hit, named, others, late


def kill_when(srv, load, i, rank, label, prepare, want_in_flight=True, attempts=5):
    """prepare(pids) readies the moment (returns the fault's start time); then kill -9 of the rank."""
    for attempt in range(1, attempts + 1):
        inst = instance(srv, i)
        pids, mesh, restarts = inst["pids"], inst["mesh"], inst["restarts"]
        start = prepare(pids)
        kill = time.time()
        os.kill(pids[rank], signal.SIGKILL)
        f = {"what": label, "instance": i, "mesh": mesh, "start": start, "kill": kill, "rank": rank}
        f["ready"] = recover(srv, load, i, restarts, f"{label} (attempt {attempt})")
        faults.append(f)
        in_flight, hit, named, others, late = fault_window_checks(load, f)
        print(f"     {label}: attempt {attempt}: {len(in_flight)} request(s) in flight failed, "
              f"{len(named)} 5xx named {mesh}, {len(others)} served by the others while it was down", flush=True)
        check(len(hit) == len(named), f"{label}: every failed request names the faulted instance ({len(hit)} failed, "
              f"{len(named)} name it: {[r.get('message', '')[:120] for r in hit if r not in named]})")
        if not want_in_flight or in_flight:
            if want_in_flight:
                check(late <= TIMEOUT_S + SLACK_S,
                      f"{label}: the request in flight got its 5xx {late:.1f} s after the kill "
                      f"(<= {TIMEOUT_S + SLACK_S}): {in_flight[0]['status']} {in_flight[0]['message'][:160]!r}")
            check(len(others) > 0, f"{label}: the other instances served {len(others)} request(s) meanwhile")
            return f
        print(f"     {label}: the kill found the instance between requests; again", flush=True)
    check(False, f"{label}: no attempt of {attempts} killed the rank with a request in flight")
    return None


def main():
    with tempfile.TemporaryDirectory(prefix="slope-faults-") as tmp:
        model = os.path.join(tmp, "tiny")
        subprocess.run([SLOPE, "make-model", "--arch", "gpt-oss", "--preset", "tiny", "--seed", "5", "--out", model],
                       check=True, capture_output=True)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        srv = Server(SLOPE, model, ["ring=2", "pp=2", "ring=1"],
                     ["--scheduler", "fcfs", "--timeout", str(TIMEOUT_S), "--start-timeout", "120", "--kv-lease-s", "120"])
        load = None
        try:
            _, _, h = srv.request("GET", "/health")
            check([i["mesh"].split(",")[:2] for i in h["instances"]] == [["pp=1", "ring=2"], ["pp=2", "ring=1"],
                                                                           ["pp=1", "ring=1"]],
                  f"three instances: {[i['mesh'] for i in h['instances']]}")
            load = Load(srv.port, vocab, LENGTHS, clients=3, seed=7)
            time.sleep(3)
            check(load.counts()["200"] > 0, f"the load is served: {load.counts()}")

            # (a) before the first exchange.
            def stop_rank1(pids):
                wait_idle(pids, 20)
                os.kill(pids[1], signal.SIGSTOP)
                t = time.time()
                # The load dispatches a request: rank 0 starts it (and waits), rank 1 never does.
                check(wait_busy(pids[:1], TIMEOUT_S / 2), "a request is dispatched to the instance with rank 1 stopped")
                time.sleep(0.2)
                return t
            kill_when(srv, load, 0, 1, "(a) before the first exchange, ring=2 rank 1", stop_rank1)

            # (b) mid-ring, (c) mid-pipeline: both ranks of the instance are computing.
            def busy(pids):
                check(wait_busy(pids, 60), "the instance's ranks are seen computing")
                return time.time()
            kill_when(srv, load, 0, 1, "(b) mid-ring, ring=2 rank 1", busy)
            kill_when(srv, load, 1, 0, "(c) mid-pipeline, pp=2 rank 0", busy)

            # (d) during a KV pull.
            kv_pull(srv, load, vocab)

            # (e) random moments.
            rng = random.Random(17)
            for k in range(4):
                i = rng.randrange(3)
                inst = instance(srv, i)
                rank = rng.randrange(len(inst["pids"]))
                delay = rng.uniform(0.2, 3.0)
                label = f"(e{k + 1}) random: instance {i} ({inst['mesh'].split(',tp')[0]}) rank {rank} after {delay:.2f} s"
                kill_when(srv, load, i, rank, label, lambda pids, d=delay: (time.sleep(d), time.time())[1],
                          want_in_flight=False, attempts=1)

            # (f) a kill while the instance restarts: the new job's rank dies before its hello.
            kill_while_restarting(srv, load, 2)

            time.sleep(2)
            stopped = load.stop()
            check(stopped, "every client thread finished (no request hangs)")
            final_checks(srv, load)
        finally:
            if load:
                load.stop()
            code = srv.stop()
            check(code == 0, f"SIGTERM after the faults: exit 0 (got {code})")
            if failures:
                print(srv.stderr()[-6000:])


def kv_pull(srv, load, vocab):
    label = "(d) during a KV pull"
    rng = random.Random(3)
    handle = None
    for _ in range(20):  # until the prefill lands on an instance of 2 ranks
        status, _, p = srv.request("POST", "/v1/prefill", body={"prompt": [rng.randrange(vocab) for _ in range(768)]},
                                   timeout=60)
        if status == 200 and len(p["kv"]["ranks"]) == 2:
            handle = p["kv"]
            break
        if status == 200:
            srv.request("DELETE", "/v1/kv/" + p["kv"]["id"])
    if not check(handle is not None, f"{label}: a /v1/prefill on a 2-rank instance gives a handle"):
        return
    i = handle["instance"]
    inst = instance(srv, i)
    victim = inst["pids"][1]
    killed = {}
    real_recv = transfer._recv_exact

    def recv_then_kill(sock, n):  # the test's hook: kill -9 once the client holds its first tensor
        data = real_recv(sock, n)
        if n >= 1024 and "at" not in killed:
            killed["at"] = time.time()
            os.kill(victim, signal.SIGKILL)
            time.sleep(0.3)
        return data

    transfer._recv_exact = recv_then_kill
    start = time.time()
    err = None
    try:
        slope_client.pull(handle, timeout=TIMEOUT_S)
    except KvTransferError as e:
        err = e
    except OSError as e:
        err = e
    finally:
        transfer._recv_exact = real_recv
    waited = time.time() - killed.get("at", start)
    check("at" in killed, f"{label}: rank 1 of instance {i} killed mid-stream (after the client's first tensor)")
    check(isinstance(err, KvTransferError) and "rank" in str(err) and waited <= TIMEOUT_S + SLACK_S,
          f"{label}: the pull fails with a clear error {waited:.1f} s after the kill: {type(err).__name__}: {err}")
    f = {"what": label, "instance": i, "mesh": inst["mesh"], "start": start, "kill": killed.get("at", start), "rank": 1}
    f["ready"] = recover(srv, load, i, inst["restarts"], label)
    faults.append(f)
    status, _, d = srv.request("DELETE", "/v1/kv/" + handle["id"])
    check(status == 404 and d["error"]["code"] == "kv_not_found" and "restarted" in d["error"]["message"],
          f"{label}: the lease is gone after the restart (DELETE -> {status} {d.get('error', {}).get('message', d)!r})")
    t0 = time.time()
    try:
        slope_client.pull(handle, timeout=TIMEOUT_S)
        err2 = None
    except (KvTransferError, OSError) as e:
        err2 = e
    check(err2 is not None and time.time() - t0 <= TIMEOUT_S + SLACK_S,
          f"{label}: pulling the dead handle again fails at once: {type(err2).__name__}: {err2}")
    _, hit, named, others, _ = fault_window_checks(load, f)
    check(len(hit) == len(named), f"{label}: every failed request names the faulted instance "
          f"({[(round(r['answered'] - f['kill'], 2), r['status'], r.get('message', '')[:160]) for r in hit if r not in named]})")
    check(len(others) > 0, f"{label}: the other instances served {len(others)} request(s) meanwhile")


def new_rank(server_pid, old, sock):
    """A `slope instance` process of the server's (its parent, mpirun, is the server's child)
    on the unix socket `sock` (instanceI.sock: one instance), not in `old`, or None."""
    def stat(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in old:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if len(argv) < 2 or argv[1] != b"instance" or not any(a.endswith(sock.encode()) for a in argv):
                continue
            launcher = int(stat(name)[1])
            if int(stat(launcher)[1]) == server_pid:
                return int(name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def kill_while_restarting(srv, load, i):
    label = f"(f) a new rank of the restarting instance {i}"
    _, _, h = srv.request("GET", "/health")
    inst = h["instances"][i]
    old = {p for x in h["instances"] for p in x["pids"]}
    log_at = len(srv.stderr())
    start = time.time()
    os.kill(inst["pids"][0], signal.SIGKILL)
    victim, end = None, time.time() + 60
    while victim is None and time.time() < end:
        victim = new_rank(srv.proc.pid, old, f"/instance{i}.sock")
        time.sleep(0.005)
    if not check(victim is not None, f"{label}: the restart's new rank appears"):
        return
    kill = time.time()
    os.kill(victim, signal.SIGKILL)
    f = {"what": label, "instance": i, "mesh": inst["mesh"], "start": start, "kill": kill, "rank": 0}
    f["ready"] = recover(srv, load, i, inst["restarts"], label)
    faults.append(f)
    log = srv.stderr()[log_at:]
    check("while starting" in log and "trying again" in log,
          f"{label}: the front saw the new job fail while starting and tried again "
          f"({[l for l in log.splitlines() if 'while starting' in l][:1]})")
    _, hit, named, others, _ = fault_window_checks(load, f)
    check(len(hit) == len(named), f"{label}: every failed request names the faulted instance "
          f"({[(round(r['answered'] - kill, 2), r['status'], r.get('message', '')[:160]) for r in hit if r not in named]})")
    check(len(others) > 0, f"{label}: the other instances served {len(others)} request(s) meanwhile")


def final_checks(srv, load):
    c = load.counts()
    recs = load.snapshot()
    print(f"     counts: {c}; faults: {len(faults)}", flush=True)
    check(c["sent"] == c["answered"] == c["200"] + c["429"] + c["5xx"],
          f"every request sent got exactly one answer: sent {c['sent']} = 200 {c['200']} + 429 {c['429']} + "
          f"5xx {c['5xx']} (client errors {c['client_error']}, other {c['other']})")
    check(c["client_error"] == 0 and c["other"] == 0, "no client error, no other status")
    stray = [r for r in recs if isinstance(r["status"], int) and 500 <= r["status"] < 600 and not any(
        names_instance(r.get("message"), f["mesh"]) and f["start"] <= r["answered"] <= f["ready"] + 1 for f in faults)]
    check(not stray, f"every 5xx names an instance that was faulted at that moment ({len(stray)} do not: "
          f"{[r.get('message', '')[:160] for r in stray[:3]]})")
    longest = max((r["answered"] - r["sent"] for r in recs), default=0)
    check(longest <= 2 * TIMEOUT_S + 2 * SLACK_S, f"no request waited long: the longest answer took {longest:.1f} s")
    _, _, h = srv.request("GET", "/health")
    kills = [sum(1 for f in faults if f["instance"] == i) for i in range(3)]
    check(h["status"] == "ok" and all(x["state"] == "ready" for x in h["instances"]) and
          [x["restarts"] for x in h["instances"]] == kills,
          f"at the end every instance is ready, restarts {[x['restarts'] for x in h['instances']]} = kills {kills}")
    status, _, text = srv.request("GET", "/metrics")
    counted = {}
    for line in text.splitlines():
        if line.startswith("slope_requests_total{") and 'endpoint="completions"' in line:
            code = line.split('code="')[1].split('"')[0]
            counted[code] = counted.get(code, 0) + int(float(line.rsplit(" ", 1)[1]))
    mine = {}
    for r in recs:
        mine[str(r["status"])] = mine.get(str(r["status"]), 0) + 1
    check(counted == mine, f"/metrics counts the same answers as the clients: {counted} vs {mine}")
    served_by = {i: sum(1 for r in recs if r.get("instance") == i) for i in range(3)}
    print(f"     served by instance: {served_by}", flush=True)


signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a test timeout still stops the server
main()
print("PASS" if not failures else f"FAIL: {len(failures)} check(s)")
sys.exit(1 if failures else 0)
