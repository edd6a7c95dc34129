#!/bin/bash
# 2026-11-28 (session 32, fourth call): the host's CPU topology, then CSV read ahead on
# two cores that are not siblings (main = 52532ac's code on one core; new = the build
# that reads CSV ahead, on two), four alternating rounds at 10^7 and two at 10^8.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; lscpu | grep -E "Thread|Core|Socket|NUMA node|L2|L3" | sed 's/  */ /g'
for c in 5 6 12 13; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list) core $(cat /sys/devices/system/cpu/cpu$c/topology/core_id)"; done
m() { local label=$1 cores=$2 bin=$3; shift 3
  /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $cores $W/$bin "$@" > "$W/$label.out" 2>&1
  awk -v l="$label" '{printf "%s wall_s=%.2f cpu_s=%.2f peak_kb=%d\n", l, $1, $2+$3, $4}' $W/t; }
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4; do for p in caching immediate; do
  m "r$r $p main" 5 main replay $W/r7.csv --policy $p
  m "r$r $p new-5,12" 5,12 new replay $W/r7.csv --policy $p
  m "r$r $p new-5,6" 5,6 new replay $W/r7.csv --policy $p
done; done; date -u
rm -f $W/r7.csv; $W/new generate random --seed 1 --events 100000000 -o $W/r8.csv >/dev/null 2>&1
for r in 1 2; do
  m "1e8 r$r caching main" 5 main replay $W/r8.csv --policy caching
  m "1e8 r$r caching new-5,12" 5,12 new replay $W/r8.csv --policy caching
done; date -u
