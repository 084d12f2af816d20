#!/usr/bin/env python3
"""Prefills across network namespaces equal one rank (issue 17, "several hosts").

scripts/netns-cluster.sh makes 2 "nodes" (network namespaces on a bridge); one mpirun runs the
ranks inside them, MPI over TCP on the bridge only (no shared memory between nodes). For ring=2,
ulysses=2, pp=2 (1 rank per node) and ring=2 x ulysses=2 (2 ranks per node):
  - `slope run --check` passes (it compares with one rank itself; exit 4 on a mismatch);
  - the first token equals, and the last position's logits match, a separate 1-rank run;
  - the bytes each node's veth carried out grew by at least what its ranks' data plane sent
    (half of it with 2 ranks per node), so the traffic really crossed the links (and not a loopback or shared memory);
  - with 2 ms added each way on every link and 1% of the frames dropped (netem, or where the
    kernel lacks it the user-space link of scripts/netns-link.py), ring=2 and pp=2 still equal
    one rank, and the delay and the drops were really there.

Usage: test_netns_meshes.py SLOPE_BINARY REPO_ROOT. Exit 77 (skipped) without `ip` or without
CAP_NET_ADMIN / CAP_SYS_ADMIN.
"""
import array
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TOKENS = 96
LOGITS_REL_TOL = 0.03  # bf16 across meshes, as slope run --check's logits tolerance

# name, slope run mesh flags, ranks per node (2 nodes)
MESHES = [
    ("ring2", ["--ring", "2"], 1),
    ("ulysses2", ["--ulysses", "2"], 1),
    ("pp2", ["--pp", "2"], 1),
    ("ring2_ulysses2", ["--ring", "2", "--ulysses", "2"], 2),
]


