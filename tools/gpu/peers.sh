#!/usr/bin/env bash
# allocsim against DynaPipe's Python simulator of PyTorch's caching allocator
# (benches/peers/dynapipe: allocation_simulator.py as published, kSmallSize = 1 MiB),
# on the same CSV traces, one run each: the replay alone (CPU time of the replaying
# thread: `allocsim bench` for allocsim, `replay.py` for DynaPipe, the trace parsed
# before) and the whole process (wall clock and CPU of `allocsim replay T.csv --policy
# caching` against `python3 replay.py T.csv`: reading, replaying, printing). Then
# whether both find the same peaks (allocated, reserved, segments) on those traces and
# on the repository's CSV traces and examples (converted to CSV where they are YAML).
#
# Usage: OUT=DIR tools/gpu/peers.sh PATH/TO/allocsim [EVENTS...]
#   PATH/TO/allocsim  a release build of this commit (the script builds nothing)
#   EVENTS            trace lengths (default 10000 100000 1000000 10000000); each a
#                     `allocsim generate random --seed 1 --streams 2 --events N` trace
# Needs bash, python3 (nothing installed: sortedcontainers is vendored), awk and GNU
# /usr/bin/time; no GPU. About 2 minutes at the default lengths on a fast core (DynaPipe
# replays about 0.3 M events/s; the 1e7 trace is about 1 minute of it).
#
# Results in $OUT:
#   peers.csv       per length: events/s of each replay and their ratio, each process's
#                   wall and CPU seconds and their ratio, both sets of peaks, agree=yes/no
#   agreement.csv   per repository trace (examples, tests/data/traces, the recorded runs
#                   of tests/data/oracle under default settings): both sets of peaks,
#                   agree=yes/no, or why it was not compared (not a trace; an operation
#                   DynaPipe does not have: private pools, settings, ...)
#   summary.txt     the machine, then both tables' lines for people
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim [EVENTS...]" 1 100 "$@"
A=$(gpu_abs "$1")
shift
LENGTHS=("$@")
[ ${#LENGTHS[@]} -eq 0 ] && LENGTHS=(10000 100000 1000000 10000000)
DP=(python3 "$ROOT/benches/peers/dynapipe/replay.py")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
SUMMARY=$OUT/summary.txt
{
    date -u
    echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    python3 --version
    "$A" --version
    git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "commit unknown"
} >"$SUMMARY"

# field KEY LINE: the value of KEY=VALUE in a DynaPipe line
field() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k { print $2 }'; }
# allocsim's peaks of T under caching: "allocated reserved segments"
allocsim_peaks() {
    "$A" compare "$1" --policies caching --format csv 2>>"$OUT/errors.log" | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        { print $c["allocated_bytes_peak"], $c["reserved_bytes_peak"], $c["segment_count_peak"], ($c["oom_event_index"] == "" ? "none" : $c["oom_event_index"]) }'
}
# timed CMD...: runs it once, stdout to $W/out; sets WALL and CPU (user + system seconds)
timed() {
    /usr/bin/time -f "%e %U %S" -o "$W/time" "$@" >"$W/out" 2>>"$OUT/errors.log"
    read -r WALL u s <"$W/time"
    CPU=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
}

echo "events,allocsim_replay_events_per_s,dynapipe_replay_events_per_s,replay_ratio,allocsim_process_wall_s,dynapipe_process_wall_s,process_wall_ratio,allocsim_process_cpu_s,dynapipe_process_cpu_s,process_cpu_ratio,allocsim_allocated_peak,dynapipe_allocated_peak,allocsim_reserved_peak,dynapipe_reserved_peak,allocsim_segments_peak,dynapipe_segments_peak,agree" >"$OUT/peers.csv"
for n in "${LENGTHS[@]}"; do
    t=$W/r$n.csv
    "$A" generate random --seed 1 --streams 2 --events "$n" -o "$t" 2>>"$OUT/errors.log" || { echo "generate $n failed" >>"$SUMMARY"; continue; }
    ev=$(($(wc -l <"$t") - 1))
    # The replay alone: allocsim bench (a warm-up, then one timed run that repeats the
    # replay until it lasts 0.2 s); DynaPipe's driver, one replay.
    a_rate=$("$A" bench "$t" --policies caching --runs 1 --format csv 2>>"$OUT/errors.log" | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["median_events_per_second"] }')
    timed "${DP[@]}" "$t"
    d_line=$(cat "$W/out")
    d_wall=$WALL d_cpu=$CPU
    d_rate=$(field events_per_s "$d_line")
    timed "$A" replay "$t" --policy caching
    a_wall=$WALL a_cpu=$CPU
    read -r aa ar as ao <<<"$(allocsim_peaks "$t")"
    da=$(field allocated_peak "$d_line") dr=$(field reserved_peak "$d_line") ds=$(field segments_peak "$d_line")
    agree=no
    [ "$aa $ar $as" = "$da $dr $ds" ] && agree=yes
    awk -v OFS=, -v ev="$ev" -v ar="$a_rate" -v dr="$d_rate" -v aw="$a_wall" -v dw="$d_wall" -v ac="$a_cpu" -v dc="$d_cpu" \
        -v rest="$aa,$da,$ar,$dr,$as,$ds,$agree" 'function q(a, b) { return (a > 0 && b > 0) ? sprintf("%.1f", b / a) : "" }
        BEGIN { print ev, ar, dr, q(dr, ar), aw, dw, q(aw, dw), ac, dc, q(ac, dc), rest }' >>"$OUT/peers.csv"
    rm -f "$t"
done

# Agreement on the repository's traces: the examples, the hand-written traces and the
# recorded PyTorch runs under default settings (tests/data/oracle; their recorded
# addresses and settings do not go into a CSV, so both replay the requests alone). Each
# is converted to CSV, then both replay it.
echo "trace,allocsim_allocated_peak,dynapipe_allocated_peak,allocsim_reserved_peak,dynapipe_reserved_peak,allocsim_segments_peak,dynapipe_segments_peak,allocsim_oom_event,agree" >"$OUT/agreement.csv"
for f in "$ROOT"/examples/*.csv "$ROOT"/examples/*.yaml "$ROOT"/tests/data/traces/*.csv "$ROOT"/tests/data/traces/*.yaml \
    "$ROOT"/tests/data/oracle/h100-torch2.11/*.json; do
    [ -f "$f" ] || continue
    case $f in *__*) continue ;; esac
    name=${f#"$ROOT"/}
    c=$W/agree.csv
    "$A" convert "$f" -o "$c" >/dev/null 2>"$W/conv" || { echo "$name,,,,,,,,not converted: $(head -1 "$W/conv" | tr ',' ';')" >>"$OUT/agreement.csv"; continue; }
    if ! "${DP[@]}" "$c" >"$W/out" 2>"$W/dperr"; then
        echo "$name,,,,,,,,dynapipe refused: $(head -1 "$W/dperr" | sed 's/^[^ ]* //' | tr ',' ';')" >>"$OUT/agreement.csv"
        continue
    fi
    d_line=$(cat "$W/out")
    read -r aa ar as ao <<<"$(allocsim_peaks "$c")"
    da=$(field allocated_peak "$d_line") dr=$(field reserved_peak "$d_line") ds=$(field segments_peak "$d_line")
    agree=no
    [ "$aa $ar $as" = "$da $dr $ds" ] && agree=yes
    echo "$name,$aa,$da,$ar,$dr,$as,$ds,$ao,$agree" >>"$OUT/agreement.csv"
done

{
    echo
    column -s, -t <"$OUT/peers.csv" 2>/dev/null || cat "$OUT/peers.csv"
    echo
    column -s, -t <"$OUT/agreement.csv" 2>/dev/null || cat "$OUT/agreement.csv"
} >>"$SUMMARY"
cat "$SUMMARY"
