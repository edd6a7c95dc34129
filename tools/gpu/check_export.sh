#!/usr/bin/env bash
# `allocsim export` checked with PyTorch's own memory viewer code (docs/trace-format.md,
# "Snapshot exports"): exports bundled traces under every policy (the whole run, a
# window, a run out of memory, JSON once) and feeds each to torch.cuda._memory_viz.
# Needs no GPU, only python3 with torch (a CPU build is enough); run it where torch is.
#
# Usage: OUT=DIR tools/gpu/check_export.sh PATH/TO/allocsim
#   PATH/TO/allocsim  a release build of this commit (the script builds nothing)
#   OUT               where the results go (created if missing)
# Reads the repository only (run from anywhere). Budget: well under a minute.
#
# Results in $OUT:
#   exports/*.pickle, *.json      the snapshots (small: bundled traces)
#   stats/*.txt                   `python -m torch.cuda._memory_viz stats FILE`
#   trace/*.txt                   `python -m torch.cuda._memory_viz trace FILE`
#   plots/*.html                  `python -m torch.cuda._memory_viz trace_plot|segment_plot`
#                                 (the HTML of pytorch.org/memory_viz with the snapshot in it)
#   check.txt                     `tools/check_export.py --torch` on every export: the walk
#                                 of the web viewer, and segsum, trace and segments (the
#                                 flamegraph lines) called from Python on the loaded dict
#   summary.txt                   per export: the exit code of each step; torch's version
set -uo pipefail

. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim" 1 1 "$@"
A=$(gpu_abs "$1")
cd "$ROOT"
mkdir -p "$OUT/exports" "$OUT/stats" "$OUT/trace" "$OUT/plots"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
note "allocsim $("$A" --version 2>&1)"
git -C "$ROOT" rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || true

TRACES="examples/training_loop.yaml tests/data/torch/multistream.pickle tests/data/torch/cut/multistream__wrap100.pickle tests/data/traces/small_1000x512.yaml"
POLICIES="caching caching:expandable_segments=True immediate buddy arena"
files=()
for trace in $TRACES; do
    t=$(basename "$trace"); t=${t%.*}
    for policy in $POLICIES; do
        p=${policy//[:=]/_}
        for kind in full window oom; do
            out="$OUT/exports/$t.$p.$kind.pickle"
            case $kind in
                full) extra=() ;;
                window) extra=(--from 10 --to 40) ;;
                oom) extra=(--capacity 300MiB) ;;
            esac
            if "$A" export "$trace" --policy "$policy" "${extra[@]}" -o "$out" 2>>"$OUT/export.log"; then
                files+=("$out")
            else
                note "$t.$p.$kind: export exit $? (see export.log)"
            fi
        done
    done
done
"$A" export examples/training_loop.yaml -o "$OUT/exports/training_loop.caching.full.json" 2>>"$OUT/export.log" \
    && files+=("$OUT/exports/training_loop.caching.full.json")

for f in "${files[@]}"; do
    n=$(basename "$f")
    case $f in
        *.pickle)
            python3 -m torch.cuda._memory_viz stats "$f" >"$OUT/stats/$n.txt" 2>&1; s=$?
            python3 -m torch.cuda._memory_viz trace "$f" >"$OUT/trace/$n.txt" 2>&1; t=$?
            python3 -m torch.cuda._memory_viz trace_plot "$f" -o "$OUT/plots/$n.trace.html" >/dev/null 2>&1; tp=$?
            python3 -m torch.cuda._memory_viz segment_plot "$f" -o "$OUT/plots/$n.segments.html" >/dev/null 2>&1; sp=$?
            note "$n: stats $s, trace $t, trace_plot $tp, segment_plot $sp"
            ;;
    esac
done
python3 tools/check_export.py --torch "${files[@]}" >"$OUT/check.txt" 2>&1
note "check_export.py --torch on ${#files[@]} exports: exit $?"
note "failed steps: $(grep -c -E 'exit [1-9]|(stats|trace|trace_plot|segment_plot) [1-9]' "$SUMMARY")"
