#!/bin/bash
# s35w: model-h100/pages-20m again (2 of 12 disagreed in s35v's validation of 26576cb),
# twice for each of main at the session's start (4306f3f) and 26576cb, in turn.
R=.device-carry/rel; W=$(mktemp -d)
xz -dc $R/allocsim-main.xz > $W/old; xz -dc $R/allocsim.xz > $W/new; chmod +x $W/old $W/new
{ echo "events:"; for ((i = 0; i < 800; i++)); do echo "  - {op: alloc, id: $i, bytes: 20971520}"; done
  for ((i = 0; i < 800; i++)); do echo "  - {op: free, id: $i}"; done; } > $W/pages-20m.yaml
for r in 1 2; do for b in old new; do
  $W/$b validate $W/pages-20m.yaml --policies caching,caching:expandable_segments=True,arena --capacity 1GiB,4GiB,5632MiB,14GiB --gpu-profile h100 -o $OUT/h100-$b-$r.csv 2>>$OUT/log.txt
  echo "round=$r bin=$b: $(awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="verdict") c=i; next} {n[$c]++} END{for(k in n) printf "%s=%d ", k, n[k]}' $OUT/h100-$b-$r.csv)"
done; done
