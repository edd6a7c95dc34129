"""Still more users' own scripts, no recorder. argv: OUT.pickle SCENARIO"""
import sys
import torch
import torch.nn as nn

out, scenario = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dev = "cuda"
kw = {"context": None} if scenario == "no_frames" else {}
torch.cuda.memory._record_memory_history(**kw)


def mlp(width=2048, depth=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).to(dev)


if scenario == "no_frames":
    x = [torch.empty(100 << 20, dtype=torch.uint8, device=dev) for _ in range(4)]
    del x
    torch.cuda.empty_cache()
    y = torch.empty(300 << 20, dtype=torch.uint8, device=dev)
elif scenario == "amp":
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(6):
        x = torch.randn([64, 256, 128][step % 3], 2048, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
elif scenario == "kv_server":
    # Requests of growing length: a KV cache grown by torch.cat, OOM caught with a retry
    # after empty_cache(), pinned host buffers copied in without blocking.
    heads, dim = 16, 128
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    for r in range(12):
        length = [128, 512, 2048, 256, 4096, 1024][r % 6]
        k = torch.empty(0, heads, dim, device=dev, dtype=torch.float16)
        for t in range(0, length, 128):
            k = torch.cat([k, torch.randn(128, heads, dim, device=dev, dtype=torch.float16)])
        buf = host[: (r + 1) << 20].to(dev, non_blocking=True)
        del k, buf
        if r % 4 == 3:
            torch.cuda.empty_cache()
elif scenario == "shared_pool_graphs":
    # Two graphs sharing one pool; the first reset before the snapshot.
    m = mlp()
    x = torch.randn(32, 2048, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(x)
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(g1):
            y1 = m(x)
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = m(y1)
    for _ in range(3):
        g1.replay()
        g2.replay()
    del y1
    g1.reset()
    z = torch.randn(1024, 2048, device=dev)
elif scenario == "mempool_deleted":
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = [torch.randn(256, 2048, device=dev) for _ in range(6)]
    b = [torch.randn(512, 2048, device=dev) for _ in range(3)]
    del a, pool
    c = [torch.randn(300, 2048, device=dev) for _ in range(3)]
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
print(out, "done")
