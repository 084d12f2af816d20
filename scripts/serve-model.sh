#!/usr/bin/env bash
# Makes (once) and prints the model the serving benchmarks use: `serve-1l`, the first layer of the
# gpt-oss-shaped `bench` model (bf16, seed 1), in $SLOPE_MODELS (default /tmp/models). The bench
# model is made there too if absent; serve-1l reads its weights from that file.
#   scripts/serve-model.sh SLOPE_BINARY
set -euo pipefail
slope=$1
models=${SLOPE_MODELS:-/tmp/models}
base="$models/bench-gpt-oss-bf16" model="$models/serve-1l"
[ -f "$base/model.safetensors" ] || "$slope" make-model --arch gpt-oss --preset bench --seed 1 --dtype bf16 --out "$base" >&2
if [ ! -f "$model/config.json" ]; then  # the first layer only (its weights are read from the whole file)
  mkdir -p "$model" && ln -sf "$base/model.safetensors" "$model/model.safetensors"
  python3 - "$base/config.json" "$model/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 1; c["layer_types"] = ["full_attention"]
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
fi
echo "$model"
