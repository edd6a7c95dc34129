"""Replays an allocsim CSV trace (op,id,bytes,stream) through DynaPipe's simulator of
PyTorch's caching allocator (allocation_simulator.py beside this file, copied unchanged
from awslabs/optimizing-multitask-training-through-dynamic-pipelines), configured as
PyTorch is (kSmallSize = 1 MiB; DynaPipe's default of 0 puts every request in the large
pool), and prints one line: its peaks and the replay's speed.

    python3 benches/peers/dynapipe/replay.py TRACE.csv [--runs N] [--capacity-bytes B]

What is timed is the replay only (the CPU time of the thread, as `allocsim bench`
times allocsim's), the trace parsed into memory before; each run replays on a fresh
simulator and the median is printed. The whole process (parsing included) is what the
caller times from outside (tools/gpu/peers.sh).

Rows: `alloc` -> malloc(bytes, stream); `free` (and `free_completed`) -> free;
`empty_cache` -> clear_cache; `free_requested` and `mark` have no effect here (DynaPipe
frees at once; a mark changes nothing). Any other row is refused (exit 2, naming the
line): DynaPipe has no private pools, settings or statistics resets. DynaPipe raises on
running out of memory; this driver reports it as `oom_at=LINE` and stops.

This driver is allocsim's (MIT OR Apache-2.0); the files it loads are Apache-2.0: see NOTICE.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# sortedcontainers 2.4.0 (Apache-2.0), vendored: the GPU machine has no package index.
sys.path.insert(0, os.path.join(HERE, "vendor"))
sys.path.insert(0, HERE)
from allocation_simulator import (  # noqa: E402
    TorchCachingAllocatorConfig,
    TorchCachingAllocatorSimulator,
)

ALLOC, FREE, EMPTY, NOTHING = 0, 1, 2, 3


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def parse(path):
    """The trace's rows as (kind, id, bytes, stream, line) tuples."""
    ops = []
    with open(path) as f:
        head = f.readline().rstrip("\r\n").split(",")
        try:
            io, ii, ib, isr = (head.index(k) for k in ("op", "id", "bytes", "stream"))
        except ValueError:
            fail(f"{path}:1: not an allocsim CSV trace (header op,id,bytes,stream)")
        ip = head.index("pool") if "pool" in head else None
        for n, line in enumerate(f, start=2):
            c = line.rstrip("\r\n").split(",")
            op = c[io] if len(c) > io else ""
            try:
                if op == "alloc":
                    s = c[isr] if len(c) > isr else ""
                    ops.append((ALLOC, c[ii], int(c[ib]), int(s) if s else 0, n))
                elif op in ("free", "free_completed"):
                    ops.append((FREE, c[ii], 0, 0, n))
                elif op == "empty_cache" and not (ip is not None and len(c) > ip and c[ip]):
                    ops.append((EMPTY, 0, 0, 0, n))
                elif op in ("free_requested", "mark"):
                    ops.append((NOTHING, 0, 0, 0, n))
                else:
                    fail(f"{path}:{n}: `{op}`: DynaPipe's simulator has no such operation")
            except ValueError:
                fail(f"{path}:{n}: not a number in {line.strip()!r}")
    return ops


def replay(ops, capacity_bytes):
    """Replays `ops` on a fresh simulator: (simulator, CPU seconds, line of the OOM)."""
    sim = TorchCachingAllocatorSimulator(
        capacity_bytes / 1e6, TorchCachingAllocatorConfig(kSmallSize=1048576)
    )
    malloc, free, clear = sim.malloc, sim.free, sim.clear_cache
    live = {}
    oom = None
    t = time.thread_time()
    for kind, i, b, s, n in ops:
        if kind == ALLOC:
            try:
                live[i] = malloc(b, s)
            except RuntimeError:
                oom = n
                break
        elif kind == FREE:
            block = live.pop(i, None)
            if block is not None:
                free(block)
        elif kind == EMPTY:
            clear()
    return sim, time.thread_time() - t, oom


def main(argv):
    args = list(argv)
    runs, capacity = 1, 85899345920  # allocsim's default simulated device: 80 GiB
    path = None
    while args:
        a = args.pop(0)
        if a == "--runs" and args:
            runs = int(args.pop(0))
        elif a == "--capacity-bytes" and args:
            capacity = int(args.pop(0))
        elif path is None and not a.startswith("--"):
            path = a
        else:
            fail(f"unexpected argument {a!r}; usage: replay.py TRACE.csv [--runs N] [--capacity-bytes B]")
    if path is None:
        fail("usage: replay.py TRACE.csv [--runs N] [--capacity-bytes B]")
    ops = parse(path)
    times = []
    for _ in range(max(runs, 1)):
        sim, dt, oom = replay(ops, capacity)
        times.append(dt)
    med = statistics.median(times)
    print(
        f"dynapipe {path} events={len(ops)} allocated_peak={sim.peak_allocated_bytes} "
        f"reserved_peak={sim.peak_backend_allocated_bytes} "
        f"segments_peak={sim.peak_allocated_segments} "
        f"oom_at={oom if oom is not None else 'none'} runs={len(times)} "
        f"median_replay_cpu_s={med:.6f} events_per_s={len(ops) / med if med > 0 else 0:.0f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
