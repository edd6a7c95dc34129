# Sourced by the tools/gpu scripts: the one preamble of `OUT=DIR script PATH/TO/allocsim`.
#
#   gpu_setup "$@"               a script that takes the allocsim binary (a release build)
#   gpu_setup --no-binary "$@"   a script that takes none
#
# Exits 2 with the usage line unless OUT is set (and, with a binary, exactly one
# argument is given). Sets A (the binary's absolute path), ROOT (the repository, found
# from the script's own path, so it runs from anywhere) and OUT (created, made absolute).
gpu_setup() {
    local binary=1 extra=${GPU_USAGE_EXTRA:-}
    if [ "${1:-}" = --no-binary ]; then
        binary=0
        shift
    fi
    if [ -z "${OUT:-}" ] || { [ $binary = 1 ] && [ $# -lt 1 ]; } \
        || { [ $binary = 1 ] && [ -z "$extra" ] && [ $# -ne 1 ]; }; then
        if [ $binary = 1 ]; then
            echo "usage: OUT=DIR $0 PATH/TO/allocsim${extra:+ $extra}" >&2
        else
            echo "usage: OUT=DIR $0" >&2
        fi
        exit 2
    fi
    if [ $binary = 1 ]; then
        A=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    fi
    ROOT=$(cd "$(dirname "$0")/../.." && pwd)
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
}
