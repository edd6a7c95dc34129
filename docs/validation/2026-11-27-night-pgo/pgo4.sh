#!/bin/bash
# Four builds of one commit side by side, pinned to one core, order rotated per round:
# main (release profile as committed), lto (fat LTO, 1 codegen unit), pgo (profile-use),
# pgolto (both). End to end replay CPU time on two traces; the caching core by bench.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main lto pgo pgolto; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; lscpu | grep -m1 "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$W/main generate random --seed 1 --events 10000000 -o $W/r.csv >/dev/null
$W/main generate inference --seed 1 --set batches=3000 -o $W/i.csv >/dev/null
C=${PIN_CORE:-5}; ROUNDS=${ROUNDS:-4}
bins=(main lto pgo pgolto)
for t in r i; do for p in caching immediate buddy arena; do
  for r in $(seq 1 $ROUNDS); do
    for k in 0 1 2 3; do b=${bins[$(( (k + r) % 4 ))]}
      /usr/bin/time -f "%U %S" -o $W/t taskset -c $C $W/$b replay $W/$t.csv --policy $p > $W/$b.out
      echo "e2e trace=$t policy=$p round=$r bin=$b cpu=$(awk '{printf "%.3f", $1+$2}' $W/t)"
    done
    for b in lto pgo pgolto; do cmp -s $W/main.out $W/$b.out || echo "OUTPUT DIFFERS $t $p $b"; done
  done
done; done
for r in $(seq 1 ${CORE_ROUNDS:-2}); do for k in 0 1 2 3; do b=${bins[$(( (k + r) % 4 ))]}
  taskset -c $C $W/$b bench --runs 5 --policies caching,immediate,buddy,arena --format csv | sed "s/^/core round=$r bin=$b /"
done; done
date -u
