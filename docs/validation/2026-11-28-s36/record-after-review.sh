#!/bin/bash
# s36d: the recorder after its review mend (the compiled workloads' rounds in one helper):
# compiled_graphs and compiled_gpt again, checked with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36d; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
rec() { local t0=$(date +%s); timeout 150 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec compiled_graphs
rec compiled_gpt
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
grep -v "Warning\|warnings.warn" $OUT/record.log; cat $OUT/fidelity.csv $OUT/fidelity.err
