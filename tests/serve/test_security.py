#!/usr/bin/env python3
"""`slope serve`'s security, over real HTTP and the ranks' KV transfer service.

usage: test_security.py SLOPE_BINARY MODEL_DIR PYTHON_DIR

One server (instance ring=2, two clients' keys: one by --api-key, one from --api-key-file,
--http-threads 4, --http-read-timeout-s 2, small size limits) and checks:
  - every endpoint, and an unknown path, answers 401 without a key, with a wrong one, with the
    key as a prefix or with a character more, and with another scheme; each key is taken;
  - a KV lease is its key's: the other key's DELETE and push get the 404 an unknown id gets
    (the same body, but for the id), its pull at the ranks is refused as unknown; the owner's
    pull and DELETE work;
  - a lease of 1 s: a pull after it fails naming the expiry, and DELETE answers 404;
  - size limits, each a 4xx naming the limit and its flag: body (413, --max-body-bytes),
    header (431, --max-header-bytes), text prompt bytes (--max-prompt-bytes), token ids over
    the memory limit, JSON nested 17 deep, push targets beyond the instance's ranks;
  - no path from a request: a model name, a KV id and a push target that spell file paths are
    refused or unknown;
  - slow clients: 12 connections (3x --http-threads) dribbling their header a byte every
    0.5 s, then 12 dribbling a small body: a normal request is served within 1.5 s meanwhile
    (they wait in the gate, off the workers), and each slow one gets 408 within the read
    timeout; then 12 dribbling a 40 kB body (read on a worker): each is cut at the read
    timeout, so the normal request waits at most 12 / 4 read timeouts;
  - a second server with --kv-push-allow 10.0.0.0/8: a push to 127.0.0.1 gets 403, the rank
    never dials it, and the KV can still be pulled.
Exit code 0 only if every check passed.
"""
import os
import socket
import sys
import tempfile
import threading
import time

SLOPE, MODEL, PYDIR = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import slope_client  # noqa: E402
from slope_client.transfer import KvTransferError  # noqa: E402
from serve_util import Server, cleanup  # noqa: E402

ALICE, BOB = "alice-key-0123456789", "bob-key-9876543210"
A = {"Authorization": "Bearer " + ALICE}
B = {"Authorization": "Bearer " + BOB}
THREADS, READ_TIMEOUT_S = 4, 2
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def pull_refused(kv, key, needle, what):
    try:
        slope_client.pull(kv, api_key=key, timeout=20)
    except KvTransferError as e:
        return check(needle in str(e), f"{what}: refused ({e})")
    return check(False, f"{what}: the pull was not refused")


def prefill(srv, headers, **extra):
    body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "best_effort": True}
    body.update(extra)
    status, _, r = srv.request("POST", "/v1/prefill", body, headers=headers, timeout=120)
    if status != 200:
        raise RuntimeError(f"/v1/prefill: {status} {r}")
    return r["kv"]


def error_of(j):
    return j.get("error", {}) if isinstance(j, dict) else {}


def test_keys(srv):
    endpoints = [("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/v1/models", None),
                 ("POST", "/v1/completions", {"prompt": [1]}), ("POST", "/v1/prefill", {"prompt": [1]}),
                 ("DELETE", "/v1/kv/kv-1-00", None), ("POST", "/v1/kv/kv-1-00/push", {"targets": []}),
                 ("GET", "/no/such/path", None), ("POST", "/v1/no-such", {})]
    wrong = {"none": {}, "wrong key": {"Authorization": "Bearer nope"},
             "the key as a prefix": {"Authorization": "Bearer " + ALICE[:-1]},
             "the key and a character more": {"Authorization": "Bearer " + ALICE + "x"},
             "another scheme": {"Authorization": "Basic " + ALICE}, "the key without a scheme": {"Authorization": ALICE}}
    for method, path, body in endpoints:
        bad = []
        for what, headers in wrong.items():
            status, _, j = srv.request(method, path, body, headers=headers)
            if status != 401 or error_of(j).get("code") != "invalid_api_key":
                bad.append(f"{what}: {status}")
        check(not bad, f"{method} {path} needs a key: 401 for {', '.join(wrong)} {bad}")
        for name, headers in (("alice", A), ("bob", B)):
            status, _, j = srv.request(method, path, body, headers=headers)
            check(status != 401, f"{method} {path} with {name}'s key: {status}, not 401")


