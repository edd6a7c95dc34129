#!/bin/bash
# s36c: record graphed_callables and ddp_train (new workloads) and check with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36c; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
rec() { local t0=$(date +%s); timeout 150 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec graphed_callables
rec graphed_callables --alloc-conf expandable_segments:True
rec ddp_train
rec ddp_train --set as_view=1
rec ddp_train --alloc-conf expandable_segments:True
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for w in graphed_callables ddp_train; do
  for b in $O/$w*.json; do for a in $O/$w*.json; do
    [ "$a" = "$b" ] && continue
    $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
  done; done
done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s36c.tar.xz . && rm -rf $OUT/* && mv /tmp/s36c.tar.xz $OUT/
tar -xJOf $OUT/s36c.tar.xz ./fidelity.csv ./fidelity.err ./whatif.csv ./record.log 2>/dev/null | grep -v Warning | grep -v "warnings.warn" | tail -50
