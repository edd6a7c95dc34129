#!/bin/bash
# s35c: record compiled_graphs (torch.compile reduce-overhead: CUDA graph trees) and check with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s35c; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
python3 -c "import triton; print('triton', triton.__version__)" > $OUT/triton.txt 2>&1
rec() { local t0=$(date +%s); timeout 240 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec compiled_graphs
rec compiled_graphs --set batches=16
rec compiled_graphs --set batches=16 --set train=1
rec compiled_graphs --set batches=16 --alloc-conf expandable_segments:True
rec mempool_phases
rec graph_capture
for f in $O/*.json; do python3 -c "
import json,sys,collections; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'windows', collections.Counter((w['kind'],w['scope']) for w in d['pool_windows']), 'releases', collections.Counter(r['how'] for r in d['pool_releases']), 'calls', collections.Counter(c['call'] for c in d['calls']), 'attr', d['pool_attribution']['methods'], 'disagree', d['pool_attribution']['window_disagreements'])" $f >> $OUT/windows.txt; done
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; $A replay $f > $OUT/replay-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s35c.tar.xz . && rm -rf $OUT/* && mv /tmp/s35c.tar.xz $OUT/
