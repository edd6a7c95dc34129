#!/bin/bash
# s37b: a user's own compiled scripts' snapshots (PyTorch's default memory history:
# context all, stacks all), then the GPU validation of the build.
set -u
R=.device-carry/rel
date -u > $OUT/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/date.txt
mkdir -p $OUT/user
u() {
  c=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$c/i TRITON_CACHE_DIR=$c/t timeout 200 env "$@" >> $OUT/user/run.log 2>&1
  echo "rc=$? $*" >> $OUT/user/run.log
}
u python3 $R/user_compiled.py $OUT/user/cnn_train.pickle train
u PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_compiled.py $OUT/user/cnn_train__expandable.pickle train
u python3 $R/user_compiled.py $OUT/user/cnn_infer.pickle infer
for f in $OUT/user/*.pickle; do xz -9 $f; done
date -u >> $OUT/date.txt
bash $R/s35v.sh
date -u >> $OUT/date.txt
