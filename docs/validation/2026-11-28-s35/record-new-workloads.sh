#!/bin/bash
# s35: record new workloads (oom_backoff, moe_train) on the GPU and check them with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s35rec; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" > $OUT/torch.txt 2>&1
rec() { local t0=$(date +%s); timeout 240 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec oom_backoff --cap 6G
rec oom_backoff --cap 6G --alloc-conf expandable_segments:True
rec oom_backoff --cap 6G --alloc-conf garbage_collection_threshold:0.6
rec moe_train
rec moe_train --alloc-conf roundup_power2_divisions:4
rec moe_train --alloc-conf expandable_segments:True
rec moe_train --alloc-conf max_split_size_mb:64
ls -la $O >> $OUT/record.log
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for w in oom_backoff moe_train; do
  for b in $O/$w*.json; do for a in $O/$w*.json; do
    [ "$a" = "$b" ] && continue
    $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
  done; done
done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
$A fidelity $O/oom_backoff__cap6144M.json --requests-from $O/oom_backoff__expandable_segments-True__cap6144M.json --explain > $OUT/whatif-explain.txt 2>&1
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s35.tar.xz . && rm -rf $OUT/* && mv /tmp/s35.tar.xz $OUT/