def test_ownership(srv):
    kv = prefill(srv, A)
    unknown_status, _, unknown = srv.request("DELETE", "/v1/kv/kv-999-0123456789abcdef0123456789abcdef", headers=B)
    status, _, j = srv.request("DELETE", f"/v1/kv/{kv['id']}", headers=B)
    same = error_of(j).get("message", "").replace(kv["id"], "ID") == error_of(unknown).get("message", "").replace(
        "kv-999-0123456789abcdef0123456789abcdef", "ID")
    check(status == 404 == unknown_status and error_of(j).get("code") == "kv_not_found" and same,
          f"bob's DELETE of alice's lease: {status} as for an unknown id ({error_of(j).get('message')})")
    targets = [{"rank": r["rank"], "endpoint": "127.0.0.1:9"} for r in kv["ranks"]]
    status, _, j = srv.request("POST", f"/v1/kv/{kv['id']}/push", {"targets": targets}, headers=B)
    check(status == 404 and error_of(j).get("code") == "kv_not_found", f"bob's push of alice's lease: {status}")
    pull_refused(kv, BOB, "keeps no KV", "bob's pull of alice's KV at the ranks")
    pull_refused(kv, "carol-key", "the API key is wrong", "a pull with no server key at the ranks")
    cache = slope_client.pull(kv, api_key=ALICE, timeout=60)
    check(cache.num_tokens == 8, f"alice pulls her own KV after bob's tries ({cache.num_tokens} tokens)")
    kv2 = prefill(srv, A)
    status, _, _ = srv.request("DELETE", f"/v1/kv/{kv2['id']}", headers=B)
    status2, _, j = srv.request("DELETE", f"/v1/kv/{kv2['id']}", headers=A)
    check(status == 404 and status2 == 200 and j.get("deleted") is True, f"alice's DELETE works ({status}, {status2})")
    kv3 = prefill(srv, B)
    pull_refused(kv3, ALICE, "keeps no KV", "alice's pull of bob's KV at the ranks")
    status, _, _ = srv.request("DELETE", f"/v1/kv/{kv3['id']}", headers=B)
    check(status == 200, "bob deletes his own lease")


def test_expiry(srv):
    kv = prefill(srv, A, kv_lease_s=1)
    check(len(kv["id"]) >= 32 + 5, f"a KV id carries 128 random bits ({kv['id']})")
    time.sleep(2.5)
    pull_refused(kv, ALICE, "lease expired", "a pull after the 1 s lease")
    status, _, j = srv.request("DELETE", f"/v1/kv/{kv['id']}", headers=A)
    check(status == 404, f"DELETE after the lease: {status}")


