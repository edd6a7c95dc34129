#!/bin/bash
# 2026-11-28 (session 31, first call): the GPU validation of f4f356f (arena searched in
# runs of 64 superblocks), arena end to end pinned against d514e54 on the dense trace,
# arena bench on the live series (both builds), then the cost curves of f4f356f (live).
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=f4f356f OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree
date -u
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4 5 6 7 8; do order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for b in $order; do
    /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/$b replay $W/r7.csv --policy arena > $W/$b.out 2>&1
    echo "arena e2e 1e7 round=$r bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' $W/t)"
  done; cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS"; done
rm -f $W/r7.csv; date -u
for l in 20 2000 20000 200000 2000000; do
  $W/new generate random --seed 1 --events 1000000 --min-bytes 512 --max-bytes 64KiB --mean-lifetime $l -o $W/lv.csv >/dev/null 2>&1
  for r in 1 2; do for b in main new; do
    echo "live L=$l round=$r bin=$b $(taskset -c 5 $W/$b bench --policies arena $W/lv.csv 2>/dev/null | grep ',arena,')"
  done; done
  for b in main new; do
    /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/$b replay $W/lv.csv --policy arena > $W/$b.out 2>&1
    echo "live L=$l e2e bin=$b $(awk '{printf "cpu_s=%.2f peak_kb=%d", $1+$2, $3}' $W/t)"
  done; cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS L=$l"
done; date -u
LENGTHS="1000000" CORE=5 OUT=$OUT/curves bash $R/cost-curves.sh $W/new > /dev/null 2>&1; echo "curves rc=$?"
cat $OUT/curves/machine.txt $OUT/curves/curves.csv; date -u
