#!/usr/bin/env bash
# GPU-machine benchmarks: allocsim's replay core per policy (allocsim bench), allocsim
# end to end (1e5..1e8 events, with peak memory) vs PyTorch's allocator (Python and
# native) on the same CSV traces, and batch scaling of `compare` over 1..16 threads.
# Needs /usr/bin/time (GNU time) for the peak memory, and about 4 GB of disk in $TMPDIR.
# Usage: OUT=DIR tools/gpu/compare-torch.sh PATH/TO/allocsim (a release build; needs python3 with torch and g++)
# Everything takes longer than one 600 s device call; choose with
#   PARTS    any of "core e2e scaling" (default all three)
#   LENGTHS  the end-to-end trace lengths (default "100000 1000000 10000000 100000000")
#   SCALE_EVENTS  events per trace of the scaling part (default 1000000)
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim" 1 1 "$@"
A=$(gpu_abs "$1")
D=$ROOT/tools/gpu W=$(mktemp -d)
exec > >(tee -a "$OUT/bench.txt") 2>&1
date -u; nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch;print("torch", torch.__version__)'
TORCH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
g++ -O2 -std=c++17 "$D/native_replay.cpp" -I"$TORCH/include" -I/usr/local/cuda/include \
  -L"$TORCH/lib" -lc10 -lc10_cuda -Wl,-rpath,"$TORCH/lib" -o "$W/native" 2>&1 | tail -5
# The replay core alone (trace in memory), per policy: allocsim bench on its generated
# traces (1e5 and 1e6 events; CPU time of the thread, median of 5 after a warm-up).
PARTS=" ${PARTS:-core e2e scaling} "
part() { [[ $PARTS == *" $1 "* ]]; }
part core && "$A" bench --runs 5 --format csv
# End to end (read, validate, replay; a CSV streams: memory follows the live
# allocations), best of 3 by the wall clock, with the peak RSS of the best run's process.
# PyTorch replays stop at 1e7 (1e8 from Python would take half an hour).
part e2e || LENGTHS=""
# shellcheck disable=SC2086
for n in ${LENGTHS-100000 1000000 10000000 100000000}; do
  "$A" generate random --seed 1 --events $n -o "$W/t$n.csv" >/dev/null 2>&1
  ev=$(($(wc -l < "$W/t$n.csv") - 1))
  for p in caching immediate buddy arena; do
    best=; rss=
    for r in 1 2 3; do
      s=$EPOCHREALTIME
      /usr/bin/time -f "%M" -o "$W/rss" "$A" replay "$W/t$n.csv" --policy $p > /dev/null 2>"$W/err" || { echo "replay failed: $(head -1 $W/err)"; }
      e=$EPOCHREALTIME
      new=$(awk -v s=$s -v e=$e -v b="$best" 'BEGIN { t = e - s; if (b == "" || t < b) print t; else print "" }')
      [ -n "$new" ] && { best=$new; rss=$(tail -1 "$W/rss"); }
    done
    echo "allocsim-e2e $n events=$ev policy=$p best_s=$best events_per_s=$(awk -v n=$ev -v t=$best 'BEGIN { printf "%.0f", n / t }') peak_rss_kb=$rss"
  done
  if [ $n -le 10000000 ]; then
    timeout 200 python3 "$D/torch_replay.py" "$W/t$n.csv" 3
    [ -x "$W/native" ] && timeout 100 "$W/native" "$W/t$n.csv" 3
  fi
  rm -f "$W/t100000000.csv"
done
# batch scaling: 64 jobs (16 traces x 4 policies) of SCALE_EVENTS events
part scaling || exit 0
echo "scaling: 16 traces of ${SCALE_EVENTS:-1000000} events"
for s in $(seq 1 16); do "$A" generate random --seed $s --events "${SCALE_EVENTS:-1000000}" -o "$W/b$s.csv" >/dev/null 2>&1; done
for th in 1 2 4 8 16; do
  s=$EPOCHREALTIME
  RAYON_NUM_THREADS=$th "$A" compare "$W"/b*.csv --policies caching,immediate,buddy,arena --format csv -o "$W/c$th.csv" >/dev/null 2>&1
  e=$EPOCHREALTIME; echo "compare-64-jobs threads=$th wall_s=$(awk -v s=$s -v e=$e 'BEGIN { print e - s }')"
done
cmp "$W/c1.csv" "$W/c16.csv" && echo "compare output identical for 1 and 16 threads"
