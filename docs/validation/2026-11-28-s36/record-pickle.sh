#!/bin/bash
# s36f: a snapshot pickle of a compiled run with pool restores, with stack traces as
# users record them (context all, python frames), to see what marks a restore's entries.
set -u
R=.device-carry/rel
O=/tmp/s36f; rm -rf $O; mkdir -p $O
date -u > $OUT/date.txt
c=$(mktemp -d)
TORCHINDUCTOR_CACHE_DIR=$c/i TRITON_CACHE_DIR=$c/t timeout 150 python3 $R/record_torch.py compiled_graphs --set batches=4,16 --set calls=3 --pickle --context all --stacks python $O > $OUT/record.log 2>&1
echo "rc=$?" >> $OUT/record.log
ls -la $O >> $OUT/record.log
python3 - $O >> $OUT/frames.txt 2>&1 <<'PY'
import pickle, sys, glob, json
p = glob.glob(sys.argv[1] + "/*.pickle")[0]
s = pickle.load(open(p, "rb"))
tr = s["device_traces"][0]
print("entries", len(tr), "keys", sorted(tr[0].keys()))
d = json.load(open(glob.glob(sys.argv[1] + "/*.json")[0]))
calls = [c for c in d["calls"] if c["call"] == "set_checkpoint_pool_state"]
print("calls", calls)
for i, e in enumerate(tr):
    names = [f.get("name") for f in e.get("frames", [])]
    if any("checkpoint" in (n or "").lower() for n in names):
        print(i, e["action"], e.get("addr"), e.get("size"), names[:6])
PY
xz -9 -c $O/*.pickle > $OUT/compiled.pickle.xz
cp $O/*.json $OUT/
head -c 3000 $OUT/frames.txt; tail -5 $OUT/record.log
