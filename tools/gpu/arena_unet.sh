#!/usr/bin/env bash
# Issue 14's arena case on a real U-Net run: a U-Net trained at a size whose arena
# reserved peak passes 14 GiB, recorded with and without expandable segments, then
# predicted against observed under arena, buddy and immediate at capacities around
# 14 GiB free (10, 12, 14 and 16 GiB), from the recording (with its addresses) and from
# its CSV conversion (no addresses): every row should agree, and the two inputs should
# give the same predictions (docs/reliability.md, "The arena near the limit").
#
# Usage: OUT=DIR tools/gpu/arena_unet.sh PATH/TO/allocsim
# Needs one idle GPU, python3 with torch 2.11 (tools/record_torch.py) and bash. About
# two minutes on an H100. Results in $OUT: the recordings (unet_train__*.json), their
# CSV conversions, validate.csv (+ .log), probe.yaml, summary.txt.
set -uo pipefail

. "$(dirname "$0")/common.sh"
gpu_setup "PATH/TO/allocsim" 1 1 "$@"
A=$(gpu_abs "$1")
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

git -C "$ROOT" rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || echo unknown >"$OUT/commit.txt"
"$A" probe -o "$OUT/probe.yaml" 2>"$OUT/probe.log" || { note "probe failed: $(tail -n 1 "$OUT/probe.log")"; exit 1; }

# batch 32 of 256x256 images: about 8x the activations of tests/data/unseen/unet_train.
SET=(--set batch=32 --set image=256)
for conf in "" expandable_segments:True; do
    if ! python3 "$ROOT/tools/record_torch.py" unet_train "$OUT" "${SET[@]}" --alloc-conf "$conf" \
        --overwrite >>"$OUT/record.log" 2>&1; then
        note "recording failed (alloc conf '$conf'): $(tail -n 1 "$OUT/record.log")"
    fi
done

for json in "$OUT"/unet_train__*.json; do
    [ -f "$json" ] || continue
    csv=${json%.json}.csv
    "$A" convert "$json" -o "$csv" 2>>"$OUT/validate.log"
    peak=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['final_stats']['reserved_bytes.all.peak'])" "$json")
    note "$(basename "$json"): PyTorch's reserved peak $peak"
    for input in "$json" "$csv"; do
        part=$OUT/validate.$(basename "$input").csv
        "$A" validate "$input" --policies arena,buddy,immediate \
            --capacity 10GiB,12GiB,14GiB,16GiB --gpu-profile "$OUT/probe.yaml" \
            -o "$part" 2>>"$OUT/validate.log"
        rc=$?
        if [ -f "$part" ]; then
            if [ -f "$OUT/validate.csv" ]; then tail -n +2 "$part" >>"$OUT/validate.csv"; else cp "$part" "$OUT/validate.csv"; fi
            agree=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "agrees") c = i; next }
                             $c == "true" { n++ } END { print n + 0 }' "$part")
            note "$(basename "$input"): $agree of $(($(wc -l <"$part") - 1)) runs agree (exit $rc)"
        else
            note "$(basename "$input"): no CSV (exit $rc, see validate.log)"
        fi
    done
    # The predictions from the recording and from its CSV must be the same (addresses
    # steer only the caching policy): compare the predicted columns.
    a=$OUT/validate.$(basename "$json").csv b=$OUT/validate.$(basename "$csv").csv
    if [ -f "$a" ] && [ -f "$b" ]; then
        if diff <(cut -d, -f2-4,6,8 "$a" | tail -n +2) <(cut -d, -f2-4,6,8 "$b" | tail -n +2) >/dev/null; then
            note "$(basename "$json"): predictions equal with and without addresses"
        else
            note "$(basename "$json"): PREDICTIONS DIFFER with and without addresses"
        fi
    fi
done
