#!/bin/bash
# 2026-11-28 (session 31, third call): the GPU validation of 8b94bb0 (arena orphans in
# runs, caching's release reads the free set as it goes), then memory pressure with
# --continue-after-oom, d514e54 against 8b94bb0, pinned to core 5.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=8b94bb0 OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree
date -u
$W/new generate random --seed 1 --events 1000000 --min-bytes 512 --max-bytes 64KiB --mean-lifetime 2000000 -o $W/lv.csv >/dev/null 2>&1
head -290000 $W/lv.csv > $W/lv29.csv
for r in 1 2; do for b in main new; do
  /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/$b replay $W/lv.csv --policy arena --capacity 3GiB --continue-after-oom > $W/a.$b 2>&1
  echo "pressure arena 1.63e6 3GiB round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' $W/t)"
  /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/$b replay $W/lv29.csv --policy caching --capacity 3GiB --continue-after-oom > $W/c.$b 2>&1
  echo "pressure caching 2.9e5 3GiB round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' $W/t)"
done; cmp -s $W/a.main $W/a.new && cmp -s $W/c.main $W/c.new || echo "OUTPUT DIFFERS"; done
grep "out of memory" $W/a.new $W/c.new | cut -c1-160; date -u
