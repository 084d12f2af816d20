#!/usr/bin/env bash
# The serving demo: starts `slope serve` on a small default model (the tiny Llama fixture with
# the tiny Llama-3 tokenizer, two instances: ring=2 and ring=1), sends a few requests with the
# official `openai` Python client (token ids, text, logprobs, /v1/prefill with a KV handle, a
# refused request), prints the responses and the server's metrics, then stops it with SIGTERM.
#
#   scripts/serve_demo.sh [MODEL_DIR]        (default: a copy of the tiny Llama fixture)
#
# Needs build/release/slope (cmake --preset release && cmake --build --preset release --target
# slope) and the client venv (scripts/serve-venv.sh makes it on first use, from PyPI).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
slope="${SLOPE_BINARY:-$root/build/release/slope}"
[ -x "$slope" ] || { echo "serve_demo.sh: $slope not found; build it first (cmake --build --preset release --target slope)" >&2; exit 1; }
# The openai client from PyPI (scripts/serve-venv.sh). Where PyPI cannot be reached the demo
# still runs, with the same requests sent by Python's urllib, and says so.
if ! py="$(bash "$root/scripts/serve-venv.sh")"; then
  py=python3
  echo "serve_demo.sh: the openai client could not be installed from PyPI; sending the same requests with Python's urllib"
fi
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then kill -TERM "$server_pid"; wait "$server_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
model="${1:-}"
if [ -z "$model" ]; then
  model="$work/tiny-llama"
  cp -r "$root/tests/reference/fixtures/llama/model" "$model"
  cp "$root/tests/text/tokenizers/tiny_llama3/tokenizer.json" "$model/"
fi
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$slope" serve --model "$model" --served-model-name demo --instance "ring=2" --instance "ring=1" --port 0 \
  --threads-per-rank 1 --slo-ms 2000 > "$work/stdout" 2> "$work/stderr" &
server_pid=$!
for _ in $(seq 1 600); do
  grep -q "listening on" "$work/stdout" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "serve_demo.sh: slope serve did not start" >&2; exit 1; }
  sleep 0.1
done
url="$(grep -o 'http://[^ ]*' "$work/stdout")"
echo "== $(cat "$work/stdout")"
"$py" - "$url" <<'PY'
import json, sys, urllib.error, urllib.request
url = sys.argv[1]
try:
    import openai
except ImportError:
    openai = None

def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req))
    except urllib.error.HTTPError as e:
        return {"status": e.code, **json.load(e)}

def show(title, ext, text, finish, prompt_tokens):
    print(f"== {title}\n   first token {ext['first_token']} {text!r}, finish_reason {finish}, "
          f"{prompt_tokens} prompt tokens, TTFT {ext['ttft_ms']:.1f} ms (predicted {ext['predicted_ttft_ms']:.1f}, "
          f"queued {ext['queue_ms']:.2f}) on instance {ext['instance']} ({ext['instance_mesh']})")

text_prompt = "The quick brown fox jumps over the lazy dog."
if openai:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    print("== models (openai client):", [m.id for m in client.models.list().data])
    r = client.completions.create(model="demo", prompt=list(range(1, 200)), max_tokens=1)
    show("completion, token ids", r.model_extra["slope"], r.choices[0].text, r.choices[0].finish_reason, r.usage.prompt_tokens)
    r = client.completions.create(model="demo", prompt=text_prompt, max_tokens=1, logprobs=3)
    show("completion, text, logprobs=3", r.model_extra["slope"], r.choices[0].text, r.choices[0].finish_reason,
         r.usage.prompt_tokens)
    print("   top logprobs:", r.choices[0].logprobs.top_logprobs[0])
else:
    print("== models (urllib):", [m["id"] for m in json.load(urllib.request.urlopen(url + "/v1/models"))["data"]])
    for title, body in [("completion, token ids", {"model": "demo", "prompt": list(range(1, 200)), "max_tokens": 1}),
                        ("completion, text, logprobs=3", {"model": "demo", "prompt": text_prompt, "max_tokens": 1, "logprobs": 3})]:
        r = post("/v1/completions", body)
        c = r["choices"][0]
        show(title, r["slope"], c["text"], c["finish_reason"], r["usage"]["prompt_tokens"])
        if c.get("logprobs"):
            print("   top logprobs:", c["logprobs"]["top_logprobs"][0])
req = urllib.request.Request(url + "/v1/prefill", data=json.dumps({"prompt": list(range(5, 300)), "kv_lease_s": 30}).encode(),
                             headers={"Content-Type": "application/json"})
p = json.load(urllib.request.urlopen(req))
print(f"== /v1/prefill: first token {p['first_token']}, KV handle {p['kv']['id']} on instance {p['kv']['instance']}, "
      f"{p['kv']['bytes']} bytes over {len(p['kv']['ranks'])} rank(s), lease until {p['kv']['lease_expires_at']:.0f}")
urllib.request.urlopen(urllib.request.Request(url + "/v1/kv/" + p["kv"]["id"], method="DELETE"))
print("== DELETE /v1/kv/" + p["kv"]["id"] + ": released")
if openai:
    try:
        client.completions.create(model="demo", prompt=[], max_tokens=1)
    except openai.BadRequestError as e:
        print(f"== an empty prompt: {e.status_code} {e.body['message']!r}")
else:
    r = post("/v1/completions", {"model": "demo", "prompt": [], "max_tokens": 1})
    print(f"== an empty prompt: {r.get('status')} {r['error']['message']!r}")
print("== /metrics (excerpt):")
for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
    if not line.startswith("#") and ("_bucket" not in line):
        print("  ", line)
PY
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "== slope serve stopped (SIGTERM: drained, instances shut down)"
