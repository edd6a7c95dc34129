#!/bin/bash
# 2026-11-28 (session 30, second call): batches hold at most twice the threads' traces
# (ca8dc6b = new) against d9ec369 (old): the scaling probe's compare and fit, the
# builds alternating; then the GPU validation of new.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SCALE_EVENTS=1000000 ROUNDS=2 PARTS="compare fit" OUT=$OUT/scale tools/gpu/scaling-probe.sh $W/main $W/new 2>&1 | grep -v "^$" | tail -40
date -u
COMMIT=${COMMIT:-ca8dc6b} OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; cp $OUT/v/midrun.csv $OUT/midrun.csv; cat $OUT/summary.txt; date -u
