#!/usr/bin/env bash
# A long fuzz campaign on a many-core machine (docs/reliability.md, "Fuzzing"): every
# fuzz target of fuzz/ at once, each in libFuzzer's fork mode, seeded as fuzz/run seeds
# them (the repository's real files), crashes kept and the campaign going on.
#
# Usage: OUT=DIR tools/gpu/fuzz-campaign.sh BIN_DIR SECONDS
#   BIN_DIR  the fuzz binaries, built elsewhere (the device has no cargo):
#            (cd fuzz && cargo +nightly fuzz build -O -s none), then strip each of
#            fuzz/target/x86_64-unknown-linux-gnu/release/<target> into BIN_DIR
#   SECONDS  how long each target runs (all run at the same time)
# Workers per target: 2 for the five trace readers, 1 for the rest (14 on 16 cores).
# Results in $OUT: <target>.log (libFuzzer's output), artifacts/<target>/ (any crash,
# timeout or out-of-memory input), summary.txt (executions, corpus size, findings).
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "BIN_DIR SECONDS" 2 2 "$@"
BIN=$(cd "$1" && pwd)
SECS=$2
CORPUS=$(mktemp -d)
cd "$ROOT/fuzz"
seeds() {
    case "$1" in
        yaml) echo ../examples ../tests/data/traces ;;
        csv | replay) echo ../examples ../tests/data/expected ;;
        recorded_json) echo ../tests/data/recorded ../tests/data/oracle/h100-torch2.11 ../tests/data/recorder ../tests/data/torch ;;
        pickle) echo ../tests/data/oracle/h100-torch2.11-pickles ../tests/data/torch seeds/pickle ;;
        rmm) echo seeds/rmm ;;
        profile) echo ../sim/profiles ;;
        policies | alloc_conf) echo "seeds/$1" ;;
    esac
}
for t in yaml csv recorded_json pickle replay rmm profile policies alloc_conf; do
    case $t in yaml | csv | recorded_json | pickle | replay) w=2 ;; *) w=1 ;; esac
    mkdir -p "$CORPUS/$t" "$OUT/artifacts/$t"
    # shellcheck disable=SC2046
    "$BIN/$t" -fork="$w" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 \
        -artifact_prefix="$OUT/artifacts/$t/" "$CORPUS/$t" $(seeds "$t") \
        >"$OUT/$t.log" 2>&1 &
done
wait
{
    echo "date: $(date -u +%FT%TZ); seconds per target: $SECS; $(nproc) cores"
    for t in yaml csv recorded_json pickle replay rmm profile policies alloc_conf; do
        last=$(grep -E '^#[0-9]+' "$OUT/$t.log" | tail -1)
        n=$(find "$OUT/artifacts/$t" -type f | wc -l)
        echo "$t: corpus $(find "$CORPUS/$t" -type f | wc -l) files; findings $n; last: $last"
    done
} | tee "$OUT/summary.txt"
rm -rf "$CORPUS"
