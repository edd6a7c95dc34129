#!/usr/bin/env bash
# Two allocsim release builds side by side on the same quiet cores: the replay core
# (allocsim bench, every policy, the two binaries alternating), end to end on CSV
# traces (CPU time and wall of the whole process, peak RSS; output compared with cmp),
# and optionally a synthetic snapshot pickle (open and replay, export with the new one).
# Usage: OUT=DIR tools/gpu/before-after.sh OLD/allocsim NEW/allocsim [SNAPSHOT_READ]
#   PARTS    any of "core e2e pinned snapshot" (default "core e2e")
#   LENGTHS  end-to-end trace lengths (default "100000 1000000 10000000")
#   ROUNDS   rounds of the alternation (default 2)
#   PIN_CORE the core the "pinned" part runs on (default 5): end to end at PIN_EVENTS
#            (default 10000000) events per policy under taskset, old first in odd rounds
#            and new first in even ones (this host's unpinned rounds move by 30-50 %)
#   SNAP_MIB size of the synthetic snapshot (default 1120: about 1 GB), made by the
#            third argument (`snapshot_read --make`, workloads/examples/snapshot_read.rs);
#            it is opened, replayed and exported by both builds
#   NOFRAMES_MIB  sizes of frame-less synthetic snapshots to replay with both builds
#            (peak memory against the file's size), e.g. "300 1000 3000"
# Needs GNU time as /usr/bin/time; writes everything to $OUT/before-after.txt.
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_setup "OLD/allocsim NEW/allocsim [SNAPSHOT_READ]" 2 3 "$@"
OLD=$(gpu_abs "$1") NEW=$(gpu_abs "$2") SR=${3:+$(gpu_abs "$3")}
# A build that is not there would fail every run alike, and "output identical" would follow.
for b in "$OLD" "$NEW" ${SR:+"$SR"}; do
    [ -f "$b" ] && [ -x "$b" ] || { echo "before-after.sh: no executable at ${b:-(empty path)} (carried?)" >&2; exit 2; }
done
W=$(mktemp -d)
exec > >(tee -a "$OUT/before-after.txt") 2>&1
date -u; nproc; lscpu | grep -m1 "Model name"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
PARTS=" ${PARTS:-core e2e} " ROUNDS=${ROUNDS:-2}
part() { [[ $PARTS == *" $1 "* ]]; }
POLICIES=caching,caching:expandable_segments=True,immediate,buddy,arena
# CPU seconds (user + sys), wall seconds and peak RSS (kB) of one run, output to $W/out.
timed() {
    /usr/bin/time -f "%U %S %e %M" -o "$W/t" "$@" > "$W/out" 2> "$W/err" || echo -n "failed: $(head -1 "$W/err") "
    sed -i '/^Command exited/d' "$W/t"
    awk '{ printf "cpu_s=%.2f wall_s=%.2f peak_rss_kb=%d", $1 + $2, $3, $4 }' "$W/t" | tail -c 200
}
if part core; then
    for r in $(seq 1 "$ROUNDS"); do
        for b in old new; do
            bin=$OLD; [ $b = new ] && bin=$NEW
            "$bin" bench --runs 5 --policies "$POLICIES" --format csv | sed "s/^/core round=$r binary=$b /"
        done
    done
fi
if part e2e; then
    for n in ${LENGTHS:-100000 1000000 10000000}; do
        "$NEW" generate random --seed 1 --events "$n" -o "$W/t$n.csv" > /dev/null 2>&1
        ev=$(($(wc -l < "$W/t$n.csv") - 1))
        for p in caching immediate buddy arena; do
            for r in $(seq 1 "$ROUNDS"); do
                for b in old new; do
                    bin=$OLD; [ $b = new ] && bin=$NEW
                    echo "e2e events=$ev policy=$p round=$r binary=$b $(timed "$bin" replay "$W/t$n.csv" --policy $p)"
                    cp "$W/out" "$W/$b.out"
                done
                cmp -s "$W/old.out" "$W/new.out" && echo "e2e events=$ev policy=$p output identical" \
                    || echo "e2e events=$ev policy=$p OUTPUT DIFFERS"
            done
        done
        rm -f "$W/t$n.csv"
    done
fi
if part pinned; then
    n=${PIN_EVENTS:-10000000} c=${PIN_CORE:-5}
    "$NEW" generate random --seed 1 --events "$n" -o "$W/p.csv" > /dev/null 2>&1
    ev=$(($(wc -l < "$W/p.csv") - 1))
    for p in caching immediate buddy arena; do
        for r in $(seq 1 "$ROUNDS"); do
            order="old new"; [ $((r % 2)) = 0 ] && order="new old"
            for b in $order; do
                bin=$OLD; [ $b = new ] && bin=$NEW
                echo "pinned core=$c events=$ev policy=$p round=$r binary=$b $(timed taskset -c "$c" "$bin" replay "$W/p.csv" --policy $p)"
                cp "$W/out" "$W/$b.out"
            done
            cmp -s "$W/old.out" "$W/new.out" || echo "pinned events=$ev policy=$p round=$r OUTPUT DIFFERS"
        done
        echo "pinned events=$ev policy=$p outputs compared in each of $ROUNDS rounds"
    done
    rm -f "$W/p.csv"
fi
if part snapshot && [ -n "$SR" ]; then
    # snapshot_read --make reads the real snapshots of tests/data from the path it was
    # built at: a build from another checkout needs that path made to point here, e.g.
    # `ln -s "$PWD" DIR` for a build made in the checkout DIR.
    "$SR" --make "${SNAP_MIB:-1120}" "$W/big.pickle" > /dev/null
    echo "snapshot file_bytes=$(stat -c %s "$W/big.pickle")"
    echo "snapshot open (snapshot_read) $(timed "$SR" "$W/big.pickle")"
    for r in $(seq 1 "$ROUNDS"); do
        for b in old new; do
            bin=$OLD; [ $b = new ] && bin=$NEW
            echo "snapshot replay round=$r binary=$b $(timed "$bin" replay "$W/big.pickle" --policy caching)"
            cp "$W/out" "$W/$b.out"
        done
        cmp -s "$W/old.out" "$W/new.out" && echo "snapshot replay output identical" || echo "snapshot replay OUTPUT DIFFERS"
    done
    for b in old new; do
        bin=$OLD; [ $b = new ] && bin=$NEW
        echo "snapshot export binary=$b $(timed "$bin" export "$W/big.pickle" --policy caching -o "$W/$b.pickle") out_bytes=$(stat -c %s "$W/$b.pickle" 2>/dev/null)"
    done
    cmp -s "$W/old.pickle" "$W/new.pickle" && echo "snapshot export output identical" || echo "snapshot export OUTPUT DIFFERS"
    rm -f "$W/big.pickle" "$W/old.pickle" "$W/new.pickle"
    # Frame-less snapshots of growing size: the replay's peak memory against the file's.
    for mib in ${NOFRAMES_MIB:-}; do
        "$SR" --make "$mib" "$W/nf.pickle" --no-frames > /dev/null
        for b in old new; do
            bin=$OLD; [ $b = new ] && bin=$NEW
            echo "snapshot no-frames file_bytes=$(stat -c %s "$W/nf.pickle") replay binary=$b $(timed "$bin" replay "$W/nf.pickle" --policy caching)"
            cp "$W/out" "$W/$b.out"
        done
        cmp -s "$W/old.out" "$W/new.out" && echo "snapshot no-frames $mib MiB replay output identical" || echo "snapshot no-frames $mib MiB replay OUTPUT DIFFERS"
        rm -f "$W/nf.pickle"
    done
fi
rm -rf "$W"
