#!/bin/bash
# s37d: users' own scripts (no recorder), one snapshot each, PyTorch's default history.
set -u
R=.device-carry/rel
date -u > $OUT/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/date.txt
for s in graph mempool train_empty_cache gc_fraction; do
  python3 $R/user_scenarios.py $OUT/$s.pickle $s >> $OUT/run.log 2>&1; echo "rc=$? $s" >> $OUT/run.log
done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_scenarios.py $OUT/expandable_empty_cache.pickle expandable_empty_cache >> $OUT/run.log 2>&1; echo "rc=$? expandable" >> $OUT/run.log
PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.5 python3 $R/user_scenarios.py $OUT/gc_fraction__gc.pickle gc_fraction >> $OUT/run.log 2>&1; echo "rc=$? gc" >> $OUT/run.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_scenarios.py $OUT/graph__expandable.pickle graph >> $OUT/run.log 2>&1; echo "rc=$? graph expandable" >> $OUT/run.log
for f in $OUT/*.pickle; do xz -9 $f; done
ls -la $OUT >> $OUT/run.log
tail -20 $OUT/run.log
