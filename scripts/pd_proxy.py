#!/usr/bin/env python3
"""Prefill on SLOPE, decode on vLLM: the proxy of vLLM's disaggregated request flow.

  POST /v1/completions  (OpenAI's body, as a client sends it to vLLM)
    1. POST {prefill}/v1/prefill {"prompt": ..., "kv_lease_s": ...}: SLOPE prefills the prompt and
       answers its first token and the KV handle `kv` (each rank keeps its shard under a lease);
    2. POST {decode}/v1/completions with the client's body plus
       "kv_transfer_params": {"slope_kv": kv, "slope_first_token": first_token}: vLLM, started
       with SlopeConnector (python/slope_client/vllm_connector.py), loads SLOPE's KV for all but
       the prompt's last token, recomputes that one and decodes on;
    3. answers vLLM's response (streamed through when the client asked for `stream`), then
       releases the KV (DELETE {prefill}/v1/kv/{id}; the connector's pull has normally acked it).
  GET /health, GET /v1/models: the decode side's.

Prompts should be token ids: SLOPE and vLLM each tokenize text with their own tokenizer, and the
connector refuses KV whose tokens differ from vLLM's prompt (tokens_hash).

  scripts/pd_proxy.py --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 [--port 8192]
      [--prefill-api-key KEY] [--decode-api-key KEY] [--kv-lease-s S]

Standard library only. Errors are OpenAI-style bodies naming the side that failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TIMEOUT_S = 600


class Upstream:
    """One HTTP endpoint (SLOPE's front or vLLM's server) and its API key."""

    def __init__(self, name: str, url: str, api_key: str | None):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"--{name} must be an http://HOST:PORT URL, not {url!r}")
        self.name, self.host, self.port, self.api_key = name, u.hostname, u.port or 80, api_key
        self.base = u.path.rstrip("/")

    def request(self, method: str, path: str, body: dict | None = None) -> http.client.HTTPResponse:
        """Sends the request and returns the response with its body unread (the caller reads it)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn.request(method, self.base + path, None if body is None else json.dumps(body), headers)
            return conn.getresponse()
        except OSError as e:
            conn.close()
            raise UpstreamError(502, f"the {self.name} server at {self.host}:{self.port} cannot be reached "
                                     f"({e}); is it running?") from e


class UpstreamError(Exception):
    def __init__(self, status: int, message: str, body: bytes | None = None):
        super().__init__(message)
        self.status, self.message, self.body = status, message, body


def error_body(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "proxy_error", "param": None, "code": code}}).encode()


def make_handler(prefill: Upstream, decode: Upstream, kv_lease_s: float | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request on stderr
            sys.stderr.write("pd_proxy: " + (fmt % a) + "\n")

        def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path not in ("/health", "/v1/models"):
                return self.reply(404, error_body(f"no route GET {self.path}; the proxy serves POST /v1/completions, "
                                                  "GET /health and GET /v1/models", "not_found"))
            try:
                r = decode.request("GET", self.path)
                self.reply(r.status, r.read(), r.getheader("Content-Type", "application/json"))
            except UpstreamError as e:
                self.reply(e.status, error_body(e.message, "upstream_unreachable"))

        def do_POST(self):
            if self.path != "/v1/completions":
                return self.reply(404, error_body(f"no route POST {self.path}; the proxy serves POST "
                                                  "/v1/completions", "not_found"))
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")
            except (ValueError, UnicodeDecodeError) as e:
                return self.reply(400, error_body(f"the body is not JSON: {e}", "invalid_json"))
            if not isinstance(body, dict) or "prompt" not in body:
                return self.reply(400, error_body("the body must be a JSON object with a prompt", "missing_field"))
            try:
                self.disaggregated(body)
            except UpstreamError as e:
                self.reply(e.status, e.body if e.body is not None else error_body(e.message, "upstream_error"))

        def disaggregated(self, body: dict) -> None:
            # 1. Prefill on SLOPE.
            req = {"prompt": body["prompt"]}
            if kv_lease_s is not None:
                req["kv_lease_s"] = kv_lease_s
            r = prefill.request("POST", "/v1/prefill", req)
            raw = r.read()
            if r.status != 200:
                raise UpstreamError(r.status, "SLOPE's /v1/prefill failed", body=annotate(raw, "SLOPE prefill"))
            try:
                pre = json.loads(raw)
                kv, first = pre["kv"], pre.get("first_token")
            except (ValueError, KeyError, TypeError) as e:
                raise UpstreamError(502, f"SLOPE's /v1/prefill answered no KV handle ({e}): {raw[:200]!r}") from e
            # 2. Decode on vLLM from SLOPE's KV.
            params = dict(body.get("kv_transfer_params") or {})
            params.update({"slope_kv": kv, "slope_first_token": first})
            dec = dict(body, kv_transfer_params=params)
            try:
                r = decode.request("POST", "/v1/completions", dec)
                if r.status != 200 or not body.get("stream"):
                    out = r.read()
                    self.reply(r.status, out if r.status == 200 else annotate(out, "vLLM decode"),
                               r.getheader("Content-Type", "application/json"))
                else:  # 3. server-sent events, passed through as they come; the close ends them
                    self.send_response(200)
                    self.send_header("Content-Type", r.getheader("Content-Type", "text/event-stream"))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    while chunk := r.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
            finally:
                if isinstance(kv, dict) and isinstance(kv.get("id"), str):
                    try:  # the pull's ack normally released it already: 404 is fine
                        prefill.request("DELETE", "/v1/kv/" + urllib.parse.quote(kv["id"], safe="")).read()
                    except UpstreamError:
                        pass

    return Handler


def annotate(raw: bytes, side: str) -> bytes:
    """An upstream's error body with the side that produced it in front of its message."""
    try:
        j = json.loads(raw)
        j["error"]["message"] = f"{side}: {j['error']['message']}"
        return json.dumps(j).encode()
    except (ValueError, KeyError, TypeError):
        return error_body(f"{side}: {raw[:500].decode('utf-8', 'replace')}", "upstream_error")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", required=True, help="SLOPE's server (slope serve), http://HOST:PORT")
    ap.add_argument("--decode", required=True, help="vLLM's server (vllm serve with SlopeConnector), http://HOST:PORT")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8192)
    ap.add_argument("--prefill-api-key")
    ap.add_argument("--decode-api-key")
    ap.add_argument("--kv-lease-s", type=float, help="the KV lease asked of SLOPE (default: its --kv-lease-s)")
    a = ap.parse_args()
    try:
        prefill = Upstream("prefill", a.prefill, a.prefill_api_key)
        decode = Upstream("decode", a.decode, a.decode_api_key)
    except ValueError as e:
        print(f"pd_proxy: {e}", file=sys.stderr)
        return 2
    server = ThreadingHTTPServer((a.host, a.port), make_handler(prefill, decode, a.kv_lease_s))
    print(f"pd_proxy: listening on http://{a.host}:{server.server_address[1]} (prefill {a.prefill}, "
          f"decode {a.decode})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
