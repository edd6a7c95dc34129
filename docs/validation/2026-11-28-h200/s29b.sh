#!/bin/bash
# Pinned, alternating: 668e166 (main) against new (3956537: sparse ids set and taken
# with one hash lookup each, on top of 3a52ec1's RMM reader): replay of 10^7 events whose
# ids are addresses, and of the same 10^7 dense events (unchanged path); then the GPU
# validation of new.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; lscpu | grep -m1 "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$W/main generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null
awk -F, 'BEGIN{OFS=","} NR==1{print; next} $2 ~ /^[0-9]+$/ {$2 = sprintf("%.0f", 1099511627776 + $2 * 4096)} {print}' $W/r7.csv > $W/a7.csv
head -3 $W/a7.csv
C=${PIN_CORE:-5}
for t in a7 r7; do for r in $(seq 1 ${ROUNDS:-5}); do
  order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for b in $order; do
    /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $C $W/$b replay $W/$t.csv --policy caching > $W/$b.out 2>&1
    echo "pinned replay trace=$t round=$r bin=$b $(awk '{printf "wall_s=%.2f cpu_s=%.2f peak_kb=%d", $1, $2+$3, $4}' $W/t)"
  done
  cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS $t"
done; done
date -u
COMMIT=${COMMIT:-new} OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; cp $OUT/v/midrun.csv $OUT/midrun.csv; date -u
