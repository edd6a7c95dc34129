#!/bin/bash
# 2026-11-28 (session 31, fourth call): pages/pages-2m disagreed in 5 of 8 runs in the
# validation of 8b94bb0 (probe profile). Probe again, then run that set with the probe's
# profile, both builds, twice each, and print every row that does not agree.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; MIB=1048576
$W/new probe --processes 32 -o $W/probe.yaml > $OUT/probe.log 2>&1; echo "probe rc=$?"; cp $W/probe.yaml $OUT/probe.yaml
{ echo "events:"; for ((i = 0; i < 8000; i++)); do echo "  - {op: alloc, id: $i, bytes: $((2 * MIB))}"; done
  for ((i = 0; i < 8000; i++)); do echo "  - {op: free, id: $i}"; done; } > $W/pages-2m.yaml
for r in 1 2; do for b in main new; do
  $W/$b validate $W/pages-2m.yaml --policies immediate,caching \
    --capacity 1GiB,4GiB,5632MiB,14GiB --gpu-profile $W/probe.yaml -o $OUT/$b-$r.csv 2>$OUT/$b-$r.log
  echo "round=$r bin=$b rc=$? rows=$(($(wc -l < $OUT/$b-$r.csv) - 1)) not agreeing: $(grep -vc ',agree' $OUT/$b-$r.csv)"
done; done
head -1 $OUT/new-1.csv; for f in $OUT/*.csv; do grep -v ',agree' $f | tail -n +2 | sed "s|^|$(basename $f): |"; done
date -u
