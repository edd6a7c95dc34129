#!/bin/bash
# s37e: more users' own scripts (no recorder), one snapshot each; packed in one tar.
set -u
R=.device-carry/rel
O=/tmp/s37e; rm -rf $O; mkdir -p $O
date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $O/date.txt
for s in ring oom_continue ckpt compile_default graphed raw; do
  c=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$c/i TRITON_CACHE_DIR=$c/t timeout 200 python3 $R/user_scenarios2.py $O/$s.pickle $s >> $O/run.log 2>&1; echo "rc=$? $s" >> $O/run.log
done
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4 python3 $R/user_scenarios2.py $O/config.pickle config >> $O/run.log 2>&1; echo "rc=$? config" >> $O/run.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_scenarios2.py $O/ring__expandable.pickle ring >> $O/run.log 2>&1; echo "rc=$? ring expandable" >> $O/run.log
cd $O && tar cJf $OUT/s37e.tar.xz .
grep rc= $O/run.log; ls -la $O
