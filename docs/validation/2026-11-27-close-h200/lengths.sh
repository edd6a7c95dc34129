#!/usr/bin/env bash
# Usage: PIN_CORE=5 lengths.sh PATH/TO/allocsim  (GNU time as /usr/bin/time; about 140 s on the H200 host)
# cost against trace length on the GPU host, pinned, main's build
set -u
B=$1; C=${PIN_CORE:-5}; W=$(mktemp -d)
date -u; lscpu | grep -m1 "Model name"
/usr/bin/time -f "generate events=100000000 cpu_s=%U+%S wall_s=%e peak_rss_kb=%M" $B generate random --seed 1 --events 100000000 -o $W/r100000000.csv >/dev/null
ls -la $W/r100000000.csv
for n in 100000 1000000 10000000; do $B generate random --seed 1 --events $n -o $W/r$n.csv >/dev/null; done
for r in 1 2 3; do for p in caching immediate buddy arena; do for n in 100000 1000000 10000000 100000000; do
  /usr/bin/time -f "replay events=$n policy=$p round=$r cpu_s=%U+%S wall_s=%e peak_rss_kb=%M" taskset -c $C $B replay $W/r$n.csv --policy $p >/dev/null
done; done; done
/usr/bin/time -f "check events=100000000 cpu_s=%U+%S wall_s=%e peak_rss_kb=%M" taskset -c $C $B check $W/r100000000.csv >/dev/null
/usr/bin/time -f "timeline events=100000000 cpu_s=%U+%S wall_s=%e peak_rss_kb=%M" taskset -c $C $B replay $W/r100000000.csv --policy caching --timeline $W/tl.csv >/dev/null
ls -la $W/tl.csv; rm -rf $W
