#!/bin/bash
# 2026-11-28 (session 33, third call): the validation again, ba4f55d's build ("old") and
# 85b6634's ("new") one after the other on one start of the machine, to tell whether
# model-h100/pages-20m's 2 disagreements of the second call follow the build or the GPU.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
xz -dc "$R/allocsim-s33.xz" > "$W/old"; xz -dc "$R/allocsim-s33b.xz" > "$W/new"; chmod +x "$W/old" "$W/new"
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in new old; do
  COMMIT=$b OUT=$OUT/v-$b tools/gpu/validate.sh "$W/$b" > "$OUT/validate-$b.log" 2>&1; echo "validate $b rc=$?"
  cp "$OUT/v-$b/summary.txt" "$OUT/summary-$b.txt"; cp "$OUT/v-$b/model-h100.csv" "$OUT/model-h100-$b.csv"
  grep -c " 0 disagree" "$OUT/summary-$b.txt"; grep -v " 0 disagree" "$OUT/summary-$b.txt" | grep disagree; date -u
done
rm -rf "$OUT/v-new" "$OUT/v-old"
