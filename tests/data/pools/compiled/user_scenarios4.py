"""Users' own scripts, no recorder, round 4. argv: OUT.pickle SCENARIO"""
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F

out, scenario = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dev = "cuda"


class Block(nn.Module):
    def __init__(self, d=512, h=8):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.n2(x))


def model():
    return nn.Sequential(*[Block() for _ in range(4)]).to(dev)


if scenario == "compiled_ring":
    torch.cuda.memory._record_memory_history(max_entries=1500)
else:
    torch.cuda.memory._record_memory_history()

if scenario in ("compiled_ring", "compiled_seq"):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    f = torch.compile(m, mode="reduce-overhead", dynamic=False)
    for step in range(12):
        t = [128, 256, 64, 512][step % 4]
        x = torch.randn(8, t, 512, device=dev)
        torch.compiler.cudagraph_mark_step_begin()
        f(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
elif scenario == "inference_mode":
    m = model().eval()
    with torch.inference_mode():
        for step in range(10):
            t = [100, 700, 300, 1500, 50][step % 5]
            y = m(torch.randn(4, t, 512, device=dev))
            del y
            if step == 6:
                torch.cuda.empty_cache()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
print(out, "done")
