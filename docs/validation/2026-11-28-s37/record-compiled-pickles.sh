#!/bin/bash
# s37a: snapshot pickles of compiled runs whose CUDA graph trees (and their private pool)
# are still alive when the snapshot is taken (reset=0), with stack traces as users record
# them, to replay restores from a pickle's frames.
set -u
R=.device-carry/rel
O=/tmp/s37a; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/date.txt
python3 -c "import torch; print(torch.__version__)" >> $OUT/date.txt
rec() {
  c=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$c/i TRITON_CACHE_DIR=$c/t timeout 240 python3 $R/record_torch.py "$@" --pickle --context all $O >> $OUT/record.log 2>&1
  echo "rc=$? $*" >> $OUT/record.log
}
rec compiled_graphs --set batches=4,16 --set calls=3 --set reset=0
rec compiled_graphs --set batches=4,16 --set calls=3 --set reset=0 --stacks all --tag stacksall
rec compiled_graphs --set train=1 --set reset=0
rec compiled_graphs --set reset=0 --alloc-conf expandable_segments:True
rec compiled_gpt --set reset=0
rec compiled_gpt --set reset=0 --set train=1 --set seqs=128,256,512
ls -la $O >> $OUT/record.log
cd $O && tar cJf $OUT/s37a.tar.xz . 
tail -20 $OUT/record.log
