#!/usr/bin/env python3
"""A stand-in for `slope serve` to test scripts/bench_serve.py against (stdlib only).

POST /v1/completions sleeps base_ms + per_token_ms * len(prompt) and answers a completion
object with SLOPE's extension field (slope.predicted_ttft_ms = the sleep, slope.ttft_ms,
slope.queue_ms = 0). Above --max-concurrency requests in flight it answers 429 with
Retry-After; every --fail-every-th request gets a 500. It prints `port N` on stdout once it
listens (port 0: any free port) and counts what it answered in `stats` at GET /stats.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--base-ms", type=float, default=5)
    ap.add_argument("--per-token-ms", type=float, default=0.01)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--fail-every", type=int, default=0, help="every Nth request gets a 500 (0: none)")
    args = ap.parse_args()

    lock = threading.Lock()
    state = {"in_flight": 0, "seen": 0, "ok": 0, "rejected": 0, "errors": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, code, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/stats":
                with lock:
                    self.reply(200, dict(state))
            else:
                self.reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/completions":
                self.reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                return
            try:
                req = json.loads(body)
                prompt = req["prompt"]
                assert isinstance(prompt, list) and prompt and req.get("max_tokens") == 1
                assert isinstance(req.get("ttft_slo_ms"), (int, float))
            except (ValueError, KeyError, AssertionError):
                self.reply(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
                return
            with lock:
                state["seen"] += 1
                n = state["seen"]
                if args.fail_every and n % args.fail_every == 0:
                    state["errors"] += 1
                    fail = True
                else:
                    fail = False
                    busy = state["in_flight"] >= args.max_concurrency
                    if busy:
                        state["rejected"] += 1
                    else:
                        state["in_flight"] += 1
            if fail:
                self.reply(500, {"error": {"message": "injected failure", "type": "server_error"}})
                return
            if busy:
                self.reply(429, {"error": {"message": "deadline: busy", "type": "rate_limit_error"}},
                           [("Retry-After", "1")])
                return
            sleep_ms = args.base_ms + args.per_token_ms * len(prompt)
            t0 = time.perf_counter()
            time.sleep(sleep_ms / 1e3)
            took = (time.perf_counter() - t0) * 1e3
            with lock:
                state["in_flight"] -= 1
                state["ok"] += 1
            self.reply(200, {
                "id": f"cmpl-{n}", "object": "text_completion", "created": int(time.time()), "model": req.get("model"),
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1},
                "slope": {"predicted_ttft_ms": sleep_ms, "ttft_ms": took, "queue_ms": 0.0},
            })

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
