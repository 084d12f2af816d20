"""The KV transfer service and the Python pull client end to end, over real TCP.

  python test_kv_transfer.py SLOPE_BINARY FIXTURE_DIR PYTHON_DIR [MPIEXEC]

FIXTURE_DIR is tests/reference/fixtures/gpt_oss: its model, and len_<N>.safetensors holding
transformers' own K/V (after RoPE) for fixed tokens, the independent reference every pulled
layer is compared with (full layers: every row; sliding-window layers, W = 16: the last W rows).
Covered: `slope serve` with instances ring=2 and ring=1 (each instance's handle pulled), f32
and bf16 on the wire, window_trim on and off, ack releasing (a second pull is refused), DELETE,
lease expiry (and the leased-bytes metric), a wrong or missing API key, a bad protocol version,
a truncated hello and a silent client (the rank keeps serving), push mode, a pull while the next
prefill runs, and `slope run --kv-serve` under 4-rank mpirun meshes. Exit 0 only if all pass.
"""
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

SLOPE, FIXTURES, PYDIR = sys.argv[1], sys.argv[2], sys.argv[3]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else "mpirun"
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))

import numpy as np  # noqa: E402

import slope_client  # noqa: E402
from slope_client.cache import read_safetensors  # noqa: E402
from slope_client.transfer import KvTransferError  # noqa: E402
from serve_util import Server  # noqa: E402

MODEL = os.path.join(FIXTURES, "model")
WINDOW = json.load(open(os.path.join(MODEL, "config.json")))["sliding_window"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def fixture(n):
    tensors, _ = read_safetensors(os.path.join(FIXTURES, f"len_{n}.safetensors"))
    return tensors


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(1e-30, float(np.max(np.abs(b)))))


def compare(cache, ref, what, tol=1e-4, trimmed=True):
    """Every layer of the pulled cache against transformers' K/V; the largest relative error."""
    n = len(ref["tokens"])
    check(cache.num_tokens == n, f"{what}: {cache.num_tokens} tokens, want {n}")
    worst = 0.0
    for i, layer in enumerate(cache.layers):
        k_ref, v_ref = ref[f"layers.{i}.k"], ref[f"layers.{i}.v"]
        first = max(0, n - layer.window) if trimmed and layer.window > 0 else 0
        check(layer.first_position == first and layer.rows == n - first,
              f"{what}: layer {i} (window {layer.window}) holds rows {layer.first_position}..{layer.first_position + layer.rows}, "
              f"want {first}..{n}")
        if layer.rows != n - first:
            continue
        worst = max(worst, rel_err(layer.k, k_ref[first:]), rel_err(layer.v, v_ref[first:]))
    check(worst <= tol, f"{what}: K/V equal transformers' within {tol} (max rel err {worst:.2e})")
    first_token = int(np.argmax(ref["logits"]))
    check(cache.first_token == first_token, f"{what}: first token {cache.first_token}, transformers' {first_token}")
    return worst


def refused(fn, needle, what):
    try:
        fn()
    except KvTransferError as e:
        check(needle in str(e), f"{what}: refused ({e})")
        return
    check(False, f"{what}: was not refused")


def prefill(server, tokens, headers=None, **extra):
    body = {"prompt": tokens, "best_effort": True}
    body.update(extra)
    status, _, r = server.request("POST", "/v1/prefill", body, headers=headers, timeout=300)
    if status != 200:
        raise RuntimeError(f"/v1/prefill: {status} {r}")
    return r


def frame(ftype, payload, version=1):
    return struct.pack("<4sHBBQ", b"SKVT", version, ftype, 0, len(payload)) + payload


def read_frame(sock):
    head = b""
    while len(head) < 16:
        chunk = sock.recv(16 - len(head))
        if not chunk:
            return None, None
        head += chunk
    magic, version, ftype, _, length = struct.unpack("<4sHBBQ", head)
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return ftype, json.loads(body) if ftype != 3 else body


def free_ports(n):
    """A base port p with p .. p + n - 1 free now (for --kv-port-base)."""
    rng = np.random.default_rng()
    for _ in range(100):
        base = int(rng.integers(20000, 60000))
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def endpoint_of(handle, rank=0):
    host, _, port = handle["ranks"][rank]["endpoint"].rpartition(":")
    return host, int(port)


