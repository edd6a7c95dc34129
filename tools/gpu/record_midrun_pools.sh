#!/usr/bin/env bash
# Records runs with private pools that start mid-run: a ring buffer (--max-entries) that
# wrapped while CUDA graphs' pools or a torch.cuda.MemPool held segments, so that the
# first recorded entry finds private pools in use (docs/recording.md, "Private pools").
# For each workload an unwrapped run first (tag `full`: its checkpoints give the trace
# positions), then ring buffers sized so that the trace starts halfway between two
# checkpoints:
#   - graph_capture (and expandable_segments, and shared_pool=1): during the replays,
#     after every capture (pools hold the graphs' memory, no window open), and during
#     the capture of the second batch (a window open at the first entry);
#   - mempool_phases (and expandable_segments): between the first pool phase and the
#     second default phase (the pool holds survivors and cached segments), and inside
#     the second pool phase (its window open at the first entry); use_on_oom=1 under
#     the cap of record_pools.sh, starting after the first pool phase;
#   - kv_cache_inference --set graphs=1: after the captures, and during the second.
#
# Usage: OUT=DIR tools/gpu/record_midrun_pools.sh
# Needs one idle GPU and python3 with torch; writes DIR/*.json and *.pickle, DIR/log.txt
# (one line per recording) and DIR/errors.log. About three minutes on an H200.
set -uo pipefail

. "$(dirname "$0")/common.sh"
gpu_setup "" 0 0 "$@"
record_setup

# Ring-buffer length that starts the trace halfway between checkpoints A and B of FILE:
# wrap FILE LABEL_A LABEL_B
wrap() {
    python3 - "$@" <<'EOF'
import json, sys
path, a, b = sys.argv[1:4]
d = json.load(open(path))
pos = {c["label"]: c["trace_len"] for c in d["checkpoints"]}
print(pos["final"] - (pos[a] + pos[b]) // 2)
EOF
}

for conf in "" expandable_segments:True; do
    a=()
    [ -n "$conf" ] && a=(--alloc-conf "$conf")
    t=${conf:+__${conf//:/-}}
    record graph_capture "${a[@]}" --tag full
    g=$OUT/graph_capture${t}__full.json
    if [ -f "$g" ]; then
        record graph_capture "${a[@]}" --max-entries "$(wrap "$g" captured_b32 replay0)"
        record graph_capture "${a[@]}" --max-entries "$(wrap "$g" captured_b1 captured_b8)"
    fi
    record mempool_phases "${a[@]}" --tag full
    m=$OUT/mempool_phases${t}__full.json
    if [ -f "$m" ]; then
        record mempool_phases "${a[@]}" --max-entries "$(wrap "$m" after0 default1)"
        record mempool_phases "${a[@]}" --max-entries "$(wrap "$m" default1 pool1)"
    fi
done
record graph_capture --set shared_pool=1 --tag full
g=$OUT/graph_capture__shared_pool-1__full.json
[ -f "$g" ] && record graph_capture --set shared_pool=1 --max-entries "$(wrap "$g" captured_b1 replay0)"
m=$OUT/mempool_phases__full.json
if [ -f "$m" ]; then
    cap=$(mid "$m" pool0 default1)
    record mempool_phases --set use_on_oom=1 --cap "$cap" --tag full
    u=$OUT/mempool_phases__use_on_oom-1__cap$((cap >> 20))M__full.json
    [ -f "$u" ] && record mempool_phases --set use_on_oom=1 --cap "$cap" --max-entries "$(wrap "$u" after0 default1)"
fi
record kv_cache_inference --set graphs=1 --tag full
k=$OUT/kv_cache_inference__graphs-1__full.json
if [ -f "$k" ]; then
    record kv_cache_inference --set graphs=1 --max-entries "$(wrap "$k" captured_b8 round0_prefill)"
    record kv_cache_inference --set graphs=1 --max-entries "$(wrap "$k" captured_b1 captured_b4)"
fi
echo "recorded $(ls "$OUT"/*.json 2>/dev/null | wc -l) runs; errors: $(wc -l <"$OUT/errors.log")"
