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
py="$(bash "$root/scripts/serve-venv.sh")"
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
import json, sys, urllib.request
import openai
url = sys.argv[1]
client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
print("== models:", [m.id for m in client.models.list().data])
def show(title, r):
    ext = r.model_extra["slope"]
    print(f"== {title}\n   first token {ext['first_token']} {r.choices[0].text!r}, finish_reason {r.choices[0].finish_reason}, "
          f"{r.usage.prompt_tokens} prompt tokens, TTFT {ext['ttft_ms']:.1f} ms (predicted {ext['predicted_ttft_ms']:.1f}, "
          f"queued {ext['queue_ms']:.2f}) on instance {ext['instance']} ({ext['instance_mesh']})")
show("completion, token ids", client.completions.create(model="demo", prompt=list(range(1, 200)), max_tokens=1))
r = client.completions.create(model="demo", prompt="The quick brown fox jumps over the lazy dog.", max_tokens=1, logprobs=3)
show("completion, text, logprobs=3", r)
print("   top logprobs:", r.choices[0].logprobs.top_logprobs[0])
req = urllib.request.Request(url + "/v1/prefill", data=json.dumps({"prompt": list(range(5, 300)), "kv_lease_s": 30}).encode(),
                             headers={"Content-Type": "application/json"})
p = json.load(urllib.request.urlopen(req))
print(f"== /v1/prefill: first token {p['first_token']}, KV handle {p['kv']['id']} on instance {p['kv']['instance']}, "
      f"{p['kv']['bytes']} bytes over {len(p['kv']['ranks'])} rank(s), lease until {p['kv']['lease_expires_at']:.0f}")
urllib.request.urlopen(urllib.request.Request(url + "/v1/kv/" + p["kv"]["id"], method="DELETE"))
print("== DELETE /v1/kv/" + p["kv"]["id"] + ": released")
try:
    client.completions.create(model="demo", prompt=[], max_tokens=1)
except openai.BadRequestError as e:
    print(f"== an empty prompt: {e.status_code} {e.body['message']!r}")
print("== /metrics (excerpt):")
for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
    if not line.startswith("#") and ("_bucket" not in line):
        print("  ", line)
PY
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "== slope serve stopped (SIGTERM: drained, instances shut down)"
