#!/bin/bash
# s36h: the recorder after its second review mend (ddp_train and fsdp_train through one
# _one_rank_training): both recorded again and checked with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
O=/tmp/s36h; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
for w in ddp_train fsdp_train; do timeout 120 python3 $R/record_torch.py $w $O >> $OUT/record.log 2>&1; echo "rc=$? $w" >> $OUT/record.log; done
/tmp/allocsim fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
grep -v "Warning\|warnings.warn" $OUT/record.log; cat $OUT/fidelity.csv $OUT/fidelity.err
