#!/bin/bash
# 2026-11-28 (session 33, second call): the GPU validation of 85b6634 (the address model
# passes over runs of chunks by their bounds past 64 chunks; caching's stream map past
# 64 streams), then the many-segment and many-stream traces, ba4f55d's build ("old")
# against 85b6634's ("new"), pinned to core 5.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp "$R/gtime" /usr/bin/time 2>/dev/null
xz -dc "$R/allocsim-s33.xz" > "$W/old"; xz -dc "$R/allocsim-s33b.xz" > "$W/new"; chmod +x "$W/old" "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=85b6634 OUT=$OUT/v tools/gpu/validate.sh "$W/new" > "$OUT/validate.log" 2>&1; echo "validate rc=$?"
cp "$OUT/v/summary.txt" "$OUT/summary.txt"; grep -c " 0 disagree" "$OUT/summary.txt"; grep -v " 0 disagree" "$OUT/summary.txt" | grep disagree
date -u
"$W/new" generate random --seed 1 --events 1000000 --min-bytes 2MiB --max-bytes 8MiB --mean-lifetime 10000 -o "$W/big.csv" >/dev/null 2>&1
"$W/new" generate random --seed 2 --events 1000000 --streams 1024 -o "$W/st.csv" >/dev/null 2>&1
"$W/new" generate random --seed 1 --events 10000000 -o "$W/r7.csv" >/dev/null 2>&1
for r in 1 2 3; do for spec in "big.csv immediate --capacity=1TiB" "st.csv caching --stats" "r7.csv immediate --stats"; do set -- $spec; for b in old new; do
  /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c 5 "$W/$b" replay "$W/$1" --policy "$2" $3 > "$W/o.$b" 2>&1
  echo "many $1 $2 round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' "$W/t")"
done; cmp -s "$W/o.old" "$W/o.new" || echo "OUTPUT DIFFERS: $spec"; done; done
date -u
