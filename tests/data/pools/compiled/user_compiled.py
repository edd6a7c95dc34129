"""A user's own script, not the recorder: a small CNN under
torch.compile(mode="reduce-overhead") with three batch sizes, memory history recorded
with PyTorch's defaults (context="all", stacks="all"), the snapshot dumped at the end
while the compiled model is alive. argv: OUT.pickle train|infer"""
import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.cuda.memory._record_memory_history()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 128, 3, padding=1)
        self.c3 = nn.Conv2d(128, 256, 3, padding=1)
        self.fc = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        x = torch.relu(self.c3(x)).mean((2, 3))
        return self.fc(x)


m = Net().cuda()
train = sys.argv[2] == "train"
opt = torch.optim.Adam(m.parameters(), lr=1e-3) if train else None
if not train:
    m.eval()
f = torch.compile(m, mode="reduce-overhead")
for step in range(12):
    b = [8, 32, 16][step % 3]
    x = torch.randn(b, 3, 64, 64, device="cuda")
    torch.compiler.cudagraph_mark_step_begin()
    if train:
        y = torch.randint(0, 10, (b,), device="cuda")
        loss = nn.functional.cross_entropy(f(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            f(x).sum().item()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(sys.argv[1])
print(sys.argv[1], "done")
