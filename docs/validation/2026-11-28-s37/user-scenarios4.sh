#!/bin/bash
# s37g: users' own scripts round 4 (compiled with a ring buffer, compiled transformer
# with sequence buckets, inference_mode with expandable segments), one tar.
set -u
R=.device-carry/rel
O=/tmp/s37g; rm -rf $O; mkdir -p $O
date -u > $O/date.txt
u() {
  c=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$c/i TRITON_CACHE_DIR=$c/t timeout 200 env "$@" >> $O/run.log 2>&1
  echo "rc=$? $*" >> $O/run.log
}
u python3 $R/user_scenarios4.py $O/compiled_ring.pickle compiled_ring
u python3 $R/user_scenarios4.py $O/compiled_seq.pickle compiled_seq
u PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_scenarios4.py $O/inference_mode__expandable.pickle inference_mode
u python3 $R/user_scenarios4.py $O/inference_mode.pickle inference_mode
cd $O && tar cJf $OUT/s37g.tar.xz .
grep rc= $O/run.log; ls -la $O
