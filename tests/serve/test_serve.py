#!/usr/bin/env python3
"""`slope serve` end to end, over real HTTP with real clients.

usage: test_serve.py SLOPE_BINARY MODEL_DIR

Starts the server on the tiny model with two instances of different meshes ("ring=2" and
"ring=1", f32, an API key) and checks:
  - the openai client: completions with token ids, with logprobs (OpenAI's legacy format, the
    `slope` extension's fields), and errors as openai exceptions with the right status;
  - raw HTTP (http.client): every malformed request gets its 4xx with an OpenAI error body that
    names the problem, and the server still answers afterwards;
  - results: a served prefill's first token, top logprobs and logits equal `slope run`'s for
    the same prompt on the mesh that served it (the SLO server routes short prompts to ring=1;
    a second server with --scheduler fcfs routes them to the faster ring=2);
  - /v1/prefill's KV handle, DELETE /v1/kv/{id} (then 404), and a lease that expires;
  - /metrics parsed by prometheus_client's parser, its counters consistent with what was sent;
  - a client that disconnects while queued frees its slot (its instance held by SIGSTOP);
  - faults: `kill -9` of one rank of the ring=2 instance mid-request gives that request a 5xx
    within the communication timeout, the other instance serves meanwhile, and the killed one
    comes back; a rank that hangs (SIGSTOP) is given up on after --timeout, with the same result;
  - text prompts encoded with the model's tokenizer.json, as `slope run --prompt` encodes them;
  - SIGTERM drains (a request in flight completes, new ones get 503) and exits 0, leaving no
    instance process behind;
  - --bf16-units reaches the instances (a bf16 server serves `slope run`'s logits on the units
    it was asked for), and auto is decided once, by the server: its instances are started with
    the units it chose, and /health shows what each runs.
Exit code 0 only if every check passed.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import openai
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

SLOPE, MODEL = sys.argv[1], sys.argv[2]
KEY = "test-key-123"
AUTH = {"Authorization": "Bearer " + KEY}
TIMEOUT_S = 8  # the instances' --timeout: a dead peer must be noticed within this
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def config():
    with open(os.path.join(MODEL, "config.json")) as f:
        return json.load(f)


CFG = config()
V = CFG["vocab_size"]
MAX_POS = CFG["max_position_embeddings"]


def prompt(n, seed):
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(x % V)
    return out


def mpirun(np):
    cmd = ["mpirun", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def slope_run(ids, mesh, dtype_args=("--dtype", "f32")):
    """`slope run` on the mesh ("pp=1,ring=2,ulysses=1,tp=1"): (first token, top logprobs, logits)."""
    m = dict(kv.split("=") for kv in mesh.split(","))
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "tokens.txt")
        with open(tok, "w") as f:
            f.write(" ".join(map(str, ids)))
        logits = os.path.join(d, "logits.bin")
        np = int(m["pp"]) * int(m["ring"]) * int(m["ulysses"]) * int(m["tp"])
        cmd = (mpirun(np) if np > 1 else []) + [SLOPE, "run", "--model", MODEL, "--tokens", tok, *dtype_args,
                                                "--threads", "1", "--top-k", "5", "--json", "--quiet",
                                                "--logits-out", logits, "--pp", m["pp"], "--ring", m["ring"],
                                                "--ulysses", m["ulysses"], "--tp", m["tp"]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"slope run failed: {out.stderr}")
        j = json.loads(out.stdout.strip().splitlines()[-1])
        with open(logits, "rb") as f:
            raw = f.read()
        return j["first_token"], [(t["token"], t["logprob"]) for t in j["top_logprobs"]], \
            list(struct.unpack("<%df" % (len(raw) // 4), raw))


def rel_err(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) / max(1e-30, max(abs(y) for y in b))


def compare_with_run(srv, client, ids, label):
    r = client.completions.create(model=srv.name, prompt=ids, max_tokens=1, logprobs=5,
                                  extra_body={"return_logits": True})
    ext = r.model_extra["slope"]
    first, top, logits = slope_run(ids, ext["instance_mesh"])
    served_top = [(t[0], t[1]) for t in ext["top_logprobs"]]
    check(ext["first_token"] == first, f"{label}: first token {ext['first_token']} equals slope run's ({first}) on "
          f"{ext['instance_mesh']}")
    check(len(served_top) == 5 and all(a[0] == b[0] and abs(a[1] - b[1]) <= 1e-5 for a, b in zip(served_top, top)),
          f"{label}: top-5 logprobs equal slope run's")
    err = rel_err(ext["logits"], logits) if len(ext["logits"]) == len(logits) else float("inf")
    check(err <= 1e-5, f"{label}: logits equal slope run's (rel err {err:.2e})")
    return ext["instance_mesh"]


def metrics(srv):
    status, _, text = srv.request("GET", "/metrics", headers=AUTH)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return status, fams


def sample(fams, family, name, **labels):
    total = 0.0
    for s in fams[family].samples if family in fams else []:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def test_main_server():
    srv = Server(SLOPE, MODEL, ["ring=2", "ring=1"],
                 ["--api-key", KEY, "--timeout", str(TIMEOUT_S), "--max-body-bytes", "100000", "--kv-lease-s", "30"])
    sent = {"completions_200": 0, "completions_4xx": 0, "prefill_200": 0}
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
        status, _, h = srv.request("GET", "/health", headers=AUTH)
        check(status == 200 and h["status"] == "ok" and [i["state"] for i in h["instances"]] == ["ready", "ready"],
              f"/health lists two ready instances: {h}")
        models = client.models.list()
        check([m.id for m in models.data] == [srv.name], "GET /v1/models lists the model")

        # Completions with token ids, and with logprobs.
        ids = prompt(37, 1)
        r = client.completions.create(model=srv.name, prompt=ids, max_tokens=1)
        sent["completions_200"] += 1
        c = r.choices[0]
        check(c.finish_reason == "length" and c.logprobs is None and r.usage.prompt_tokens == 37 and
              r.usage.completion_tokens == 1 and r.object == "text_completion",
              "completion: finish_reason length, usage, no logprobs unless asked")
        ext = r.model_extra["slope"]
        check(all(k in ext for k in ("ttft_ms", "queue_ms", "predicted_ttft_ms", "instance", "engine")) and
              ext["ttft_ms"] >= ext["queue_ms"] >= 0, f"completion: the slope extension's timings ({sorted(ext)})")
        r = client.completions.create(model=srv.name, prompt=ids, max_tokens=16, logprobs=3)
        sent["completions_200"] += 1
        lp = r.choices[0].logprobs
        check(len(lp.tokens) == 1 and len(lp.top_logprobs[0]) == 3 and lp.text_offset == [0] and
              abs(lp.token_logprobs[0] - max(lp.top_logprobs[0].values())) < 1e-9 and
              lp.tokens[0] == r.choices[0].text and r.choices[0].finish_reason == "length",
              "completion with logprobs=3: legacy format, the chosen token is the most likely; max_tokens=16 "
              "still returns one token with finish_reason length")

        # Errors through the openai client.
        def raises(exc, what, **kw):
            try:
                client.completions.create(**{"model": srv.name, "prompt": [1, 2, 3], **kw})
            except exc as e:
                return check(True, f"openai client: {what} raises {exc.__name__} ({e.status_code})")
            except Exception as e:  # noqa: BLE001
                return check(False, f"openai client: {what} raised {type(e).__name__}: {e}")
            return check(False, f"openai client: {what} did not raise")

        raises(openai.NotFoundError, "an unknown model", model="no-such-model")
        raises(openai.BadRequestError, "an empty prompt", prompt=[])
        raises(openai.BadRequestError, "echo=True", echo=True)
        raises(openai.BadRequestError, "an id outside the vocabulary", prompt=[1, V])
        sent["completions_4xx"] += 4
        try:
            openai.OpenAI(base_url=srv.base + "/v1", api_key="wrong", max_retries=0).completions.create(
                model=srv.name, prompt=[1, 2])
            check(False, "a wrong API key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "a wrong API key raises AuthenticationError (401)")

        # Raw HTTP: each malformed request gets its 4xx and names the problem.
        bad = [
            ("bad JSON", b'{"prompt": [1, 2', 400, "not valid JSON"),
            ("not an object", b"[1, 2]", 400, "must be a JSON object"),
            ("unknown field", {"prompt": [1], "tempature": 1}, 400, "unknown field 'tempature'"),
            ("mistyped max_tokens", {"prompt": [1], "max_tokens": "8"}, 400, "'max_tokens' must be an integer"),
            ("mistyped logprobs", {"prompt": [1], "logprobs": True}, 400, "'logprobs' must be an integer"),
            ("logprobs out of range", {"prompt": [1], "logprobs": 50}, 400, "'logprobs' must be in [0, 20]"),
            ("missing prompt", {"max_tokens": 1}, 400, "'prompt' is required"),
            ("empty prompt", {"prompt": []}, 400, "'prompt' is empty"),
            ("float ids", {"prompt": [1.5, 2]}, 400, "'prompt'[0] must be a token id"),
            ("negative id", {"prompt": [3, -1]}, 400, "'prompt'[1] = -1 is outside the vocabulary"),
            ("id out of range", {"prompt": [V + 7]}, 400, f"= {V + 7} is outside the vocabulary"),
            ("several prompts", {"prompt": [[1, 2], [3]]}, 400, "send one prompt per request"),
            ("text without a tokenizer", {"prompt": "hello"}, 400, "no tokenizer.json"),
            ("over max_position", {"prompt": [1] * (MAX_POS + 1)}, 400, "max_position_embeddings"),
            ("n = 2", {"prompt": [1], "n": 2}, 400, "'n' must be 1"),
            ("stream", {"prompt": [1], "stream": True}, 400, "'stream' is not supported"),
            ("echo", {"prompt": [1], "echo": True}, 400, "'echo' is not supported"),
            ("negative ttft_slo_ms", {"prompt": [1], "ttft_slo_ms": -5}, 400, "'ttft_slo_ms' must be in"),
            ("mistyped best_effort", {"prompt": [1], "best_effort": "yes"}, 400, "'best_effort' must be true or false"),
            ("unknown model", {"prompt": [1], "model": "gpt-9"}, 404, "does not exist"),
            ("body over the limit", b'{"prompt": [' + b"1, " * 60000 + b"1]}", 413, "over the limit of 100000 bytes"),
        ]
        for what, body, want, words in bad:
            raw = body if isinstance(body, bytes) else None
            status, _, j = srv.request("POST", "/v1/completions", body=None if raw else body, raw=raw,
                                       headers={**AUTH, "Content-Type": "application/json"})
            err = j.get("error", {}) if isinstance(j, dict) else {}
            check(status == want and words in err.get("message", "") and "type" in err and "param" in err and "code" in err,
                  f"raw HTTP: {what} -> {status} (want {want}), message {err.get('message', j)!r}")
            if want != 413:
                sent["completions_4xx"] += 1
        status, _, j = srv.request("POST", "/v1/prefill", body={"prompt": [1], "max_tokens": 1}, headers=AUTH)
        check(status == 400 and "unknown field 'max_tokens'" in j["error"]["message"], "/v1/prefill refuses max_tokens")
        status, _, j = srv.request("GET", "/v1/nothing", headers=AUTH)
        check(status == 404 and "no endpoint GET /v1/nothing" in j["error"]["message"], "an unknown path -> 404")
        for path in ("/health", "/metrics", "/v1/models"):
            status, _, j = srv.request("GET", path)
            check(status == 401 and j["error"]["code"] == "invalid_api_key", f"{path} without the API key -> 401")
        status, _, h = srv.request("GET", "/health", headers=AUTH)
        check(status == 200 and h["status"] == "ok", "the server still answers after the malformed requests")

        # Results against `slope run` on the serving mesh.
        meshes = set()
        for n, seed in ((5, 2), (33, 3), (130, 4)):
            meshes.add(compare_with_run(srv, client, prompt(n, seed), f"SLO server, {n} tokens"))
            sent["completions_200"] += 1

        # /v1/prefill: a KV handle; DELETE releases it; a short lease expires.
        status, _, p = srv.request("POST", "/v1/prefill", body={"prompt": prompt(40, 5), "logprobs": 2}, headers=AUTH)
        sent["prefill_200"] += 1
        kv = p.get("kv", {})
        check(status == 200 and kv.get("id", "").startswith("kv-") and kv.get("num_tokens") == 40 and kv.get("bytes", 0) > 0
              and len(kv.get("ranks", [])) >= 1 and kv["lease_expires_at"] > time.time() + 20 and len(p["top_logprobs"]) == 2,
              f"/v1/prefill returns the first token and a KV handle: {kv}")
        layers = sum(r["layers"] for r in kv.get("ranks", []) if r["cp_rank"] == 0 and r["tp_rank"] == 0)
        check(layers == CFG["num_hidden_layers"], "the handle's ranks cover every layer")
        status, _, d = srv.request("DELETE", "/v1/kv/" + kv.get("id", "x"), headers=AUTH)
        check(status == 200 and d.get("deleted") is True, "DELETE /v1/kv/{id} releases it")
        status, _, d = srv.request("DELETE", "/v1/kv/" + kv.get("id", "x"), headers=AUTH)
        check(status == 404 and d["error"]["code"] == "kv_not_found", "a second DELETE -> 404")
        status, _, p = srv.request("POST", "/v1/prefill", body={"prompt": [1, 2, 3], "kv_lease_s": 0.5}, headers=AUTH)
        sent["prefill_200"] += 1
        time.sleep(1.5)
        status, _, d = srv.request("DELETE", "/v1/kv/" + p["kv"]["id"], headers=AUTH)
        check(status == 404, "a lease of 0.5 s has expired after 1.5 s (DELETE -> 404)")

        # A client that leaves while queued frees its slot: ring=1 (where short prompts go) is held
        # by SIGSTOP, so a first request runs there (stuck) and a second queues behind it.
        pid = h["instances"][1]["pids"][0]
        os.kill(pid, signal.SIGSTOP)
        result = {}

        def first():
            result["first"] = srv.request("POST", "/v1/completions", body={"prompt": [1, 2, 3]}, headers=AUTH)

        t = threading.Thread(target=first)
        t.start()
        time.sleep(0.5)
        s = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps({"prompt": [4, 5, 6]}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)
        _, _, hq = srv.request("GET", "/health", headers=AUTH)
        queued = hq["instances"][1]["queue_depth"]
        s.close()
        time.sleep(1.0)
        _, fams = metrics(srv)
        gone = sample(fams, "slope_rejected", "slope_rejected_total", reason="client_gone")
        _, _, hq2 = srv.request("GET", "/health", headers=AUTH)
        check(queued == 1 and gone == 1 and hq2["instances"][1]["queue_depth"] == 0,
              f"a client that disconnects while queued frees its slot (queued {queued}, client_gone {gone}, "
              f"queue after {hq2['instances'][1]['queue_depth']})")
        os.kill(pid, signal.SIGCONT)
        t.join(timeout=30)
        check(result.get("first", (0,))[0] == 200, "the request held by SIGSTOP completes after SIGCONT")
        sent["completions_200"] += 1

        # Metrics: parse, and agree with what was sent.
        status, fams = metrics(srv)
        check(status == 200, "GET /metrics")
        ok_c = sample(fams, "slope_requests", "slope_requests_total", endpoint="completions", code="200")
        ok_p = sample(fams, "slope_requests", "slope_requests_total", endpoint="prefill", code="200")
        bad_c = sum(s.value for s in fams["slope_requests"].samples
                    if s.labels.get("endpoint") == "completions" and s.labels["code"].startswith("4") and s.labels["code"] != "499")
        met = sample(fams, "slope_slo_met", "slope_slo_met_total")
        missed = sample(fams, "slope_slo_missed", "slope_slo_missed_total")
        count = sample(fams, "slope_ttft_seconds", "slope_ttft_seconds_count")
        qcount = sample(fams, "slope_queue_seconds", "slope_queue_seconds_count")
        check(ok_c == sent["completions_200"] and ok_p == sent["prefill_200"],
              f"metrics: 200s {ok_c} completions / {ok_p} prefill (sent {sent['completions_200']} / {sent['prefill_200']})")
        check(bad_c == sent["completions_4xx"], f"metrics: {bad_c} 4xx completions (sent {sent['completions_4xx']})")
        served = sent["completions_200"] + sent["prefill_200"]
        check(met + missed == served and count == served and qcount == served,
              f"metrics: SLO met {met} + missed {missed} = TTFT count {count} = queue count {qcount} = {served} served")
        deletes = {s.labels["code"]: s.value for s in fams["slope_requests"].samples if s.labels.get("endpoint") == "kv_delete"}
        check(deletes == {"200": 1, "404": 2}, f"metrics: DELETE /v1/kv answers by status {deletes} (sent one 200, two 404)")
        inf = sample(fams, "slope_ttft_seconds", "slope_ttft_seconds_bucket", le="+Inf")
        check(inf == count, "metrics: the TTFT histogram's +Inf bucket holds every request")
        for g in ("slope_instance_busy_fraction", "slope_instance_queue_depth", "slope_instance_prediction_error",
                  "slope_instance_communication_share", "slope_instance_up"):
            check(g in fams and len(fams[g].samples) == 2, f"metrics: {g} for both instances")
        check("slope_tokens_per_second" in fams and fams["slope_tokens_per_second"].samples[0].value > 0,
              "metrics: tokens per second")
        pids = [p for i in hq2["instances"] for p in i["pids"]]
        # Resident memory: the front's own, and each instance's ranks' as they reported it after
        # their last pass, against what /proc says of the same processes now.
        def proc_rss(pid):
            with open(f"/proc/{pid}/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        front = sample(fams, "slope_front_resident_memory_bytes", "slope_front_resident_memory_bytes")
        check(0.5 < front / proc_rss(srv.proc.pid) < 2, f"metrics: the front's resident memory {front} is its VmRSS")
        for i, inst in enumerate(hq2["instances"]):
            got = sample(fams, "slope_instance_resident_memory_bytes", "slope_instance_resident_memory_bytes",
                         instance=str(i))
            want = sum(proc_rss(p) for p in inst["pids"])
            check(0.5 < got / want < 2, f"metrics: instance {i}'s resident memory {got} is its ranks' VmRSS {want}")
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM: slope serve exits 0 (got {code})")
    time.sleep(0.5)
    left = [p for p in pids if os.path.exists(f"/proc/{p}") and "zombie" not in open(f"/proc/{p}/status").read().lower()]
    check(not left, f"SIGTERM: no instance rank is left running ({left})")
    if failures:
        print(srv.stderr()[-4000:])


def test_fcfs_and_faults():
    srv = Server(SLOPE, MODEL, ["ring=2", "ring=1"], ["--scheduler", "fcfs", "--timeout", str(TIMEOUT_S)])
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
        # fcfs sends a prompt to the instance predicted to finish it first: longer ones to ring=2.
        meshes = [compare_with_run(srv, client, prompt(n, 6), f"fcfs server, {n} tokens") for n in (64, 257, 1000)]
        check(any(m.startswith("pp=1,ring=2") for m in meshes), f"fcfs served some prompts on ring=2 ({meshes})")

        # kill -9 one rank of ring=2 mid-request: rank 1 is stopped first, so that the request is
        # surely running on the mesh when the rank dies.
        _, _, h = srv.request("GET", "/health")
        victim = h["instances"][0]["pids"][1]
        os.kill(victim, signal.SIGSTOP)
        result = {}

        def stuck():
            t0 = time.time()
            result["r"] = srv.request("POST", "/v1/completions", body={"prompt": prompt(1000, 7)}, timeout=120)
            result["s"] = time.time() - t0

        for _ in range(5):  # fcfs routes by predicted finish: until one request lands on ring=2
            result.clear()
            t = threading.Thread(target=stuck)
            t.start()
            time.sleep(1.0)
            if "r" not in result:
                break
            t.join()
        check("r" not in result, "a request is held on the stopped mesh")
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        t.join(timeout=TIMEOUT_S + 30)
        status, _, j = result.get("r", (0, {}, {}))
        waited = time.time() - killed_at
        check(500 <= status < 600 and "error" in j and waited <= TIMEOUT_S + 5,
              f"the request in flight gets a 5xx within the timeout ({status} after {waited:.1f} s: {j})")
        # The other instance serves while ring=2 restarts; every request is answered.
        statuses, served_by = [], set()
        end = time.time() + 2
        while time.time() < end:
            s, _, j = srv.request("POST", "/v1/completions", body={"prompt": prompt(20, 8)}, timeout=30)
            statuses.append(s)
            if s == 200:
                served_by.add(j["slope"]["instance"])
        check(statuses and all(s in (200, 503) for s in statuses) and 1 in served_by,
              f"during the restart requests are answered (statuses {sorted(set(statuses))}), ring=1 serving")
        back = srv.wait_health(lambda x: x["instances"][0]["state"] == "ready" and x["instances"][0]["restarts"] == 1, 60)
        check(back is not None, "the killed instance comes back (ready, 1 restart)")
        if back:
            check(victim not in back["instances"][0]["pids"], "with new ranks")
        r = client.completions.create(model=srv.name, prompt=prompt(1000, 6), max_tokens=1)
        check(r.model_extra["slope"]["instance_mesh"].startswith("pp=1,ring=2"), "the restarted instance serves again")
        _, fams = metrics(srv)
        check(sample(fams, "slope_instance_restarts", "slope_instance_restarts", instance="0") == 1,
              "metrics: slope_instance_restarts counts the restart")

        # A rank that hangs without dying: its peer gives up after --timeout, the mesh reports
        # itself broken, and the request gets a 5xx within the timeout (plus the slack of the
        # poll loops); the instance is restarted again.
        _, _, h = srv.request("GET", "/health")
        hung = h["instances"][0]["pids"][1]
        os.kill(hung, signal.SIGSTOP)
        t0 = time.time()
        status, j = 200, {}
        for _ in range(5):  # until a request lands on ring=2
            status, _, j = srv.request("POST", "/v1/completions", body={"prompt": prompt(1000, 9)}, timeout=120)
            if status != 200:
                break
            t0 = time.time()
        waited = time.time() - t0
        check(500 <= status < 600 and waited <= TIMEOUT_S + 5,
              f"a hung rank: the request gets a 5xx within the timeout ({status} after {waited:.1f} s: {j})")
        back = srv.wait_health(lambda x: x["instances"][0]["state"] == "ready" and x["instances"][0]["restarts"] == 2, 60)
        check(back is not None, "the instance with the hung rank comes back (2 restarts)")
        if os.path.exists(f"/proc/{hung}"):
            os.kill(hung, signal.SIGKILL)
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM after the fault: exit 0 (got {code})")
    if failures:
        print(srv.stderr()[-4000:])


def test_text_and_drain():
    """Text prompts with the model's tokenizer.json (the llama fixture with the tiny Llama-3
    tokenizer, as the `slope run --prompt` tests use), then SIGTERM with a request in flight."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "tiny-llama")
        shutil.copytree(os.path.join(root, "reference", "fixtures", "llama", "model"), model)
        shutil.copy(os.path.join(root, "text", "tokenizers", "tiny_llama3", "tokenizer.json"), model)
        srv = Server(SLOPE, model, ["ring=2", "ring=1"], ["--timeout", str(TIMEOUT_S)])
        try:
            client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
            text = "The quick brown fox jumps over the lazy dog."
            r = client.completions.create(model=srv.name, prompt=text, max_tokens=1, logprobs=5)
            ext = r.model_extra["slope"]
            m = dict(kv.split("=") for kv in ext["instance_mesh"].split(","))
            out = subprocess.run(([] if m["ring"] == "1" else mpirun(2)) +
                                 [SLOPE, "run", "--model", model, "--prompt", text, "--dtype", "f32", "--threads", "1",
                                  "--top-k", "5", "--json", "--quiet", "--ring", m["ring"]],
                                 capture_output=True, text=True, timeout=300)
            j = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
            check(j and r.usage.prompt_tokens == j["num_tokens"] and ext["first_token"] == j["first_token"] and
                  r.choices[0].text == j.get("first_token_text") and
                  all(abs(a[1] - b["logprob"]) <= 1e-5 and a[0] == b["token"] for a, b in zip(ext["top_logprobs"], j["top_logprobs"])),
                  f"a text prompt: {r.usage.prompt_tokens} tokens, first token {ext['first_token']} "
                  f"({r.choices[0].text!r}) as slope run --prompt gives ({j.get('first_token')}, {j.get('first_token_text')!r})")
            top = r.choices[0].logprobs.top_logprobs[0]
            check(len(top) >= 1 and r.choices[0].text in top, "logprobs are keyed by the tokens' text")

            # SIGTERM drains: a request held in flight (its instance stopped) still completes.
            _, _, h = srv.request("GET", "/health")
            pids = [p for i in h["instances"] for p in i["pids"]]
            for p in pids:
                os.kill(p, signal.SIGSTOP)
            result = {}
            t = threading.Thread(target=lambda: result.update(r=srv.request("POST", "/v1/completions",
                                                                           body={"prompt": [1, 2, 3]}, timeout=60)))
            t.start()
            time.sleep(0.5)
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            status, _, j = srv.request("POST", "/v1/completions", body={"prompt": [1, 2]})
            check(status == 503 and j["error"]["code"] == "draining", f"while draining a new request gets 503 ({status})")
            check(srv.proc.poll() is None and "r" not in result, "the server waits for the request in flight")
            for p in pids:
                os.kill(p, signal.SIGCONT)
            t.join(timeout=30)
            check(result.get("r", (0,))[0] == 200, "the request in flight completes (200) after SIGTERM")
        finally:
            code = srv.stop()
        check(code == 0, f"SIGTERM with a request in flight: exit 0 after draining (got {code})")
        if failures:
            print(srv.stderr()[-4000:])


