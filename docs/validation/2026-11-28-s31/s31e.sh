#!/bin/bash
# 2026-11-28 (session 31, fifth call): the GPU validation of 52532ac (review mends of the
# arena's order searches, no output change).
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
xz -dc $R/allocsim-new.xz > $W/new; chmod +x $W/new
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=52532ac OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; cp $OUT/v/pages.csv $OUT/pages.csv
grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree; date -u
