# Sourced by the tools/gpu scripts: their one preamble.
#
#   gpu_setup USAGE MIN MAX "$@"
#
# Exits 2 with `usage: OUT=DIR script USAGE` unless OUT is set and MIN to MAX arguments
# are given. Sets ROOT (the repository, found from the script's own path, so that it
# runs from anywhere) and OUT (created, made absolute). `gpu_abs PATH` prints PATH made
# absolute (a file's directory resolved), for the allocsim binary of most scripts:
#
#   gpu_setup "PATH/TO/allocsim" 1 1 "$@"
#   A=$(gpu_abs "$1")
gpu_setup() {
    local usage=$1 min=$2 max=$3
    shift 3
    if [ -z "${OUT:-}" ] || [ $# -lt "$min" ] || [ $# -gt "$max" ]; then
        echo "usage: OUT=DIR $0${usage:+ $usage}" >&2
        exit 2
    fi
    ROOT=$(cd "$(dirname "$0")/../.." && pwd)
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
}

gpu_abs() {
    echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}

# For the recording scripts: `record_setup` empties $OUT/log.txt and $OUT/errors.log;
# `record WORKLOAD [OPTIONS...]` runs tools/record_torch.py WORKLOAD $OUT OPTIONS --pickle
# --overwrite (the output directory goes right after the workload: both are optional
# positionals, which argparse takes only together), its line appended to log.txt and its
# errors to errors.log; a failure is named there and on stdout.
record_setup() {
    : >"$OUT/log.txt"
    : >"$OUT/errors.log"
}

record() {
    local workload=$1
    shift
    if python3 "$ROOT/tools/record_torch.py" "$workload" "$OUT" "$@" --pickle --overwrite \
        >>"$OUT/log.txt" 2>>"$OUT/errors.log"; then
        return 0
    fi
    echo "failed: $workload $*" | tee -a "$OUT/errors.log"
}
