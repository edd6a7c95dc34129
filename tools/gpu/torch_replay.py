"""Replays an allocsim CSV trace (op,id,bytes,stream) through PyTorch's own caching
allocator on the GPU (torch.cuda.caching_allocator_alloc / caching_allocator_delete),
all on the current stream, and prints events per second (median of RUNS runs)."""
import sys, time, statistics, torch
path, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
ops = []
with open(path) as f:
    head = f.readline().strip().split(",")
    io, ii, ib = head.index("op"), head.index("id"), head.index("bytes")
    for line in f:
        c = line.rstrip("\n").split(",")
        if c[io] == "alloc":
            ops.append((int(c[ii]), int(c[ib])))
        elif c[io] in ("free", "free_completed"):
            ops.append((int(c[ii]), -1))
alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
torch.cuda.init()
rates = []
for r in range(runs):
    live = {}
    t = time.perf_counter()
    for i, b in ops:
        if b >= 0:
            live[i] = alloc(b)
        else:
            delete(live.pop(i))
    dt = time.perf_counter() - t
    for p in live.values():
        delete(p)
    torch.cuda.empty_cache()
    rates.append(len(ops) / dt)
print(f"torch-python {path} events={len(ops)} median_events_per_s={statistics.median(rates):.0f} runs={[round(x) for x in rates]}")
