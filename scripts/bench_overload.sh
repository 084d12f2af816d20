#!/usr/bin/env bash
# Overload of `slope serve` (issue 17, part 4): FACTOR x the planner's capacity for the
# mixed-256-8k length mix, for DURATION s, under the SLO scheduler, on the layout of
# scripts/bench_serve_compare.sh (two 1-rank instances of 1 thread, the 1-layer cut `serve-1l`
# of the gpt-oss-shaped bench model, --batch-tokens 1024, profiles/cpu-zen4-1c.json).
#   scripts/bench_overload.sh OUT [DURATION (600)] [FACTOR (2)] [SLO_MS (5000)]
# The capacity is computed as docs/serving.md does: 2 instances / the mean of the cost model's
# service time over the mix's lengths (`slope plan --predict`, OUT/predict.jsonl).
# While the load runs, the resident memory of the front and of every process below it (mpirun
# and the ranks) is sampled every second (OUT/rss.csv, OUT/rss-per-process.csv). Then
# scripts/overload_check.py prints and checks (exit 1 if any fails, OUT/checks.json):
#   - the admitted requests' p99 TTFT (measured at the client) is within SLO_MS;
#   - every request sent was answered 200 or 429: no errors, none missing, and the server
#     counted as many requests as were sent;
#   - /health says "ok" at the end;
#   - RSS is bounded: the last quarter's maximum is within 1.25x of the second quarter's.
# and draws OUT/overload.png (RSS and TTFT over time). Environment: SLOPE (the binary, default
# build/release/slope), SLOPE_MODELS (where the models are made and kept, default /tmp/models),
# SEED (arrivals, default 7).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUT [DURATION (600)] [FACTOR (2)] [SLO_MS (5000)]" >&2; exit 2; }
out=$1 duration=${2:-600} factor=${3:-2} slo_ms=${4:-5000}
slope="${SLOPE:-$root/build/release/slope}"
[ -x "$slope" ] || { echo "bench_overload.sh: $slope is not built; cmake --build --preset release --target slope" >&2; exit 2; }
py="$(bash "$root/scripts/serve-venv.sh")"
mkdir -p "$out"
model="$(bash "$root/scripts/serve-model.sh" "$slope")"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
profile="$root/profiles/cpu-zen4-1c.json"
"$slope" plan --predict --model "$model" --hardware "$profile" --mesh 1,1,1,1 --context 256,512,1k,2k,4k,8k --json \
  > "$out/predict.jsonl"
rate=$(python3 - "$out/predict.jsonl" "$factor" <<'PY'
import json, sys
service = [json.loads(l)["service_s"] for l in open(sys.argv[1]) if l.strip()]
capacity = 2 / (sum(service) / len(service))  # 2 instances, the mix's lengths equally likely
print(f"{float(sys.argv[2]) * capacity:.4f}")
PY
)
echo "overload: the planner's capacity x $factor = $rate requests/s for $duration s, SLO $slo_ms ms" | tee "$out/load.txt"

log="$out/server.log"
"$slope" serve --model "$model" --instance "ring=1" --instance "ring=1" --threads-per-rank 1 --profile "$profile" \
  --scheduler slo --slo-ms "$slo_ms" --port 0 --batch-tokens 1024 > "$log" 2>&1 &
pid=$!
sampler=""
cleanup() {
  [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 600); do grep -q "listening on" "$log" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
url="$(grep -o 'http://[^ ]*' "$log" | head -1 || true)"
[ -n "$url" ] || { echo "bench_overload.sh: the server did not start:" >&2; cat "$log" >&2; exit 1; }
for _ in $(seq 1 600); do  # both instances ready
  curl -sf "$url/health" 2>/dev/null | grep -q '"status":"ok"' && break; sleep 0.2
done
(  # RSS of the front and of every process below it (mpirun, the ranks), every second
  echo "t_s,front_mib,instances_mib,total_mib" > "$out/rss.csv"
  echo "t_s,pid,comm,rss_mib" > "$out/rss-per-process.csv"
  t0=$(date +%s.%N)
  while kill -0 "$pid" 2>/dev/null; do
    below=$(pgrep -P "$pid" || true)
    all="$pid $below $(for c in $below; do pgrep -P "$c" || true; done)"
    t=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
    ps -o pid=,comm=,rss= -p "$(echo $all | tr -s ' ' ',')" 2>/dev/null |
      awk -v t="$t" -v front="$pid" -v f="$out/rss-per-process.csv" -v s="$out/rss.csv" '
        { printf "%s,%s,%s,%.1f\n", t, $1, $2, $3 / 1024 >> f; if ($1 == front) fr += $3; else inst += $3 }
        END { printf "%s,%.1f,%.1f,%.1f\n", t, fr / 1024, inst / 1024, (fr + inst) / 1024 >> s }'
    sleep 1
  done
) &
sampler=$!
"$py" "$root/scripts/bench_serve.py" --url "$url" --model serve-1l --rate "$rate" --duration "$duration" \
  --mix mixed-256-8k --slo-ms "$slo_ms" --seed "${SEED:-7}" --label overload --csv "$out/summary.csv" \
  --requests-csv "$out/requests.csv" | tee "$out/summary.txt"
sleep 2  # two more RSS samples after the last answer
curl -s -o "$out/health.json" -w '%{http_code}\n' "$url/health" > "$out/health.status" || echo 000 > "$out/health.status"
curl -s "$url/metrics" > "$out/metrics.txt" || true
kill "$sampler" 2>/dev/null || true
sampler=""
kill -TERM "$pid"
wait "$pid" && echo 0 > "$out/server.exit" || echo $? > "$out/server.exit"
trap - EXIT
"$py" "$root/scripts/overload_check.py" "$out" --slo-ms "$slo_ms" --rate "$rate" --duration "$duration"
