#!/bin/bash
# 2026-11-28 (session 30, fifth call): the GPU validation of 36f8a59 (the arena's first
# candidate tested by its list's bound; - named twice refused).
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
xz -dc $R/allocsim-new.xz > $W/new; chmod +x $W/new
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=36f8a59 OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; cp $OUT/v/model-h100.csv $OUT/model-h100.csv; cp $OUT/v/pages.csv $OUT/pages.csv
grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree; date -u
