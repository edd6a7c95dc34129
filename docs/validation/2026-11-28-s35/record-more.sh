#!/bin/bash
# s35d: record checkpointed_train and stream_pipeline and check them with allocsim fidelity.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s35d; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
rec() { local t0=$(date +%s); timeout 200 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; }
rec checkpointed_train
rec checkpointed_train --alloc-conf expandable_segments:True
rec checkpointed_train --alloc-conf max_split_size_mb:128,garbage_collection_threshold:0.8 --cap 3G
rec stream_pipeline
rec stream_pipeline --alloc-conf expandable_segments:True
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for w in checkpointed_train stream_pipeline; do
  for b in $O/$w*.json; do for a in $O/$w*.json; do
    [ "$a" = "$b" ] && continue
    $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
  done; done
done
for f in $O/*.json; do $A fidelity $f --explain > $OUT/explain-$(basename $f .json).txt 2>&1; done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s35d.tar.xz . && rm -rf $OUT/* && mv /tmp/s35d.tar.xz $OUT/
