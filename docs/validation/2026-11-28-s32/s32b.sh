#!/bin/bash
# 2026-11-28 (session 32, third call): read-ahead chunk sizes. main = 52532ac's code pinned
# to one core; new (8192 events a chunk, 4 waiting), c1024 (1024, 16), c65536 (65536, 2),
# each pinned to two cores. End to end at 10^7 (caching, immediate, arena; four
# alternating rounds) and 10^8 (caching, two rounds).
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new c1024 c65536; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
m() { # label cores bin args...
  local label=$1 cores=$2 bin=$3; shift 3
  /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $cores $W/$bin "$@" > "$W/$label.out" 2>&1
  awk -v l="$label" '{printf "%s wall_s=%.2f cpu_s=%.2f peak_kb=%d\n", l, $1, $2+$3, $4}' $W/t
}
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4; do for p in caching immediate arena; do
  order="main new c1024 c65536"; [ $((r % 2)) = 0 ] && order="c65536 c1024 new main"
  for b in $order; do c=5,6; [ $b = main ] && c=5; m "r$r $p $b" $c $b replay $W/r7.csv --policy $p; done
  for b in new c1024 c65536; do cmp -s "$W/r$r $p main.out" "$W/r$r $p $b.out" || echo "OUTPUT DIFFERS $p $b"; done
  rm -f $W/r$r*.out
done; done; date -u
rm -f $W/r7.csv; $W/new generate random --seed 1 --events 100000000 -o $W/r8.csv >/dev/null 2>&1
for r in 1 2; do
  order="main new c1024 c65536"; [ $((r % 2)) = 0 ] && order="c65536 c1024 new main"
  for b in $order; do c=5,6; [ $b = main ] && c=5; m "1e8 r$r caching $b" $c $b replay $W/r8.csv --policy caching; done
done; rm -f $W/r8.csv; date -u
