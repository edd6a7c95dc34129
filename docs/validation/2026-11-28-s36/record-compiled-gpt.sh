#!/bin/bash
# s36b: record compiled_gpt (torch.compile reduce-overhead, lengths bucketed: CUDA graph trees
# that set their pool back to checkpoints) and check with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36b; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
rec() { local t0=$(date +%s); timeout 170 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec compiled_gpt
rec compiled_gpt --alloc-conf expandable_segments:True
rec compiled_gpt --set train=1
for f in $O/*.json; do python3 -c "
import json,sys,collections; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'calls', collections.Counter(c['call'] for c in d['calls']), [(c['at'], c.get('end')) for c in d['calls'] if c['call']=='set_checkpoint_pool_state'])" $f >> $OUT/calls.txt; done
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s36b.tar.xz . && rm -rf $OUT/* && mv /tmp/s36b.tar.xz $OUT/
tar -xJOf $OUT/s36b.tar.xz ./fidelity.csv ./fidelity.err ./record.log ./calls.txt 2>/dev/null | grep -v Warning | grep -v "warnings.warn" | head -60
