#!/bin/bash
# s35e: compiled_graphs under torch.compile's default mode (inductor kernels, no CUDA graphs).
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s35e; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
rec() { local t0=$(date +%s); timeout 200 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec compiled_graphs --set mode=default
rec compiled_graphs --set mode=default --set train=1
rec compiled_graphs --set mode=default --alloc-conf expandable_segments:True
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for b in $O/*.json; do for a in $O/*.json; do
  [ "$a" = "$b" ] && continue
  $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
done; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s35e.tar.xz . && rm -rf $OUT/* && mv /tmp/s35e.tar.xz $OUT/
