#!/bin/bash
# s36a: record torch.compile CUDA graph trees runs that set their pool back to a checkpoint
# (setCheckpointPoolState), check them with allocsim fidelity and what-ifs, then validate.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36a; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
rec() { local t0=$(date +%s); timeout 200 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec compiled_graphs
rec compiled_graphs --set train=1
rec compiled_graphs --alloc-conf expandable_segments:True
rec compiled_graphs --alloc-conf roundup_power2_divisions:4
rec compiled_graphs --set batches=2,8,32,8,128 --set layers=6
rec compiled_graphs --set batches=2,8,32,8,128 --set layers=6 --set train=1 --alloc-conf expandable_segments:True
for f in $O/*.json; do python3 -c "
import json,sys,collections; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'calls', collections.Counter(c['call'] for c in d['calls']), [(c['at'], c.get('end')) for c in d['calls'] if c['call']=='set_checkpoint_pool_state'])" $f >> $OUT/calls.txt; done
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for b in $O/compiled_graphs.json $O/compiled_graphs__*expandable*.json $O/compiled_graphs__roundup*.json; do for a in $O/compiled_graphs.json $O/compiled_graphs__expandable_segments-True.json $O/compiled_graphs__roundup*.json; do
  [ "$a" = "$b" ] && continue
  $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
done; done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; $A replay $f > $OUT/replay-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
COMMIT=${COMMIT:-unknown} OUT=$OUT/v bash tools/gpu/validate.sh /tmp/allocsim > $OUT/validate.log 2>&1
cp $OUT/v/summary.txt $OUT/summary.txt
tar -C $OUT -cJf /tmp/s36a.tar.xz . && rm -rf $OUT/* && mv /tmp/s36a.tar.xz $OUT/
tar -xJOf $OUT/s36a.tar.xz ./summary.txt ./fidelity.csv ./record.log ./calls.txt 2>/dev/null | head -80
