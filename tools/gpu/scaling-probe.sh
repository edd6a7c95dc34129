#!/usr/bin/env bash
# Why `compare` scales as it does on a many-core host: the host's cores (simultaneous
# multithreading or not), the ceiling that independent processes reach on the same
# work, and threads against processes, with each run's CPU time, page faults and
# context switches. Each build given is measured in turn, all on the same traces.
# Needs /usr/bin/time (GNU time).
# Usage: OUT=DIR tools/gpu/scaling-probe.sh PATH/TO/allocsim [PATH/TO/another-allocsim...]
#   SCALE_EVENTS  events per trace (default 1000000); ROUNDS (default 2)
#   ENVS  extra environments to run the first build under, separated by ";"
#         (e.g. "GLIBC_TUNABLES=glibc.malloc.arena_max=1")
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim [PATH/TO/allocsim...]" 1 8 "$@"
W=$(mktemp -d)
exec > >(tee -a "$OUT/scaling.txt") 2>&1
date -u; nproc
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L2|L3)' || true
echo "smt active: $(cat /sys/devices/system/cpu/smt/active 2>/dev/null || echo unknown)"
A=$(gpu_abs "$1")
EV=${SCALE_EVENTS:-1000000}
for s in $(seq 1 16); do "$A" generate random --seed "$s" --events "$EV" -o "$W/b$s.csv" >/dev/null 2>&1; done
P=caching,immediate,buddy,arena
# One timed command: wall, user, system, minor faults, involuntary and voluntary switches.
timed() {
    local label=$1
    shift
    /usr/bin/time -f "$label wall_s=%e user_s=%U sys_s=%S minor_faults=%R invol_cs=%c vol_cs=%w peak_kb=%M" "$@" >/dev/null 2>>"$W/time.txt"
    tail -1 "$W/time.txt"
}
probe() {
    local name=$1 bin=$2 r th i
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for th in 1 8 16; do
            RAYON_NUM_THREADS=$th timed "$name round=$r threads=$th compare-64" \
                "$bin" compare "$W"/b*.csv --policies $P --format csv -o "$W/c-$th.csv"
        done
        # 8 threads pinned to one logical CPU of each of 8 cores where the host has SMT
        # (CPUs 0-7 otherwise), then the same 64 jobs as 16 processes of one thread each.
        RAYON_NUM_THREADS=8 timed "$name round=$r threads=8-pinned-0-7 compare-64" \
            taskset -c 0-7 "$bin" compare "$W"/b*.csv --policies $P --format csv -o "$W/c-p.csv"
        local s e pids=()
        s=$EPOCHREALTIME
        for i in $(seq 1 16); do
            RAYON_NUM_THREADS=1 /usr/bin/time -f "%U %S %R" -o "$W/p$i.time" \
                "$bin" compare "$W/b$i.csv" --policies $P --format csv -o "$W/p$i.csv" >/dev/null 2>&1 &
            pids+=($!)
        done
        # The pids only: a bare `wait` also waits for the output's `tee`, never ending.
        wait "${pids[@]}"
        e=$EPOCHREALTIME
        echo "$name round=$r processes=16x1 compare-4-each wall_s=$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.2f", e - s }')" \
            "user_s=$(cat "$W"/p*.time | awk '{ u += $1 } END { print u }')" \
            "sys_s=$(cat "$W"/p*.time | awk '{ u += $2 } END { print u }')" \
            "minor_faults=$(cat "$W"/p*.time | awk '{ u += $3 } END { print u }')"
        cmp -s "$W/c-1.csv" "$W/c-16.csv" || echo "$name: output differs between 1 and 16 threads"
    done
}
i=0
for b in "$@"; do
    i=$((i + 1))
    probe "build$i($(basename "$b"))" "$(gpu_abs "$b")"
done
IFS=';' read -ra envs <<< "${ENVS:-}"
for e in "${envs[@]}"; do
    [ -n "$e" ] || continue
    # shellcheck disable=SC2163
    (export "$e"; probe "build1+$e" "$A")
done
rm -rf "$W"
