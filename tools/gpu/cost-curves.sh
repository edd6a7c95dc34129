#!/usr/bin/env bash
# Cost against trace length and against the number of live allocations (issue 12), for
# every policy, in one run: docs/performance.md, "Cost against length and live
# allocations". Needs no GPU (run it on the GPU machine for its quiet cores), GNU time
# and taskset.
#
# Usage: OUT=DIR tools/gpu/cost-curves.sh PATH/TO/allocsim
#   LENGTHS  events of the length series (default "10000 100000 1000000 10000000
#            100000000"): `generate random --seed 1` (log-uniform 512 B to 256 MiB, mean
#            lifetime 50 events: about 25 allocations live)
#   LIFETIMES  mean lifetimes of the live series (default "20 200 2000 20000 200000
#            2000000"): 10^6 events of `generate random --seed 1 --min-bytes 512
#            --max-bytes 64KiB --mean-lifetime L` (small requests, so that 10^5 and more
#            live allocations fit the default 80 GiB device); the mean number live over
#            the trace is counted from the trace itself
#   ROUNDS   end-to-end runs of each (trace, policy), the best one kept (default 3)
#   CORE     the CPU every run is pinned to (default 5)
#   BENCH_MAX  the longest trace `bench` replays in memory (default 20000000: it holds
#            the trace, about 40 bytes per event)
# Output: $OUT/curves.csv, one row per (series, trace, policy): series (length or live),
# events, mean_live (allocations live on average over the events), policy,
# e2e_cpu_s (best of ROUNDS: `replay T.csv --policy P`, read, validate, replay,
# summary), e2e_events_per_s, peak_rss_kb, core_events_per_s (`bench T --runs 5`'s
# median: the trace in memory, replay only; empty above BENCH_MAX).
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim" 1 1 "$@"
A=$(gpu_abs "$1")
LENGTHS=${LENGTHS:-"10000 100000 1000000 10000000 100000000"}
LIFETIMES=${LIFETIMES:-"20 200 2000 20000 200000 2000000"}
ROUNDS=${ROUNDS:-3}
CORE=${CORE:-5}
BENCH_MAX=${BENCH_MAX:-20000000}
POLICIES="caching immediate buddy arena"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pin() { taskset -c "$CORE" "$@"; }
CSV=$OUT/curves.csv
echo "series,events,mean_live,policy,e2e_cpu_s,e2e_events_per_s,peak_rss_kb,core_events_per_s" >"$CSV"
{
    echo "date: $(date -u +%FT%TZ); $(nproc) cores; $(lscpu | grep -m1 'Model name' | sed 's/  */ /g')"
    echo "allocsim: $("$A" --version); commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$OUT/machine.txt"

# Allocations live on average over the events of CSV trace $1 (alloc +1, free -1).
mean_live() {
    awk -F, 'NR > 1 { if ($1 == "alloc") live++; else if ($1 == "free") live--; sum += live; n++ }
             END { printf "%.1f", n ? sum / n : 0 }' "$1"
}

# One (series, trace): every policy end to end (best of ROUNDS) and in memory.
measure() {
    local series=$1 trace=$2
    local events live
    events=$(($(wc -l <"$trace") - 1))
    live=$(mean_live "$trace")
    local core=""
    if [ "$events" -le "$BENCH_MAX" ]; then
        pin "$A" bench "$trace" --policies "$(echo $POLICIES | tr ' ' ,)" --runs 5 --format csv \
            >"$W/bench.csv" 2>/dev/null
    else
        : >"$W/bench.csv"
    fi
    for p in $POLICIES; do
        local best="" best_rss=""
        for _ in $(seq 1 "$ROUNDS"); do
            /usr/bin/time -f "%U %S %M" -o "$W/t" taskset -c "$CORE" "$A" replay "$trace" \
                --policy "$p" >/dev/null 2>"$W/err" || { echo "replay $trace $p failed:"; cat "$W/err"; }
            read -r u s m <"$W/t"
            local cpu
            cpu=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
            if [ -z "$best" ] || awk -v a="$cpu" -v b="$best" 'BEGIN { exit !(a < b) }'; then
                best=$cpu best_rss=$m
            fi
        done
        core=$(awk -F, -v p="$p" 'NR > 1 && $3 == p { print $8 }' "$W/bench.csv")
        local rate
        rate=$(awk -v e="$events" -v c="$best" 'BEGIN { if (c > 0) printf "%.0f", e / c }')
        echo "$series,$events,$live,$p,$best,$rate,$best_rss,$core" | tee -a "$CSV"
    done
}

for n in $LENGTHS; do
    "$A" generate random --seed 1 --events "$n" -o "$W/len.csv" >/dev/null 2>&1
    measure length "$W/len.csv"
    rm -f "$W/len.csv"
done
for l in $LIFETIMES; do
    "$A" generate random --seed 1 --events 1000000 --min-bytes 512 --max-bytes 64KiB \
        --mean-lifetime "$l" -o "$W/live.csv" >/dev/null 2>&1
    measure live "$W/live.csv"
    rm -f "$W/live.csv"
done
echo "date: $(date -u +%FT%TZ)" >>"$OUT/machine.txt"
