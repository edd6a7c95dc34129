#!/bin/bash
# s36e: what-if pairs of the compiled workloads (CUDA graph trees that restore their pool):
# each run compiles from a fresh inductor and triton cache, so that the runs under different
# settings make the same requests; then every ordered pair with allocsim fidelity --requests-from.
set -u
R=.device-carry/rel
xz -dc $R/allocsim.xz > /tmp/allocsim && chmod +x /tmp/allocsim
A=/tmp/allocsim
O=/tmp/s36e; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
rec() {
  local t0=$(date +%s) c=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton timeout 120 python3 $R/record_torch.py "$@" $O >> $OUT/record.log 2>&1
  echo "rc=$? $(( $(date +%s)-t0 ))s $*" >> $OUT/record.log; rm -rf $c
}
for w in compiled_gpt compiled_graphs; do
  rec $w
  rec $w --alloc-conf expandable_segments:True
  rec $w --alloc-conf roundup_power2_divisions:4
done
$A fidelity $O/*.json > $OUT/fidelity.csv 2> $OUT/fidelity.err
for w in compiled_gpt compiled_graphs; do
  for b in $O/$w.json $O/${w}__*.json; do for a in $O/$w.json $O/${w}__*.json; do
    [ "$a" = "$b" ] && continue
    $A fidelity $b --requests-from $a 2>>$OUT/whatif.err | tail -n +2 >> $OUT/whatif.csv
  done; done
done
cp -r $O $OUT/rec
tar -C $OUT -cJf /tmp/s36e.tar.xz . && rm -rf $OUT/* && mv /tmp/s36e.tar.xz $OUT/
tar -xJOf $OUT/s36e.tar.xz ./record.log ./fidelity.csv ./whatif.csv ./whatif.err 2>/dev/null | grep -v "Warning\|warnings.warn" | cut -c1-400 | tail -40