def test_serve_two_instances():
    ref = fixture(100)
    tokens = [int(t) for t in ref["tokens"]]
    # fcfs routes each request to the instance predicted to finish it first: a queue spreads.
    base = free_ports(3)
    srv = Server(SLOPE, MODEL, ["ring=2", "ring=1"], extra=["--scheduler", "fcfs", "--kv-port-base", str(base)])
    try:
        # Both instances: requests at once (the scheduler spreads a queue) until each made a handle.
        handles, spare = {}, []
        for attempt in range(20):
            out = [None] * 6
            ts = [threading.Thread(target=lambda j=j: out.__setitem__(j, prefill(srv, tokens))) for j in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            for r in out:
                if r["kv"]["mesh"] in handles:
                    spare.append(r["kv"])
                handles.setdefault(r["kv"]["mesh"], r["kv"])
            if len(handles) == 2:
                break
        check(len(handles) == 2, f"both instances made a KV handle (got {sorted(handles)})")
        for kv in spare:
            srv.request("DELETE", f"/v1/kv/{kv['id']}")
        for mesh, kv in handles.items():
            ports = [int(r["endpoint"].rpartition(":")[2]) for r in kv["ranks"]]
            want = [base, base + 1] if "ring=2" in mesh else [base + 2]
            check(ports == want, f"{mesh}: the ranks listen on --kv-port-base's ports {want} (got {ports})")
            cache = slope_client.pull(kv)
            compare(cache, ref, f"serve {mesh} f32 pull")
            check(cache.meta["bytes"] < cache.meta["untrimmed_bytes"],
                  f"{mesh}: the trimmed pull sent {cache.meta['bytes']} bytes, fewer than {cache.meta['untrimmed_bytes']}")
            refused(lambda: slope_client.pull(kv), "keeps no KV", f"{mesh}: a second pull after the ack")
            status, _, body = srv.request("DELETE", f"/v1/kv/{kv['id']}")
            check(status == 200, f"{mesh}: DELETE after every rank acked is fine ({status} {body})")

        # bf16 on the wire (the request's kv_dtype is the pull's default), and no trimming.
        kv = prefill(srv, tokens, kv_dtype="bf16")["kv"]
        check(kv["dtype"] == "bf16", "the handle carries the request's kv_dtype")
        cache = slope_client.pull(kv, window_trim=False)
        check(cache.meta["dtype"] == "bf16", "the pull used the handle's dtype")
        compare(cache, ref, "bf16 untrimmed pull", tol=1e-2, trimmed=False)

        # DELETE releases every rank: the pull is refused.
        kv = prefill(srv, tokens)["kv"]
        status, _, _ = srv.request("DELETE", f"/v1/kv/{kv['id']}")
        check(status == 200, "DELETE of a kept KV")
        time.sleep(1.0)  # the instance's dispatch thread ships the release
        refused(lambda: slope_client.pull(kv), "keeps no KV", "a pull after DELETE")
        refused(lambda: slope_client.pull(dict(kv, id="kv-1-000000000000")), "keeps no KV", "a pull of an unknown id")

        # Malformed connections: the rank answers with an error frame, or drops a silent client,
        # and keeps serving.
        kv = prefill(srv, tokens)["kv"]
        host, port = endpoint_of(kv)
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(frame(1, json.dumps({"kv_id": kv["id"]}).encode(), version=2))
            ftype, body = read_frame(s)
            check(ftype == 5 and "version 2 is not supported" in body["error"] and body["code"] == "bad_version",
                  f"a hello of protocol version 2 gets an error frame ({body})")
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(frame(1, b'{"kv_id": "x"')[:-3])  # truncated, then the client leaves
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(frame(1, b"not json"))
            ftype, body = read_frame(s)
            check(ftype == 5 and body["code"] == "bad_frame", f"a hello that is not JSON gets an error frame ({body})")
        # A client that leaves in the middle of a tensor never acked: the rank keeps its shard.
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(frame(1, json.dumps({"kv_id": kv["id"]}).encode()))
            ftype, manifest = read_frame(s)
            check(ftype == 2 and manifest["kv_id"] == kv["id"], "the manifest comes first")
            s.recv(100)  # a header and a few bytes of the first tensor, then the client leaves
        silent = socket.create_connection((host, port), timeout=60)
        silent.sendall(frame(1, b'{"kv_id": ')[:20])  # a truncated hello, and the client stays
        cache = slope_client.pull(kv)
        compare(cache, ref, "a pull while another client sits on a truncated hello")
        silent.close()
        check(srv.proc.poll() is None, "the server survived the malformed connections")
    finally:
        check(srv.stop() == 0, "slope serve exits 0 on SIGTERM")


def test_cut_mid_transfer():
    """A rank whose connection ends mid-tensor: the pull fails with a clear error, not a hang."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def fake_rank():
        conn, _ = lsock.accept()
        with conn:
            read_frame(conn)  # the hello
            tensor = {"shape": [4, 1, 2], "bytes": 32, "crc32": "0"}  # a whole manifest: the client checks it first
            manifest = {"version": 1, "kv_id": "kv-x", "model": "m", "model_hash": "0", "architecture": "a", "dtype": "f32",
                        "window_trim": True, "num_tokens": 4, "first_token": 0, "rank": 0, "world_size": 1, "num_layers": 1,
                        "first_layer": 0, "layer_count": 1, "num_kv_heads": 1, "kv_head0": 0, "kv_heads": 1, "head_dim": 2,
                        "layers": [{"layer": 0, "window": 0, "ranges": [[0, 4]], "rows": 4}],
                        "tensors": [{"name": "layers.0.k", **tensor}, {"name": "layers.0.v", **tensor}],
                        "bytes": 64, "untrimmed_bytes": 64}
            conn.sendall(frame(2, json.dumps(manifest).encode()) + struct.pack("<4sHBBQ", b"SKVT", 1, 3, 0, 32) + b"\0" * 10)

    t = threading.Thread(target=fake_rank)
    t.start()
    handle = {"id": "kv-x", "ranks": [{"rank": 0, "owner": True, "endpoint": f"127.0.0.1:{port}"}]}
    refused(lambda: slope_client.pull(handle, timeout=20), "connection ended in the middle of a frame",
            "a connection cut mid-tensor")
    t.join()
    lsock.close()


def test_serve_key_push_lease_concurrent():
    ref = fixture(257)
    tokens = [int(t) for t in ref["tokens"]]
    key = "kv-test-key"
    auth = {"Authorization": f"Bearer {key}"}
    srv = Server(SLOPE, MODEL, ["ring=2"], extra=["--api-key", key])
    try:
        kv = prefill(srv, tokens, headers=auth)["kv"]
        refused(lambda: slope_client.pull(kv), "needs the server's API key", "a pull without the API key")
        refused(lambda: slope_client.pull(kv, api_key="wrong"), "the API key is wrong", "a pull with a wrong API key")

        # Push mode: the ranks dial the receiver.
        recv = slope_client.receive_push(kv)
        status, _, body = srv.request("POST", f"/v1/kv/{kv['id']}/push", {"targets": recv.targets()}, headers=auth,
                                      timeout=120)
        check(status == 200 and len(body.get("ranks", [])) == 2, f"POST /v1/kv/{{id}}/push ({status} {body})")
        compare(recv.result(), ref, "push mode f32")
        refused(lambda: slope_client.pull(kv, api_key=key), "keeps no KV", "a pull after the push was acked")
        status, _, body = srv.request("POST", f"/v1/kv/{kv['id']}/push",
                                      {"targets": [{"rank": 0, "endpoint": "127.0.0.1:1"}]}, headers=auth, timeout=60)
        check(status in (404, 502), f"a push of an acked KV is refused ({status})")
        kv2 = prefill(srv, tokens, headers=auth)["kv"]
        status, _, body = srv.request("POST", f"/v1/kv/{kv2['id']}/push",
                                      {"targets": [{"rank": 0, "endpoint": "127.0.0.1:1"}]}, headers=auth, timeout=60)
        check(status == 502 and "cannot connect" in json.dumps(body), f"a push to a closed port is a 502 ({status} {body})")
        compare(slope_client.pull(kv2, api_key=key), ref, "a pull after a failed push (nothing was released)")
        for done_kv in (kv, kv2):  # acked on every rank; the front's leases go with DELETE
            status, _, _ = srv.request("DELETE", f"/v1/kv/{done_kv['id']}", headers=auth)
            check(status == 200, f"DELETE of an acked KV ({status})")

        # Lease expiry frees the ranks' memory; the metric shows it.
        kv = prefill(srv, tokens, headers=auth, kv_lease_s=1.0)["kv"]
        _, _, metrics = srv.request("GET", "/metrics", headers=auth)
        check(f"slope_kv_leased_bytes {kv['bytes']}" in metrics, "the leased KV bytes are in /metrics")
        time.sleep(2.5)
        refused(lambda: slope_client.pull(kv, api_key=key), "keeps no KV", "a pull after the lease expired")
        _, _, metrics = srv.request("GET", "/metrics", headers=auth)
        check("slope_kv_leased_bytes 0" in metrics, "no leased KV bytes after the expiry")

        # A pull while the next prefill runs: the service's threads are not the engine's. Whether
        # the pull lands inside the pass is a race: the long prefill's pass took 30-45 ms on an AMX
        # machine (a 2 ms pull), longer on slower ones, and a busy machine delays its start. So the
        # pull starts 5 to 80 ms after the request, a different delay each try, up to 20 tries; a
        # service that waited for the engine would lose them all.
        long_prompt = [int(x) for x in np.random.default_rng(7).integers(0, 512, 4096)]
        delays = [0.005, 0.01, 0.02, 0.04, 0.08]
        for attempt in range(20):
            kv = prefill(srv, tokens, headers=auth)["kv"]
            done = {}

            def long_prefill():
                done["r"] = prefill(srv, long_prompt, headers=auth)
                done["end"] = time.time()

            t = threading.Thread(target=long_prefill)
            t.start()
            time.sleep(delays[attempt % len(delays)])
            began = time.time()
            cache = slope_client.pull(kv, api_key=key)
            pulled = time.time()
            t.join()
            # The pass ran in [end - pass_ms, end] (the answer leaves right after it); the pull
            # must lie inside that interval.
            pass_began = done["end"] - done["r"]["slope"]["pass_ms"] / 1e3
            if pass_began < began and pulled < done["end"]:
                break
        check(pass_began < began and pulled < done["end"],
              f"a pull ran inside a running prefill's pass, in {attempt + 1} of 20 tries (the last pull: "
              f"{began - pass_began:+.3f} s to {pulled - done['end']:+.3f} s from the pass's start and end)")
        compare(cache, ref, "a pull during a running prefill")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(" ".join(map(str, long_prompt)))
        one = json.loads(subprocess.run([SLOPE, "run", "--model", MODEL, "--tokens", f.name, "--dtype", "f32",
                                         "--threads", "1", "--json", "--quiet"], capture_output=True, text=True,
                                        check=True).stdout)
        os.unlink(f.name)
        check(done["r"]["first_token"] == one["first_token"],
              f"the prefill that ran during the pull has slope run's first token ({done['r']['first_token']})")

        # A restarted instance listens on new ports: later handles carry them.
        _, _, h = srv.request("GET", "/health", headers=auth)
        os.kill(h["instances"][0]["pids"][1], signal.SIGKILL)
        back = srv.wait_health(lambda h: h["instances"][0]["restarts"] >= 1 and h["instances"][0]["state"] == "ready",
                               120, headers=auth)
        check(back is not None, "the instance restarted after kill -9 of a rank")
        refused(lambda: slope_client.pull(kv, api_key=key), "", "a pull of a handle from before the restart")
        kv_new = prefill(srv, tokens, headers=auth)["kv"]
        old = {r["endpoint"] for r in kv["ranks"]}
        check(not old & {r["endpoint"] for r in kv_new["ranks"]},
              f"the restarted instance's handle has new endpoints ({sorted(old)} -> {[r['endpoint'] for r in kv_new['ranks']]})")
        compare(slope_client.pull(kv_new, api_key=key), ref, "a pull from the restarted instance")
    finally:
        check(srv.stop() == 0, "slope serve exits 0 on SIGTERM")


def test_run_kv_serve(mesh_args, name):
    ref = fixture(100)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(" ".join(str(int(t)) for t in ref["tokens"]))
    cmd = [MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none",
           "-x", "OMP_NUM_THREADS=1", "-np", "4", SLOPE, "run", "--model", MODEL, "--tokens", f.name, "--dtype", "f32",
           "--threads", "1", "--quiet", "--kv-serve", "--kv-lease-s", "120"] + mesh_args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    handle = None
    for line in p.stdout:
        if line.startswith("{") and '"endpoint"' in line:
            handle = json.loads(line)
            break
    check(handle is not None and len(handle["ranks"]) == 4, f"slope run --kv-serve {name}: rank 0 printed the handle")
    if handle:
        compare(slope_client.pull(handle), ref, f"slope run --kv-serve {name}")
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    check(rc == 0, f"slope run --kv-serve {name} exits 0 once every shard is acked (got {rc}): {p.stderr.read()[-2000:]}")
    # Nobody pulls: the lease ends and the run exits 0 by itself.
    cmd[cmd.index("120")] = "1"
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0 and "lease ended" in r.stderr,
          f"slope run --kv-serve {name} with no client exits 0 after the lease ({r.returncode}, {time.time() - t0:.1f} s)")
    os.unlink(f.name)


test_cut_mid_transfer()
test_serve_two_instances()
test_serve_key_push_lease_concurrent()
test_run_kv_serve(["--ring", "2", "--ulysses", "2"], "ring=2,ulysses=2")
test_run_kv_serve(["--pp", "2", "--tp", "2"], "pp=2,tp=2")
if failures:
    print(f"\n{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("\nall KV transfer checks passed")
