#!/bin/bash
# 2026-11-28 (session 34, fourth call): model-h100/pages-2m again (the set that disagreed
# 5 of 8 in s34b.sh's validation of f4b8b83), twice for each of three builds in turn:
# 814e3eb (base), f0e24cd (new), f4b8b83 (final); the pages-2m runs under the probed
# profile and the H200's once each for the final build.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
for b in base new final; do xz -dc "$R/allocsim-$b.xz" > "$W/$b"; chmod +x "$W/$b"; done
date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.free --format=csv,noheader
{ echo "events:"; for ((i = 0; i < 8000; i++)); do echo "  - {op: alloc, id: $i, bytes: 2097152}"; done
  for ((i = 0; i < 8000; i++)); do echo "  - {op: free, id: $i}"; done; } > "$W/pages-2m.yaml"
for r in 1 2; do for b in base new final; do
  "$W/$b" validate "$W/pages-2m.yaml" --policies immediate,caching --capacity 1GiB,4GiB,5632MiB,14GiB --gpu-profile h100 -o "$OUT/h100-$b-$r.csv" 2>>"$OUT/log.txt"
  echo "round=$r bin=$b: $(awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="verdict") c=i; next} {n[$c]++} END{for(k in n) printf "%s=%d ", k, n[k]}' "$OUT/h100-$b-$r.csv")"
done; done
"$W/final" probe --processes 8 -o "$OUT/probe.yaml" >>"$OUT/log.txt" 2>&1
"$W/final" validate "$W/pages-2m.yaml" --policies immediate,caching --capacity 1GiB,4GiB,5632MiB,14GiB --gpu-profile "$OUT/probe.yaml" -o "$OUT/probe-final.csv" 2>>"$OUT/log.txt"
echo "probed final: $(awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="verdict") c=i; next} {n[$c]++} END{for(k in n) printf "%s=%d ", k, n[k]}' "$OUT/probe-final.csv")"
head -3 "$OUT/h100-final-1.csv"
date -u