def main():
    slope, root = sys.argv[1], sys.argv[2]
    cluster = os.path.join(root, "scripts", "netns-cluster.sh")
    env = dict(os.environ)
    # A prefix and subnet of the test's own, so a cluster someone made by hand is not touched.
    env.update(SLOPE_NETNS_PREFIX="slope-t", SLOPE_NETNS_BRIDGE="slope-tbr0",
               SLOPE_NETNS_SUBNET="10.78.0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    up = subprocess.run(["bash", cluster, "up", "2"], env=env, capture_output=True, text=True)
    if up.returncode == 77:
        print("SKIP: " + up.stderr.strip())
        return 77
    tmp = tempfile.mkdtemp(prefix="slope-netns-")
    try:
        if up.returncode != 0:
            raise SystemExit("netns-cluster.sh up 2 failed:\n" + up.stdout + up.stderr)
        return run_all(slope, cluster, env, tmp)
    finally:
        subprocess.run(["bash", cluster, "down"], env=env)
        shutil.rmtree(tmp, ignore_errors=True)


def veth_bytes(cluster, env, node):
    out = subprocess.run(["bash", cluster, "bytes", str(node)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])  # root side: tx = toward the node, rx = from the node


def read_logits(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def rel_err(a, b):
    num = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    den = sum(y * y for y in b) ** 0.5
    return num / max(den, 1e-30)


def run_all(slope, cluster, env, tmp):
    model = os.path.join(tmp, "tiny")
    subprocess.run([slope, "make-model", "--arch", "gpt-oss", "--preset", "tiny", "--seed", "5",
                    "--out", model], check=True, capture_output=True)
    common = ["run", "--model", model, "--random-tokens", str(TOKENS), "--seed", "3",
              "--threads", "1", "--json", "--quiet", "--timeout", "60"]
    ref_logits = os.path.join(tmp, "ref.bin")
    ref = json.loads(subprocess.run([slope, *common, "--logits-out", ref_logits], check=True,
                                    capture_output=True, text=True, timeout=120).stdout)
    ref_l = read_logits(ref_logits)
    failures = []
    for name, flags, per_node in MESHES:
        logits = os.path.join(tmp, name + ".bin")
        before = [veth_bytes(cluster, env, n) for n in (0, 1)]
        p = subprocess.run(["bash", cluster, "mpirun", str(per_node), "--", slope, *common, *flags,
                            "--check", "--logits-out", logits],
                           env=env, capture_output=True, text=True, timeout=180)
        after = [veth_bytes(cluster, env, n) for n in (0, 1)]
        if p.returncode != 0:
            failures.append(f"{name}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        problems = []
        if not r.get("check", {}).get("pass"):
            problems.append(f"--check did not pass: {r.get('check')}")
        if r["first_token"] != ref["first_token"]:
            problems.append(f"first token {r['first_token']} != 1-rank {ref['first_token']}")
        err = rel_err(read_logits(logits), ref_l)
        if err > LOGITS_REL_TOL:
            problems.append(f"logits rel err {err:.4g} vs the 1-rank run > {LOGITS_REL_TOL}")
        # Rank k is on node k // per_node. With one rank per node every byte a rank sends goes
        # to the other node; with two, only part of it does (the rest stays inside the
        # namespace), so require half. The last pipeline stage sends no payload at all.
        share = 1.0 if per_node == 1 else 0.5
        total = sum(pr["bytes_sent"] for pr in r["per_rank"])
        if total <= 0:
            problems.append("the ranks report no bytes sent at all")
        for node in (0, 1):
            sent = sum(pr["bytes_sent"] for pr in r["per_rank"] if pr["rank"] // per_node == node)
            from_node = after[node][1] - before[node][1]
            if from_node < share * sent:
                problems.append(f"node {node}'s veth carried {from_node} B out, less than "
                                f"{share:g} x the {sent} B its ranks sent: the traffic did not "
                                "cross the link")
        print(f"{name}: check {r['check']['pass']}, first token {r['first_token']}, logits rel err "
              f"{err:.3g}, veth out bytes node0 {after[0][1] - before[0][1]} node1 "
              f"{after[1][1] - before[1][1]}, ranks sent "
              f"{[pr['bytes_sent'] for pr in r['per_rank']]}")
        failures += [f"{name}: {x}" for x in problems]
    failures += lossy_link(slope, cluster, env, tmp, common, ref, ref_l)
    if failures:
        print("FAIL\n" + "\n".join(failures))
        return 1
    print("PASS: every mesh across 2 namespaces equals one rank, traffic crossed the veths, "
          "and a link with delay and loss changes nothing but the time")
    return 0


def connect_rtt(env, ns, addr):
    """Seconds for a TCP connect from namespace ns to a closed port on addr (SYN, then RST)."""
    code = ("import socket, time\n"
            "t = time.monotonic()\n"
            "try: socket.create_connection((%r, 9), timeout=5).close()\n"
            "except OSError: pass\n"
            "print(time.monotonic() - t)" % addr)
    out = subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def lossy_link(slope, cluster, env, tmp, common, ref, ref_l):
    """Both links with DELAY added each way and LOSS of the frames dropped (netem, or where the
    kernel lacks it scripts/netns-link.py): ring=2 and pp=2 still equal one rank, the delay is
    there (a connect's round trip crosses 4 delayed hops), and frames were dropped."""
    delay_ms, loss = 2, "1%"
    shaped = subprocess.run(["bash", cluster, "shape", "all", "--delay", f"{delay_ms}ms", "--loss", loss],
                            env=env, capture_output=True, text=True)
    if shaped.returncode != 0:
        return [f"shape --delay --loss failed: {shaped.stderr.strip()}"]
    problems = []
    ns0 = env["SLOPE_NETNS_PREFIX"] + "0"
    rtt = min(connect_rtt(env, ns0, env["SLOPE_NETNS_SUBNET"] + ".2") for _ in range(3))
    if rtt < 4 * delay_ms / 1000 * 0.9:
        problems.append(f"a connect across the delayed links took {rtt * 1000:.1f} ms, under the "
                        f"{4 * delay_ms} ms the added delay makes")
    for name, flags in (("ring2", ["--ring", "2"]), ("pp2", ["--pp", "2"])):
        logits = os.path.join(tmp, name + "-lossy.bin")
        p = subprocess.run(["bash", cluster, "mpirun", "1", "--", slope, *common, *flags, "--check",
                            "--logits-out", logits], env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            problems.append(f"{name} over the lossy link: exit {p.returncode}\n{p.stderr[-3000:]}")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        err = rel_err(read_logits(logits), ref_l)
        if not r.get("check", {}).get("pass") or r["first_token"] != ref["first_token"] or err > LOGITS_REL_TOL:
            problems.append(f"{name} over the lossy link: check {r.get('check')}, first token "
                            f"{r['first_token']} (1 rank: {ref['first_token']}), logits rel err {err:.3g}")
        print(f"{name} with {delay_ms} ms and {loss} loss per link: check {r['check']['pass']}, "
              f"logits rel err {err:.3g}, TTFT {r['ttft_ms']:.0f} ms")
    status = subprocess.run(["bash", cluster, "status"], env=env, capture_output=True, text=True).stdout
    print(status.strip())
    dropped = [int(x) for x in re.findall(r'"dropped": (\d+)', status)]
    if "emulated link" in status and sum(dropped) == 0:
        problems.append(f"the emulated links dropped no frame at {loss} loss: {status}")
    subprocess.run(["bash", cluster, "unshape", "all"], env=env, check=True)
    return [f"lossy link: {x}" for x in problems]


if __name__ == "__main__":
    sys.exit(main())
