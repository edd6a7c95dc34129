#!/bin/bash
# usage: min4.sh ROUNDS TRACE POLICY... : per binary (main lto pgo pgolto) min and lower-quartile CPU of replay, rotated order
R=$1; T=$2; shift 2; bins=(main lto pgo pgolto)
for p in "$@"; do
  declare -A v=()
  for r in $(seq 1 $R); do for k in 0 1 2 3; do b=${bins[$(( (k + r) % 4 ))]}
    t=$( { /usr/bin/time -f "%U %S" taskset -c 1 ./allocsim-$b replay $T --policy $p > /dev/null; } 2>&1 | awk '{printf "%.3f", $1+$2}')
    v[$b]="${v[$b]} $t"
  done; done
  for b in "${bins[@]}"; do echo "$p $b $(echo ${v[$b]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END{printf "min %.3f q1 %.3f med %.3f", a[1], a[int(NR/4)+1], a[int(NR/2)+1]}')"; done
done