def test_limits(srv):
    cases = [
        ("a body over --max-body-bytes", "POST", "/v1/completions", b'{"prompt": [' + b"1," * 60000 + b"1]}", {},
         413, "--max-body-bytes"),
        ("a text prompt over --max-prompt-bytes", "POST", "/v1/completions", b'{"prompt": "' + b"a" * 2000 + b'"}', {},
         400, "--max-prompt-bytes"),
        ("token ids over what the instance holds", "POST", "/v1/completions",
         b'{"prompt": [' + b"1," * 20000 + b"1]}", {}, 400, "tokens, more than"),
        ("JSON nested 17 deep", "POST", "/v1/prefill", b'{"prompt": ' + b"[" * 17 + b"]" * 17 + b"}", {}, 400,
         "more than 16 levels"),
        ("a header over --max-header-bytes", "GET", "/health", None, {"X-Pad": "p" * 5000}, 431, "--max-header-bytes"),
    ]
    for what, method, path, raw, headers, want, words in cases:
        try:
            status, _, j = srv.request(method, path, raw=raw, headers={**A, "Content-Type": "application/json", **headers})
        except OSError as e:
            check(False, f"{what}: the connection failed ({e})")
            continue
        msg = error_of(j).get("message", str(j))
        check(status == want and words in msg, f"{what}: {status} (want {want}) {msg!r}")
    kv = prefill(srv, A)
    targets = [{"rank": r, "endpoint": "127.0.0.1:9"} for r in range(3)]
    status, _, j = srv.request("POST", f"/v1/kv/{kv['id']}/push", {"targets": targets}, headers=A)
    check(status == 400 and "not a rank" in error_of(j).get("message", ""), f"3 push targets for 2 ranks: {status}")
    # No path from a request.
    status, _, j = srv.request("POST", "/v1/completions", {"prompt": [1], "model": "../../../etc/passwd"}, headers=A)
    check(status == 404 and error_of(j).get("code") == "model_not_found", f"a model named as a path: {status}")
    for bad in ("/etc/passwd", "file:///etc/passwd", "../x:1"):
        status, _, j = srv.request("POST", f"/v1/kv/{kv['id']}/push", {"targets": [{"rank": 0, "endpoint": bad}]}, headers=A)
        check(status in (400, 502) and "etc/passwd" not in str(j).replace(bad, ""), f"push target {bad!r}: {status}")
    status, _, _ = srv.request("DELETE", "/v1/kv/..%2F..%2Fetc%2Fpasswd", headers=A)
    check(status == 404, f"a KV id spelling a path: {status}")
    srv.request("DELETE", f"/v1/kv/{kv['id']}", headers=A)


