#!/bin/bash
# 2026-11-28 (session 34, third call): the GPU validation of f4b8b83 (main at the end of
# the session: f0e24cd's address model, the caching policy's expandable-segment lookup
# helpers, test and docs changes), then every policy end to end at 10^7 and 10^8 events
# of the dense generator's trace, pinned to core 5, two rounds.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp "$R/gtime" /usr/bin/time 2>/dev/null
xz -dc "$R/allocsim-final.xz" > "$W/new"; chmod +x "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=f4b8b83 OUT=$OUT/v tools/gpu/validate.sh "$W/new" > "$OUT/validate.log" 2>&1; echo "validate rc=$?"
cp "$OUT/v/summary.txt" "$OUT/summary.txt"; grep -c " 0 disagree" "$OUT/summary.txt"; grep -v " 0 disagree" "$OUT/summary.txt" | grep disagree
date -u
"$W/new" generate random --seed 1 --streams 2 --events 10000000 -o "$W/r7.csv" >/dev/null 2>&1
"$W/new" generate random --seed 1 --streams 2 --events 100000000 -o "$W/r8.csv" >/dev/null 2>&1
date -u
for r in 1 2; do for t in r7 r8; do for p in caching immediate buddy arena; do
  /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c 5 "$W/new" replay "$W/$t.csv" --policy "$p" > /dev/null 2>&1
  echo "e2e $t $p round=$r $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' "$W/t")"
done; done; done
date -u
