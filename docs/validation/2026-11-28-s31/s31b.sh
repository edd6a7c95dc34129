#!/bin/bash
# 2026-11-28 (session 31, second call, an H100 host): the GPU validation of f4f356f on an
# H100, then end to end at 10^7 (every policy, six rounds pinned to core 5) and the
# caching core (bench at 10^6, three rounds) on this host's CPU.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
xz -dc $R/allocsim-new.xz > $W/new; chmod +x $W/new
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | sed 's/  */ /g'
COMMIT=f4f356f OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree
date -u
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4 5 6; do for p in caching immediate buddy arena; do
  /usr/bin/time -f "%U %S %M" -o $W/t taskset -c 5 $W/new replay $W/r7.csv --policy $p > /dev/null 2>&1
  echo "e2e 1e7 round=$r policy=$p $(awk '{printf "cpu_s=%.2f events_per_s=%.1fM peak_kb=%d", $1+$2, 10000030/($1+$2)/1e6, $3}' $W/t)"
done; done; rm -f $W/r7.csv; date -u
$W/new generate random --seed 1 --events 1000000 -o $W/r6.csv >/dev/null 2>&1
for r in 1 2 3; do echo "core round=$r $(taskset -c 5 $W/new bench --policies caching,immediate,buddy,arena $W/r6.csv 2>/dev/null | tail -n +2 | tr '\n' ' ')"; done
date -u