def test_bf16_units():
    """--bf16-units reaches the instances: a bf16 server asked for the units `auto` would not
    choose here (where this CPU can run both) serves `slope run`'s logits on those units, which
    differ from auto's."""
    ids = prompt(37, 11)
    mesh = "pp=1,ring=1,ulysses=1,tp=1"
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "tokens.txt")
        with open(tok, "w") as f:
            f.write(" ".join(map(str, ids)))
        out = subprocess.run([SLOPE, "run", "--model", MODEL, "--tokens", tok, "--dtype", "bf16", "--json", "--quiet"],
                             capture_output=True, text=True, timeout=300)
        auto = json.loads(out.stdout.strip().splitlines()[-1])["bf16_units"] if out.returncode == 0 else None
        both = subprocess.run([SLOPE, "run", "--model", MODEL, "--tokens", tok, "--dtype", "bf16", "--bf16-units",
                               "bf16", "--quiet"], capture_output=True, text=True, timeout=300).returncode == 0
    if not check(auto in ("bf16", "f32"), f"slope run reports the bf16 units auto chose ({auto})"):
        return
    units = {"bf16": "f32", "f32": "bf16"}[auto] if both else "f32"
    srv = Server(SLOPE, MODEL, ["ring=1"], ["--bf16-units", units], dtype="bf16")
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model=srv.name, prompt=ids, max_tokens=1, logprobs=5,
                                      extra_body={"return_logits": True})
        served = r.model_extra["slope"]["logits"]
        _, _, h = srv.request("GET", "/health")
        check([i["bf16_units"] for i in h["instances"]] == [units], f"/health: the instance runs the {units} units ({h})")
        _, _, asked = slope_run(ids, mesh, ("--dtype", "bf16", "--bf16-units", units))
        err = rel_err(served, asked) if len(served) == len(asked) else float("inf")
        check(err <= 1e-5, f"a bf16 server on the {units} units serves slope run's logits on them (rel err {err:.2e})")
        if units != auto:
            _, _, chosen = slope_run(ids, mesh, ("--dtype", "bf16"))
            err = rel_err(served, chosen) if len(served) == len(chosen) else 0.0
            check(err > 1e-5, f"... which differ from auto's {auto} units (rel err {err:.2e})")
        else:
            print("note: only the f32 units run on this CPU; the flag is passed but cannot be told apart")
    finally:
        code = srv.stop()
    check(code == 0, f"the bf16 server exits 0 on SIGTERM (got {code})")
    if failures:
        print(srv.stderr()[-4000:])

    # auto is decided once, by the server, which sizes admission for it: its instances are told
    # the units it chose (not auto, which each would probe again) and run them.
    srv = Server(SLOPE, MODEL, ["ring=2"], [], dtype="bf16")
    try:
        _, _, h = srv.request("GET", "/health")
        inst = h["instances"][0]
        check(inst["bf16_units"] == auto, f"/health: an auto server's instance runs auto's {auto} units ({inst})")
        argvs = [open(f"/proc/{p}/cmdline", "rb").read().split(b"\0") for p in inst["pids"]]
        told = [a[a.index(b"--bf16-units") + 1].decode() if b"--bf16-units" in a else None for a in argvs]
        check(len(told) == 2 and told == [auto, auto], f"... and both ranks were started with --bf16-units {auto} ({told})")
    finally:
        code = srv.stop()
    check(code == 0, f"the auto server exits 0 on SIGTERM (got {code})")
    if failures:
        print(srv.stderr()[-4000:])


test_main_server()
test_fcfs_and_faults()
test_text_and_drain()
test_bf16_units()
print("PASS" if not failures else f"FAIL: {len(failures)} check(s)")
sys.exit(1 if failures else 0)
