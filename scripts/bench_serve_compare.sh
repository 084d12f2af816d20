#!/usr/bin/env bash
# The serving comparison of docs/serving.md: the SLO scheduler against first-come-first-served
# on the same arrivals. One `slope serve` per scheduler, two 1-rank instances of 1 thread each
# (the machine's 2 cores), on a 1-layer cut of the gpt-oss-shaped `bench` model (its 8K prompt
# takes 2-3 s on one core), Poisson arrivals of the mixed-256-8k length mix at RATE requests/s
# for DURATION s, each with a TTFT target of SLO_MS. Writes OUT/{slo,fcfs}.csv (summaries),
# OUT/{slo,fcfs}-requests.csv, OUT/plan.csv (the planner's curves) and OUT/serving.png.
# RATE may be a comma-separated sweep ("1,2,3,4"): one CSV row per rate. While each server runs,
# the resident memory of it and its instances' ranks is sampled every second into
# OUT/{slo,fcfs}-rss.csv (t_s, rss_mib).
#   scripts/bench_serve_compare.sh OUT [RATE (4)] [DURATION (90)] [SLO_MS (5000)]
# SCHEDULERS="slo" (default "slo fcfs") runs only those; the plot then has their series only.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$1 rate=${2:-4} duration=${3:-90} slo_ms=${4:-5000}
slope="$root/build/release/slope"
py="$(bash "$root/scripts/serve-venv.sh")"
mkdir -p "$out"
model="$(bash "$root/scripts/serve-model.sh" "$slope")"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
profile="$root/profiles/cpu-zen4-1c.json"
echo "{\"peak_before\": $("$root/scripts/peak_probe.sh")}" | tee "$out/peak.json"
"$slope" plan --model "$model" --hardware "$profile" --nodes 1 --devices-per-node 2 --context 2048 \
  --ttft-slo "$(python3 -c "print($slo_ms/1000)")" --curve-out "$out/plan.csv" > "$out/plan.txt"
"$slope" plan --predict --model "$model" --hardware "$profile" --mesh 1,1,1,1 --context 256,512,1k,2k,4k,8k --json \
  > "$out/predict.jsonl"
schedulers=${SCHEDULERS:-slo fcfs}
for sched in $schedulers; do
  log="$out/server-$sched.log"
  "$slope" serve --model "$model" --instance "ring=1" --instance "ring=1" --threads-per-rank 1 --profile "$profile" \
    --scheduler "$sched" --slo-ms "$slo_ms" --port 0 --batch-tokens 1024 > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "listening on" "$log" && break; sleep 0.2; done
  url="$(grep -o 'http://[^ ]*' "$log" | head -1)"
  (  # RSS of the server and every process below it (the instances' mpirun and ranks)
    echo "t_s,rss_mib"; t0=$(date +%s)
    while kill -0 "$pid" 2>/dev/null; do
      pids=$(echo "$pid" $(pgrep -P "$pid") $(for c in $(pgrep -P "$pid"); do pgrep -P "$c"; done) | tr -s ' ' ',')
      kb=$(ps -o rss= -p "$pids" 2>/dev/null | awk '{s+=$1} END {print s+0}')
      echo "$(( $(date +%s) - t0 )),$(( kb / 1024 ))"; sleep 1
    done
  ) > "$out/$sched-rss.csv" &
  if [[ "$rate" == *,* ]]; then load=(--sweep "$rate"); else load=(--rate "$rate"); fi
  "$py" "$root/scripts/bench_serve.py" --url "$url" --model serve-1l "${load[@]}" --duration "$duration" \
    --mix mixed-256-8k --slo-ms "$slo_ms" --seed 7 --label "$sched" --csv "$out/$sched.csv" \
    --requests-csv "$out/$sched-requests.csv" | tee "$out/$sched.txt"
  curl -s "$url/metrics" > "$out/$sched-metrics.txt" || true
  kill -TERM "$pid"; wait "$pid" || true
done
echo "{\"peak_after\": $("$root/scripts/peak_probe.sh")}" | tee -a "$out/peak.json"
"$py" "$root/scripts/bench_serve.py" --plot "$out/serving.png" $(for s in $schedulers; do echo "$out/$s.csv"; done) \
  --planner-curves "$out/plan.csv" --planner-context 2048 --slo-ms "$slo_ms" \
  --title "slope serve, 2 x 1-rank instances, mixed-256-8k, SLO $slo_ms ms"
