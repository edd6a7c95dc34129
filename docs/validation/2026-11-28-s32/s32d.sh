#!/bin/bash
# 2026-11-28 (session 32, fifth call): the GPU validation of 1518a10 (review mends:
# caching's release_blocks splits the releasable blocks as it reads the free set; the
# read-ahead's core check moved into stream_replay).
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
xz -dc $R/allocsim-new.xz > $W/new; chmod +x $W/new
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=1518a10 OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; grep -c " 0 disagree" $OUT/summary.txt; grep -v " 0 disagree" $OUT/summary.txt | grep disagree
cp $OUT/v/pages.csv $OUT/pages.csv 2>/dev/null; date -u
