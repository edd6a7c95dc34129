#!/bin/bash
# s36g: record fsdp_train (FSDP2 in one process) and check it with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36g; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
rec() { local t0=$(date +%s); timeout 120 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec fsdp_train
rec fsdp_train --set reshard=0
rec fsdp_train --alloc-conf expandable_segments:True
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for b in $O/*.json; do for a in $O/*.json; do [ "$a" = "$b" ] && continue; $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv; done; done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s36g.tar.xz . && rm -rf $OUT/* && mv /tmp/s36g.tar.xz $OUT/
tar -xJOf $OUT/s36g.tar.xz ./record.log ./fidelity.csv ./fidelity.err ./whatif.csv 2>/dev/null | grep -v "Warning\|warnings.warn" | cut -c1-300 | tail -30
