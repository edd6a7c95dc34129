"""Users' own scripts, no recorder: each scenario records memory history with PyTorch's
defaults and dumps the snapshot at the end. argv: OUT.pickle SCENARIO"""
import sys
import torch
import torch.nn as nn

out, scenario = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dev = "cuda"


def mlp(width=2048, depth=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).to(dev)


if scenario == "gc_fraction":
    # A cap and garbage collection: releases inside mallocs near the cap, and empty_cache.
    torch.cuda.set_per_process_memory_fraction(0.02)  # ~2.8 GiB of an H200
    torch.cuda.memory._record_memory_history()
    keep = []
    for i in range(60):
        try:
            keep.append(torch.empty((1 + i % 7) * (24 << 20), dtype=torch.uint8, device=dev))
        except torch.cuda.OutOfMemoryError:
            keep = keep[len(keep) // 2:]
        if i % 5 == 4:
            keep = keep[1:]
        if i % 20 == 19:
            torch.cuda.empty_cache()
else:
    torch.cuda.memory._record_memory_history()

if scenario == "graph":
    # torch.cuda.graph capture of a forward, replayed, snapshot while it is alive.
    m = mlp()
    x = torch.randn(64, 2048, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = m(x)
    for _ in range(5):
        x.copy_(torch.randn(64, 2048, device=dev))
        g.replay()
        y.sum().item()
    extra = [torch.empty(8 << 20, device=dev) for _ in range(4)]
elif scenario == "mempool":
    m = mlp()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = [torch.randn(256, 2048, device=dev) for _ in range(6)]
        h = m(a[0])
    del a[2:4]
    b = [torch.randn(512, 2048, device=dev) for _ in range(3)]
    with torch.cuda.use_mem_pool(pool):
        c = [torch.randn(128, 2048, device=dev) for _ in range(4)]
elif scenario == "train_empty_cache":
    # A training loop that empties the cache every few steps, two streams.
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    for step in range(8):
        b = [32, 128, 64, 256][step % 4]
        x = torch.randn(b, 2048, device=dev)
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.stream(side):
            t = torch.randn(b * 4, 2048, device=dev)
        t.record_stream(torch.cuda.current_stream())
        del t
        if step % 3 == 2:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
elif scenario == "expandable_empty_cache":
    m = mlp()
    for step in range(6):
        x = torch.randn([64, 512, 128, 1024][step % 4], 2048, device=dev)
        y = m(x)
        del x, y
        torch.cuda.empty_cache()
        z = torch.empty((step + 1) * (50 << 20), dtype=torch.uint8, device=dev)
        del z
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
print(out, "done")
