#!/usr/bin/env bash
# Why the batch commands scale as they do on a many-core host: the host's cores
# (simultaneous multithreading or not), the ceiling that independent processes reach on
# the same work, and threads against processes, with each run's CPU time, page faults
# and context switches. The builds given take turns (round 1: each build, round 2: each
# build, ...), all on the same traces, and every output is compared between the builds
# and between thread counts.
# Needs /usr/bin/time (GNU time) and taskset.
# Usage: OUT=DIR tools/gpu/scaling-probe.sh PATH/TO/allocsim [PATH/TO/another-allocsim...]
#   SCALE_EVENTS  events per trace of `compare` (default 1000000); ROUNDS (default 2)
#   PARTS    any of compare, fit, sweep (default "compare"): the 64 jobs (16 random
#            traces x caching, immediate, buddy, arena) as one `compare`, `fit` or
#            `sweep` on each of THREADS, and as 16 processes of one thread each (one
#            trace each)
#   THREADS  thread counts (default "1 2 16"); N threads are pinned to CPUs 0..N-1
#            (taskset), so 2 is two cores of the host, not two threads on 16 cores
#   FIT_EVENTS  events per trace of `fit` and `sweep` (default 100000: each of their
#            jobs is a bisection of a dozen replays or more)
#   ENVS  extra environments to run the first build under, separated by ";"
#         (e.g. "GLIBC_TUNABLES=glibc.malloc.arena_max=1")
# Each timed run prints one line: build, round, part, threads (or processes=16x1), wall,
# user and system seconds, minor faults, switches, peak RSS.
# Run on the 16-core GPU machine, old against new: compare, fit and sweep at 1e6 (1e5
# for fit and sweep) in two rounds, then compare at 4e6 in one (about 5 minutes;
# docs/performance.md, "Batches on many cores, late night"):
#   for n in 1000000 4000000; do SCALE_EVENTS=$n ROUNDS=$([ $n = 1000000 ] && echo 2 || echo 1) \
#     PARTS=$([ $n = 1000000 ] && echo "compare fit sweep" || echo compare) \
#     OUT=out tools/gpu/scaling-probe.sh .device-carry/rel/allocsim-old .device-carry/rel/allocsim; done
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
FEV=${FIT_EVENTS:-100000}
PARTS=${PARTS:-compare}
THREADS=${THREADS:-1 2 16}
P=caching,immediate,buddy,arena
echo "parts: $PARTS; threads: $THREADS; compare traces: 16 x $EV events; fit and sweep traces: 16 x $FEV events"
gen() {
    local n=$1 prefix=$2 s pids=()
    for s in $(seq 1 16); do
        "$A" generate random --seed "$s" --events "$n" -o "$W/$prefix$s.csv" >/dev/null 2>&1 &
        pids+=($!)
    done
    # The pids only: a bare `wait` also waits for the output's `tee`, never ending.
    wait "${pids[@]}"
}
case " $PARTS " in *" compare "*) gen "$EV" b ;; esac
case " $PARTS " in *" fit "* | *" sweep "*) gen "$FEV" f ;; esac
printf 'policies:\n  - caching\n  - immediate\n  - buddy\n  - arena\n' >"$W/grid.yaml"
# One timed command: wall, user, system, minor faults, involuntary and voluntary switches.
timed() {
    local label=$1
    shift
    /usr/bin/time -f "$label wall_s=%e user_s=%U sys_s=%S minor_faults=%R invol_cs=%c vol_cs=%w peak_kb=%M" "$@" >/dev/null 2>>"$W/time.txt"
    tail -1 "$W/time.txt"
}
# The command of part $1 on the traces $2..., writing CSV to $OUT_CSV.
part_cmd() {
    local part=$1 bin=$2
    shift 2
    case $part in
        compare) echo "$bin" compare "$@" --policies $P --format csv -o "$OUT_CSV" ;;
        fit) echo "$bin" fit "$@" --policies $P --format csv -o "$OUT_CSV" ;;
        sweep)
            local t args=()
            for t in "$@"; do args+=(--trace "$t"); done
            echo "$bin" sweep "$W/grid.yaml" "${args[@]}" --format csv -o "$OUT_CSV"
            ;;
    esac
}
probe() {
    local name=$1 bin=$2 r=$3 part th i prefix
    for part in $PARTS; do
        prefix=b
        [ "$part" = compare ] || prefix=f
        for th in $THREADS; do
            OUT_CSV="$W/$name-$part-$th.csv"
            # shellcheck disable=SC2046
            RAYON_NUM_THREADS=$th timed "$name round=$r $part threads=$th" \
                taskset -c "0-$((th - 1))" $(part_cmd "$part" "$bin" "$W/$prefix"{1..16}.csv)
        done
        local s e pids=()
        s=$EPOCHREALTIME
        for i in $(seq 1 16); do
            OUT_CSV="$W/$name-$part-p$i.csv"
            # shellcheck disable=SC2046
            RAYON_NUM_THREADS=1 /usr/bin/time -f "%U %S %R" -o "$W/p$i.time" \
                $(part_cmd "$part" "$bin" "$W/$prefix$i.csv") >/dev/null 2>&1 &
            pids+=($!)
        done
        # The pids only: a bare `wait` also waits for the output's `tee`, never ending.
        wait "${pids[@]}"
        e=$EPOCHREALTIME
        echo "$name round=$r $part processes=16x1 wall_s=$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.2f", e - s }')" \
            "user_s=$(cat "$W"/p*.time | awk '{ u += $1 } END { print u }')" \
            "sys_s=$(cat "$W"/p*.time | awk '{ u += $2 } END { print u }')" \
            "minor_faults=$(cat "$W"/p*.time | awk '{ u += $3 } END { print u }')"
        # Every thread count's output against the first build's with one thread.
        for th in $THREADS; do
            cmp -s "$W/build1-$part-1.csv" "$W/$name-$part-$th.csv" 2>/dev/null ||
                [ ! -e "$W/build1-$part-1.csv" ] ||
                echo "$name round=$r $part threads=$th: output differs from build1's on 1 thread"
        done
    done
}
for r in $(seq 1 "${ROUNDS:-2}"); do
    i=0
    for b in "$@"; do
        i=$((i + 1))
        echo "build$i = $b"
        probe "build$i" "$(gpu_abs "$b")" "$r"
    done
    IFS=';' read -ra envs <<< "${ENVS:-}"
    for e in "${envs[@]}"; do
        [ -n "$e" ] || continue
        # shellcheck disable=SC2163
        (export "$e"; probe "build1+$e" "$A" "$r")
    done
done
rm -rf "$W"
