#!/bin/bash
# s35v: GPU validation of the session's final build.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
COMMIT=${COMMIT:-unknown} OUT=$OUT/v bash tools/gpu/validate.sh /tmp/allocsim > $OUT/validate.log 2>&1
cp $OUT/v/summary.txt $OUT/summary.txt
cat $OUT/summary.txt