def slow_client(port, head, data, results, i, step_s=0.5):
    """Sends `head` at once, then `data` a byte every step_s, until the server answers or closes;
    records (the answer's status line, or how it ended, and the seconds it took)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(head)
    t0 = time.time()
    outcome = None
    try:
        for b in data:
            s.sendall(bytes([b]))
            time.sleep(step_s)
            s.setblocking(False)
            try:
                reply = s.recv(4096)
                outcome = reply.split(b"\r\n", 1)[0].decode(errors="replace") if reply else "closed"
            except BlockingIOError:
                pass
            s.setblocking(True)
            if outcome:
                break
    except OSError as e:
        outcome = f"cut ({type(e).__name__})"
    results[i] = (outcome or "sent everything", time.time() - t0)
    s.close()


def test_expect_continue(srv):
    """A client that waits for "100 Continue" before its body (curl does, for bodies over 1 KiB)
    must get it at once: the gate does not wait for a body the client holds back."""
    body = b'{"prompt": [' + b"1," * 700 + b'1]}'
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode() +
              b"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n")
    t0 = time.time()
    first = s.recv(4096)
    took = time.time() - t0
    s.sendall(body)
    rest = b""
    while b"\r\n\r\n" not in rest:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    s.close()
    check(first.startswith(b"HTTP/1.1 100") and took < 0.5 and rest.startswith(b"HTTP/1.1 200"),
          f"Expect: 100-continue answered in {took:.2f} s ({first[:20]!r}), then {rest[:15]!r}")


def test_slow_clients(srv):
    auth = b"Authorization: Bearer " + ALICE.encode() + b"\r\n"
    header = b"GET /health HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Slow: " + b"s" * 40 + b"\r\n\r\n"
    small = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 40\r\n\r\n"
    large = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 40000\r\n\r\n"
    n = 3 * THREADS
    # (what, sent at once, dribbled, the longest a normal request may wait, the status of the slow ones)
    for what, head, data, wait_s, status in (
            ("their header", b"", header, 1.5, "HTTP/1.1 408"),
            ("a small body", small, b" " * 40, 1.5, "HTTP/1.1 408"),
            # A body over the gate's 32 KiB is read on a worker: each slow one holds one for at most
            # the read timeout, so the normal request waits at most n / threads of them.
            ("a 40 kB body", large, b" " * 100, n / THREADS * (READ_TIMEOUT_S + 0.5) + 1, "closed")):
        results = [None] * n
        threads = [threading.Thread(target=slow_client, args=(srv.port, head, data, results, i)) for i in range(n)]
        for t in threads:
            t.start()
        time.sleep(0.7)  # every slow connection open, each sending
        t0 = time.time()
        try:
            got, _, _ = srv.request("GET", "/health", headers=A, timeout=30)
        except OSError as e:
            got = f"failed ({e})"
        took = time.time() - t0
        check(got == 200 and took < wait_s,
              f"{n} clients dribbling {what} ({THREADS} HTTP threads): a normal request served in {took:.2f} s "
              f"(at most {wait_s:.1f}; {got})")
        for t in threads:
            t.join(timeout=60)
        ended = [r for r in results if r is not None]
        longest = max((r[1] for r in ended), default=0)
        limit = READ_TIMEOUT_S + 1 if status != "closed" else n / THREADS * (READ_TIMEOUT_S + 0.5) + 1
        check(len(ended) == n and all(r[0].startswith(status) for r in ended) and longest < limit,
              f"each client dribbling {what} got {status!r} within {limit:.1f} s: {sorted(set(r[0] for r in ended))}, "
              f"longest {longest:.1f} s")


def test_push_allow():
    """--kv-push-allow: a push to a host outside the list gets 403, and no rank dials it."""
    srv = Server(SLOPE, MODEL, ["ring=1"], ["--kv-push-allow", "10.0.0.0/8,decode.example"])
    receiver = socket.socket()
    receiver.bind(("127.0.0.1", 0))
    receiver.listen(4)
    receiver.settimeout(0.5)
    try:
        kv = prefill(srv, {})
        target = f"127.0.0.1:{receiver.getsockname()[1]}"
        status, _, j = srv.request("POST", f"/v1/kv/{kv['id']}/push", {"targets": [{"rank": 0, "endpoint": target}]})
        msg = error_of(j).get("message", "")
        check(status == 403 and error_of(j).get("code") == "push_not_allowed" and "--kv-push-allow" in msg,
              f"a push to {target} outside --kv-push-allow: {status} {msg!r}")
        try:
            receiver.accept()
            check(False, "the rank dialed a target outside --kv-push-allow")
        except socket.timeout:
            check(True, "the rank did not dial the target")
        cache = slope_client.pull(kv, timeout=60)
        check(cache.num_tokens == 8, "the refused push left the KV for a pull")
        check(srv.stop() == 0, "the second server exits 0")
    finally:
        receiver.close()
        if srv.proc.poll() is None:
            srv.proc.kill()


def main():
    keyfile = tempfile.NamedTemporaryFile("w", prefix="slope-keys-", delete=False)
    keyfile.write(f"# clients' keys\n\n  {BOB}  \n")
    keyfile.close()
    srv = Server(SLOPE, MODEL, ["ring=2"],
                 ["--api-key", ALICE, "--api-key-file", keyfile.name, "--http-threads", str(THREADS),
                  "--http-read-timeout-s", str(READ_TIMEOUT_S), "--max-body-bytes", "100000", "--max-header-bytes", "4096",
                  "--max-prompt-bytes", "1000", "--kv-lease-s", "30"])
    try:
        for test in (test_keys, test_ownership, test_expiry, test_limits, test_expect_continue, test_slow_clients):
            try:
                test(srv)
            except Exception as e:  # noqa: BLE001 (the next test still runs)
                check(False, f"{test.__name__} raised {type(e).__name__}: {e}")
        status, _, h = srv.request("GET", "/health", headers=A)
        check(status == 200 and h.get("status") == "ok", "the server is healthy at the end")
        check(srv.stop() == 0, "SIGTERM: exit 0")
        try:
            test_push_allow()
        except Exception as e:  # noqa: BLE001
            check(False, f"test_push_allow raised {type(e).__name__}: {e}")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        cleanup(keyfile.name)
    if failures:
        print(f"\n{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        print("--- server stderr ---\n" + srv.stderr()[-4000:])
        return 1
    print("\nall security checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
