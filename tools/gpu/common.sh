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
# `record_setup` also writes what was recorded on: $OUT/date.txt, commit.txt and torch.txt
# (PyTorch's version, the GPU, and the driver from nvidia-smi).
record_setup() {
    : >"$OUT/log.txt"
    : >"$OUT/errors.log"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$OUT/date.txt"
    git -C "$ROOT" rev-parse HEAD >"$OUT/commit.txt" 2>/dev/null || echo unknown >"$OUT/commit.txt"
    python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" >"$OUT/torch.txt" 2>&1
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$OUT/torch.txt" 2>&1
}

# The cap in bytes, in whole MiB, halfway between two checkpoints' reserved bytes of a
# recorded run: mid FILE LABEL_A LABEL_B
mid() {
    python3 - "$@" <<'EOF'
import json, sys
path, a, b = sys.argv[1:4]
cps = {c["label"]: c["reserved"] for c in json.load(open(path))["checkpoints"]}
print(((cps[a] + cps[b]) // 2) >> 20 << 20)
EOF
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
