#!/bin/bash
# s35b (second form): record serve_dynamic under CAP (default 1024M) on the GPU and check them with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s35b; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
rec() { local t0=$(date +%s); timeout 200 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
C=${CAP:-1024M}
rec serve_dynamic --cap $C
rec serve_dynamic --cap $C --alloc-conf expandable_segments:True
rec serve_dynamic --cap $C --alloc-conf "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
rec serve_dynamic --cap $C --alloc-conf garbage_collection_threshold:0.7
rec serve_dynamic --cap $C --alloc-conf max_split_size_mb:128
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for w in serve_dynamic; do
  for b in $O/$w*.json; do for a in $O/$w*.json; do
    [ "$a" = "$b" ] && continue
    $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
  done; done
done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s35b.tar.xz . && rm -rf $OUT/* && mv /tmp/s35b.tar.xz $OUT/
