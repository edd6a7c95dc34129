#!/bin/bash
# 2026-11-28 (session 34, fifth call): the GPU validation of 5cd7864 (caching free sets
# index their streams), main at the end of the session.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp "$R/gtime" /usr/bin/time 2>/dev/null
xz -dc "$R/allocsim-final2.xz" > "$W/new"; chmod +x "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=5cd7864 OUT=$OUT/v tools/gpu/validate.sh "$W/new" > "$OUT/validate.log" 2>&1; echo "validate rc=$?"
cp "$OUT/v/summary.txt" "$OUT/summary.txt"; grep -c " 0 disagree" "$OUT/summary.txt"; grep -v " 0 disagree" "$OUT/summary.txt" | grep disagree
date -u
