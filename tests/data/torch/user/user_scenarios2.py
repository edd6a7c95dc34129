"""More users' own scripts, no recorder (PyTorch's default memory history unless the
scenario says otherwise), the snapshot dumped at the end. argv: OUT.pickle SCENARIO"""
import sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

out, scenario = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dev = "cuda"


def mlp(width=2048, depth=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).to(dev)


def train_steps(m, steps, sizes, empty_every=0, ckpt=False):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for step in range(steps):
        x = torch.randn(sizes[step % len(sizes)], 2048, device=dev, requires_grad=ckpt)
        y = checkpoint(m, x, use_reentrant=False) if ckpt else m(x)
        y.pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y
        if empty_every and step % empty_every == empty_every - 1:
            torch.cuda.empty_cache()


if scenario == "ring":
    torch.cuda.memory._record_memory_history(max_entries=400)
    train_steps(mlp(), 10, [32, 256, 64, 512], empty_every=3)
elif scenario == "oom_continue":
    torch.cuda.set_per_process_memory_fraction(0.01)  # ~1.4 GiB of an H200
    torch.cuda.memory._record_memory_history()
    held = []
    for i in range(40):
        try:
            held.append(torch.empty((i % 9 + 1) * (40 << 20), dtype=torch.uint8, device=dev))
        except torch.cuda.OutOfMemoryError:
            held = held[::2]
else:
    torch.cuda.memory._record_memory_history()

if scenario == "config":
    # run with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4
    train_steps(mlp(), 8, [48, 200, 96, 400], empty_every=4)
elif scenario == "ckpt":
    train_steps(mlp(depth=6), 6, [128, 512, 256], ckpt=True)
elif scenario == "compile_default":
    m = torch.compile(mlp())
    train_steps(m, 6, [64, 256, 128])
elif scenario == "graphed":
    m = mlp()
    sample = torch.randn(64, 2048, device=dev, requires_grad=True)
    g = torch.cuda.make_graphed_callables(m, (sample,))
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    for _ in range(4):
        x = torch.randn(64, 2048, device=dev, requires_grad=True)
        g(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
elif scenario == "raw":
    ptrs = [torch.cuda.caching_allocator_alloc((k + 1) * (3 << 20)) for k in range(10)]
    for p in ptrs[::2]:
        torch.cuda.caching_allocator_delete(p)
    t = torch.empty(20 << 20, device=dev)
    torch.cuda.empty_cache()
    more = [torch.cuda.caching_allocator_alloc(5 << 20) for _ in range(3)]
elif scenario == "python_stacks_graph":
    pass
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
print(out, "done")
