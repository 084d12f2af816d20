#!/usr/bin/env bash
# The main job on a small default: install dependencies, build, write the gpt-oss-shaped `bench`
# model (random weights), and prefill a prompt on 4 ranks (Ulysses 2 x ring 2), checked
# against one rank; then start the prefill server (`slope serve`, two instances of different
# meshes) on a tiny model and send it a few requests with the official `openai` Python client
# (scripts/serve_demo.sh; its venv comes from PyPI on first use). TOKENS (default 2048) and DTYPE (default f32, so that the check is exact to
# 1e-4; bf16 is faster and checked with a bf16 tolerance) can be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh app   # the slope binary only; scripts/test.sh builds the tests
slope=build/release/slope
model=models/bench-gpt-oss-${DTYPE:-f32}
if [ ! -f "$model/model.safetensors" ]; then
  "$slope" make-model --arch gpt-oss --preset bench --seed 1 --dtype "${DTYPE:-f32}" --out "$model"
fi
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \
  "$slope" run --model "$model" --random-tokens "${TOKENS:-2048}" --seed 1 --dtype "${DTYPE:-f32}" \
  --ulysses 2 --ring 2 --check
echo
echo "== the prefill server: scripts/serve_demo.sh"
bash scripts/serve_demo.sh
