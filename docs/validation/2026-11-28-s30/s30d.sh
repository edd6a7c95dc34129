#!/bin/bash
# 2026-11-28 (session 30, fourth call): model-h100/pages-20m disagreed in 2 of 12 runs in
# the validation of 9ae2126; the simulated side is identical to ca8dc6b's (compare, CPU).
# Run that set alone, both builds, twice each, and print every row that does not agree.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; MIB=1048576
{ echo "events:"; for ((i = 0; i < 800; i++)); do echo "  - {op: alloc, id: $i, bytes: $((20 * MIB))}"; done
  for ((i = 0; i < 800; i++)); do echo "  - {op: free, id: $i}"; done; } > $W/pages-20m.yaml
for r in 1 2; do for b in main new; do
  $W/$b validate $W/pages-20m.yaml --policies caching,caching:expandable_segments=True,arena \
    --capacity 1GiB,4GiB,5632MiB,14GiB --gpu-profile h100 -o $OUT/$b-$r.csv 2>$OUT/$b-$r.log
  echo "round=$r bin=$b rc=$? rows=$(($(wc -l < $OUT/$b-$r.csv) - 1)) not agreeing: $(grep -vc ',agree' $OUT/$b-$r.csv)"
done; done
head -1 $OUT/new-1.csv; for f in $OUT/*.csv; do grep -v ',agree' $f | tail -n +2 | sed "s|^|$(basename $f): |"; done
date -u
