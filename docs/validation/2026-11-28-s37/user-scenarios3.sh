#!/bin/bash
# s37f: still more users' own scripts (no recorder), one snapshot each, one tar.
set -u
R=.device-carry/rel
O=/tmp/s37f; rm -rf $O; mkdir -p $O
date -u > $O/date.txt
for s in no_frames amp kv_server shared_pool_graphs mempool_deleted; do
  timeout 200 python3 $R/user_scenarios3.py $O/$s.pickle $s >> $O/run.log 2>&1; echo "rc=$? $s" >> $O/run.log
done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,garbage_collection_threshold:0.6 python3 $R/user_scenarios3.py $O/kv_server__expandable_gc.pickle kv_server >> $O/run.log 2>&1; echo "rc=$? kv expandable gc" >> $O/run.log
cd $O && tar cJf $OUT/s37f.tar.xz .
grep rc= $O/run.log; ls -la $O
