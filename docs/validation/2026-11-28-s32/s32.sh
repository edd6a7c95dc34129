#!/bin/bash
# 2026-11-28 (session 32, first call): the read-ahead thread of `replay` (a CSV trace or
# an RMM log read on a second thread). main = 52532ac's code (reads on the replaying
# thread), new = the read-ahead build. End to end at 10^7, every policy: main pinned to
# one core, new pinned to two cores (read ahead) and to one (reads on one thread), six
# alternating rounds; 10^8 for caching and immediate, two rounds; the RMM log at 10^6;
# outputs compared. (The first call, whose timing lines a quoting error lost, ended with
# the GPU validation of the new build: COMMIT=read-ahead OUT=$OUT/v tools/gpu/validate.sh
# $W/new; its summary is summary-read-ahead.txt.)
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
xz -dc $R/rmm1e6.csv.xz > $W/rmm6.csv
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
m() { # label cores bin args...
  local label=$1 cores=$2 bin=$3; shift 3
  /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $cores $W/$bin "$@" > "$W/$label.out" 2>&1
  awk -v l="$label" '{printf "%s wall_s=%.2f cpu_s=%.2f peak_kb=%d\n", l, $1, $2+$3, $4}' $W/t
}
$W/new generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null 2>&1
for r in 1 2 3 4 5 6; do for p in caching immediate buddy arena; do
  m "r$r $p main-1core" 5 main replay $W/r7.csv --policy $p
  m "r$r $p new-2cores" 5,6 new replay $W/r7.csv --policy $p
  m "r$r $p new-1core" 5 new replay $W/r7.csv --policy $p
  cmp -s "$W/r$r $p main-1core.out" "$W/r$r $p new-2cores.out" || echo "OUTPUT DIFFERS $p"
  rm -f $W/r$r*.out
done; done; date -u
for r in 1 2 3 4 5; do
  m "rmm r$r main-1core" 5 main replay $W/rmm6.csv
  m "rmm r$r new-2cores" 5,6 new replay $W/rmm6.csv
  m "rmm r$r new-1core" 5 new replay $W/rmm6.csv
  cmp -s "$W/rmm r$r main-1core.out" "$W/rmm r$r new-2cores.out" || echo "OUTPUT DIFFERS rmm"
done; date -u
rm -f $W/r7.csv; $W/new generate random --seed 1 --events 100000000 -o $W/r8.csv >/dev/null 2>&1
for r in 1 2; do for p in caching immediate; do
  m "1e8 r$r $p main-1core" 5 main replay $W/r8.csv --policy $p
  m "1e8 r$r $p new-2cores" 5,6 new replay $W/r8.csv --policy $p
  cmp -s "$W/1e8 r$r $p main-1core.out" "$W/1e8 r$r $p new-2cores.out" || echo "OUTPUT DIFFERS 1e8 $p"
done; done; rm -f $W/r8.csv; date -u


date -u
