#!/bin/bash
# s37c: a user's script with torch.cuda.empty_cache() right before an allocation that
# needs a new segment, no private pool (default stacks, python stacks, expandable).
set -u
R=.device-carry/rel
date -u > $OUT/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/date.txt
python3 -c "import torch; print(torch.__version__)" >> $OUT/date.txt
python3 $R/user_empty_cache.py $OUT/empty_cache.pickle > $OUT/run.log 2>&1; echo "rc=$?" >> $OUT/run.log
python3 $R/user_empty_cache.py $OUT/empty_cache__python.pickle python >> $OUT/run.log 2>&1; echo "rc=$?" >> $OUT/run.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $R/user_empty_cache.py $OUT/empty_cache__expandable.pickle >> $OUT/run.log 2>&1; echo "rc=$?" >> $OUT/run.log
ls -la $OUT >> $OUT/run.log
cat $OUT/run.log
