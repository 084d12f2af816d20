#!/usr/bin/env bash
# Draws the TTFT-vs-offered-load curves that `slope plan --curve-out FILE.csv` writes: one PNG
# per context length (FILE-<tokens>.png), p90 solid and p50 dashed, one colour per deployment,
# the TP baseline included. Needs gnuplot (Debian: gnuplot-nox).
#   usage: scripts/plot_planner_curves.sh FILE.csv [SLO_SECONDS]
set -euo pipefail
csv=${1:?usage: $0 FILE.csv [SLO_SECONDS]}
slo=${2:-}
command -v gnuplot >/dev/null || { echo "gnuplot not found: apt-get install gnuplot-nox" >&2; exit 1; }
[[ -r $csv ]] || { echo "cannot read $csv" >&2; exit 1; }
base=${csv%.csv}
yr='*'
[[ -n $slo ]] && yr=$(awk -v s="$slo" 'BEGIN { print 4 * s }')
for ctx in $(tail -n +2 "$csv" | cut -d, -f1 | sort -un); do
  png="$base-$ctx.png"
  mapfile -t names < <(awk -F, -v c="$ctx" 'NR > 1 && $1 == c && !seen[$2]++ { print $2 }' "$csv")
  plot=""
  i=1
  for name in "${names[@]}"; do
    kind=$(awk -F, -v c="$ctx" -v n="$name" 'NR > 1 && $1 == c && $2 == n { print $3; exit }' "$csv")
    sel="(strcol(1) eq '$ctx' && strcol(2) eq '$name' ? \$4 : NaN)"
    plot+="'$csv' using $sel:7 with lines lw 2 lc $i title '$name ($kind) p90', "
    plot+="'$csv' using $sel:6 with lines lw 1 dt 2 lc $i notitle, "
    i=$((i + 1))
  done
  [[ -n $slo ]] && plot+="$slo with lines lc rgb 'black' dt 3 title 'SLO', "
  gnuplot <<GP
set terminal pngcairo size 1000,650 noenhanced
set output '$png'
set datafile separator ','
set key top left
set title 'Predicted TTFT vs offered load, $ctx-token prompts (solid p90, dashed p50)'
set xlabel 'offered load (requests/s, whole cluster)'
set ylabel 'TTFT (s)'
set yrange [0:$yr]
set grid
plot ${plot%, }
GP
  echo "$png"
done
