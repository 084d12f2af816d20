# Shared by run_all.sh and run_llama16k.sh, and issue14j's scripts (sourced, with $out set): the run's start, the peak probe after each
# step, one SLOPE prefill as one JSON line with the probes around it, and one llama.cpp run.
# bench_models: g and l name the gpt-oss and llama bench models (bf16); the llama one is made if missing.
export SLOPE_REF_VENV="${SLOPE_REF_VENV:-/root/.cache/slope/venv-kv}"
probe() { echo "$(date -u +%H:%M:%S) $1 $(scripts/peak_probe.sh)" | tee -a "$out/timeline.txt"; }
begin() {  # the run's cpu.txt and commit.txt, and its first probe
  mkdir -p "$out"
  lscpu > "$out/cpu.txt"
  git rev-parse HEAD > "$out/commit.txt"
  probe start
}
slope() {  # MODEL TOKENS LABEL: one prefill (${SLOPE_BIN:-build/release/slope}), one JSON line with the probes around it
  local before after result
  before=$(scripts/peak_probe.sh)
  result=$("${SLOPE_BIN:-build/release/slope}" run --model "$1" --random-tokens "$2" --seed 1 --threads 2 --json)
  after=$(scripts/peak_probe.sh)
  python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['label']=sys.argv[4]; j['peak_probe']=[json.loads(sys.argv[2]), json.loads(sys.argv[3])]; print(json.dumps(j))" \
    "$result" "$before" "$after" "$3" >> "$out/slope.jsonl"
  probe "slope-$3"
}
peer() {  # MODEL TOKENS FA LABEL [extra llama-bench args]
  local m="$1" n="$2" fa="$3" label="$4"; shift 4
  scripts/bench_peer.sh -o jsonl -r 1 --model "$m" -p "$n" --fa "$fa" "$@" | grep '^{' |
    python3 -c "import json,sys; [print(json.dumps(dict(json.loads(l), label=sys.argv[1]))) for l in sys.stdin]" "$label" >> "$out/peer.jsonl"
  probe "peer-$label"
}
bench_models() {
  g=models/bench-gpt-oss-bf16 l=models/bench-llama-bf16
  [ -f "$l/model.safetensors" ] ||
    build/release/slope make-model --arch llama --preset bench --seed 1 --dtype bf16 --out "$l" > /dev/null
}
