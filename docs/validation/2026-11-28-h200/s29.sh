#!/bin/bash
# Pinned, alternating: 668e166 (main) against new (3a52ec1: the RMM usual line in one
# pass that finds its end, pointer names by hand): replay (streamed) and compare (whole
# log) of a 10^6-event RMM log, a caching replay of 10^7 dense CSV events (code not
# changed: a check of the host's phase); then the GPU validation of new.
R=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); cp $R/gtime /usr/bin/time 2>/dev/null
for b in main new; do xz -dc $R/allocsim-$b.xz > $W/$b; chmod +x $W/$b; done
date -u; lscpu | grep -m1 "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$W/main generate random --seed 1 --events 1000000 -o $W/r6.csv >/dev/null
$W/main generate random --seed 1 --events 10000000 -o $W/r7.csv >/dev/null
python3 - $W <<'PY'
import sys
w=sys.argv[1]; sizes={}
with open(w+'/r6.csv') as f, open(w+'/m.csv','w') as o:
    f.readline(); o.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for line in f:
        p=line.rstrip('\n').split(','); i=int(p[1]); ptr=0x7f0000000000+(i<<12)
        if p[0]=='alloc': sizes[i]=p[2]; o.write("1,10:00:00.000000,allocate,%#x,%s,0x0\n"%(ptr,p[2]))
        elif p[0]=='free': o.write("1,10:00:00.000000,free,%#x,%s,0x0\n"%(ptr,sizes.pop(i)))
PY
C=${PIN_CORE:-5}
for job in "replay m" "compare m" "replay r7"; do set -- $job; cmd=$1; t=$2
  for r in $(seq 1 ${ROUNDS:-5}); do
  order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for b in $order; do
    flag=--policy; [ $cmd = compare ] && flag=--policies
    /usr/bin/time -f "%e %U %S %M" -o $W/t taskset -c $C $W/$b $cmd $W/$t.csv $flag caching > $W/$b.out 2>&1
    echo "pinned $cmd trace=$t round=$r bin=$b $(awk '{printf "wall_s=%.2f cpu_s=%.2f peak_kb=%d", $1, $2+$3, $4}' $W/t)"
  done
  cmp -s $W/main.out $W/new.out || echo "OUTPUT DIFFERS $cmd $t"
done; done
date -u
COMMIT=${COMMIT:-new} OUT=$OUT/v tools/gpu/validate.sh $W/new > $OUT/validate.log 2>&1; echo "validate rc=$?"
cp $OUT/v/summary.txt $OUT/summary.txt; cp $OUT/v/midrun.csv $OUT/midrun.csv; date -u
