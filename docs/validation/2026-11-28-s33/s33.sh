#!/bin/bash
# 2026-11-28 (session 33): the GPU validation of ba4f55d (caching's cache release reads
# only the free blocks that may give memory back), then memory pressure with
# --continue-after-oom, 1518a10's build ("old") against ba4f55d's ("new"), pinned to core 5.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp "$R/gtime" /usr/bin/time 2>/dev/null
xz -dc "$R/allocsim-new.xz" > "$W/old"; xz -dc "$R/allocsim-s33.xz" > "$W/new"; chmod +x "$W/old" "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=ba4f55d OUT=$OUT/v tools/gpu/validate.sh "$W/new" > "$OUT/validate.log" 2>&1; echo "validate rc=$?"
cp "$OUT/v/summary.txt" "$OUT/summary.txt"; grep -c " 0 disagree" "$OUT/summary.txt"; grep -v " 0 disagree" "$OUT/summary.txt" | grep disagree
date -u
"$W/new" generate random --seed 1 --events 1000000 --min-bytes 512 --max-bytes 64KiB --mean-lifetime 2000000 -o "$W/lv.csv" >/dev/null 2>&1
head -290000 "$W/lv.csv" > "$W/lv29.csv"
for r in 1 2 3; do for spec in "caching 3GiB" "caching 1GiB" "caching:expandable_segments=True 1GiB"; do set -- $spec; for b in old new; do
  /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c 5 "$W/$b" replay "$W/lv29.csv" --policy "$1" --capacity "$2" --continue-after-oom --stats > "$W/o.$b" 2>&1
  echo "pressure $1 2.9e5 $2 round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' "$W/t")"
done; cmp -s "$W/o.old" "$W/o.new" || echo "OUTPUT DIFFERS: $spec"; done; done
for r in 1 2; do
  /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c 5 "$W/new" replay "$W/lv.csv" --policy caching --capacity 3GiB --continue-after-oom > "$W/w.new" 2>&1
  echo "pressure caching 1.63e6 3GiB round=$r bin=new $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' "$W/t")"
done
grep "out-of-memory events" "$W/w.new"; date -u
