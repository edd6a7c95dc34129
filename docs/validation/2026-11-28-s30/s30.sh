#!/bin/bash
# 2026-11-28 (session 30): where end to end stands on main (d9ec369; hot path as
# 3956537), pinned to one core, against 668e166 (main of the session before) in
# alternating rounds at 10^7, then 10^8 and the bench core figures for d9ec369, then
# compare's scaling on 16 cores.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; lscpu | grep -m1 "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
C=${PIN_CORE:-5}
for r in $(seq 1 ${ROUNDS:-6}); do
  order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for p in caching immediate buddy arena; do for b in $order; do
    /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $C $W/$b replay $W/r7.csv --policy $p > $W/$b.out 2>&1
    echo "e2e 1e7 round=$r policy=$p bin=$b $(awk '{printf "wall_s=%.3f cpu_s=%.3f peak_kb=%d", $1, $2+$3, $4}' $W/t)"
  done; cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS $p"; done
done
date -u
$W/new generate random --seed 1 --events 100000000 -o $W/r8.csv >/dev/null 2>&1; rm -f $W/r7.csv
for r in 1 2; do for p in caching immediate buddy arena; do
  /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $C $W/new replay $W/r8.csv --policy $p > /dev/null 2>&1
  echo "e2e 1e8 round=$r policy=$p bin=new $(awk '{printf "wall_s=%.3f cpu_s=%.3f peak_kb=%d", $1, $2+$3, $4}' $W/t)"
done; done
rm -f $W/r8.csv; date -u
for r in 1 2; do taskset -c $C $W/new bench --format csv 2>/dev/null | sed "s/^/bench round=$r /"; done
date -u
SCALE_EVENTS=1000000 ROUNDS=2 PARTS=compare OUT=$OUT/scale tools/gpu/scaling-probe.sh $W/new 2>&1 | tail -40
date -u
