#!/bin/bash
# 2026-11-28 (session 34): the GPU validation of f0e24cd (the address model keeps chunks
# of up to 128 pages as page bitmaps), then end-to-end timings of 814e3eb's build ("old")
# against f0e24cd's ("new"), pinned to core 5, alternating, outputs compared.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp "$R/gtime" /usr/bin/time 2>/dev/null
xz -dc "$R/allocsim-base.xz" > "$W/old"; xz -dc "$R/allocsim-new.xz" > "$W/new"; chmod +x "$W/old" "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
COMMIT=f0e24cd OUT=$OUT/v tools/gpu/validate.sh "$W/new" > "$OUT/validate.log" 2>&1; echo "validate rc=$?"
cp "$OUT/v/summary.txt" "$OUT/summary.txt"; grep -c " 0 disagree" "$OUT/summary.txt"; grep -v " 0 disagree" "$OUT/summary.txt" | grep disagree
date -u
"$W/new" generate random --seed 1 --events 10000000 -o "$W/r7.csv" >/dev/null 2>&1
"$W/new" generate random --seed 1 --events 1000000 -o "$W/r6.csv" >/dev/null 2>&1
"$W/new" generate random --seed 1 --events 1000000 --min-bytes 2MiB --max-bytes 8MiB --mean-lifetime 10000 -o "$W/big.csv" >/dev/null 2>&1
for r in 1 2 3 4 5 6; do for spec in "r7.csv immediate" "r7.csv caching" "big.csv immediate --capacity=1TiB"; do set -- $spec; for b in old new; do
  /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c 5 "$W/$b" replay "$W/$1" --policy "$2" $3 > "$W/o.$b" 2>&1
  echo "e2e $1 $2 round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' "$W/t")"
done; cmp -s "$W/o.old" "$W/o.new" || echo "OUTPUT DIFFERS: $spec"; done; done
for r in 1 2 3; do for b in old new; do taskset -c 5 "$W/$b" bench "$W/r6.csv" --policies immediate,caching --runs 7 2>&1 | tail -2 | sed "s/^/bench round=$r bin=$b /"; done; done
date -u
