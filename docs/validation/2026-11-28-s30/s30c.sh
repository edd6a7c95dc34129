#!/bin/bash
# 2026-11-28 (session 30, third call): the GPU validation of 9ae2126 (arena first fit
# by bounds), arena end to end pinned against ca8dc6b, then the cost curves of 9ae2126.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=9ae2126 OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree
date -u
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4 5 6 7 8; do order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for b in $order; do
    /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/$b replay $W/r7.csv --policy arena > $W/$b.out 2>&1
    echo "arena e2e 1e7 round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' $W/t)"
  done; cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS"; done
rm -f $W/r7.csv; date -u
CORE=5 OUT=$OUT/curves bash $R/cost-curves.sh $W/new > /dev/null 2>&1; echo "curves rc=$?"
cat $OUT/curves/machine.txt $OUT/curves/curves.csv; date -u
