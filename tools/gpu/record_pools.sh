#!/usr/bin/env bash
# Records the private-pool runs the first GPU session could not check (docs/recording.md,
# "Verified on the first GPU run"): caps chosen from an uncapped run's checkpoints so that
#   - mempool_phases runs out in a *default-pool* phase while the MemPool holds free
#     blocks (between the checkpoints pool0 and default1), with use_on_oom=0 and =1: the
#     use_on_oom fallback (try_mempool_fallback) is exercised, which the 70 % cap of the
#     first session was not (it ran out inside the first pool phase);
#   - graph_capture runs out during a capture (between captured_b1 and captured_b8: no
#     cache release and no retry while a capture is under way) and during the eager work
#     between replays (between captured_b32 and replay0), with and without expandable
#     segments;
#   - kv_cache_inference --set graphs=1 runs out while capturing its largest graph and in
#     its second round.
#
# Usage: OUT=DIR tools/gpu/record_pools.sh
# Reads the repository only (tools/record_torch.py); needs one idle GPU and python3 with
# torch 2.11. Writes DIR/*.json and *.pickle (names as docs/recording.md says), DIR/log.txt
# (one line per recording) and DIR/errors.log. About two minutes on an H100.
set -uo pipefail

. "$(dirname "$0")/common.sh"
gpu_setup "" 0 0 "$@"
record_setup

for conf in "" expandable_segments:True; do
    a=()
    [ -n "$conf" ] && a=(--alloc-conf "$conf")
    t=${conf:+__${conf//:/-}}
    # Uncapped runs give the checkpoints the caps come from (the first session has the
    # same runs; recording them again here keeps the caps right for this GPU and build).
    record mempool_phases "${a[@]}" --tag uncapped
    record graph_capture "${a[@]}" --tag uncapped
    record kv_cache_inference "${a[@]}" --set graphs=1 --tag uncapped
    m=$OUT/mempool_phases${t}__uncapped.json
    g=$OUT/graph_capture${t}__uncapped.json
    k=$OUT/kv_cache_inference__graphs-1${t}__uncapped.json
    if [ -f "$m" ]; then
        cap=$(mid "$m" pool0 default1)
        record mempool_phases "${a[@]}" --cap "$cap"
        record mempool_phases "${a[@]}" --set use_on_oom=1 --cap "$cap"
    fi
    if [ -f "$g" ]; then
        record graph_capture "${a[@]}" --cap "$(mid "$g" captured_b1 captured_b8)"
        record graph_capture "${a[@]}" --cap "$(mid "$g" captured_b32 replay0)"
    fi
    if [ -f "$k" ]; then
        record kv_cache_inference "${a[@]}" --set graphs=1 --cap "$(mid "$k" captured_b4 captured_b8)"
        record kv_cache_inference "${a[@]}" --set graphs=1 --cap "$(mid "$k" round0_decoded round1_prefill)"
    fi
done
echo "recorded $(ls "$OUT"/*.json 2>/dev/null | wc -l) runs; errors: $(wc -l <"$OUT/errors.log")"
