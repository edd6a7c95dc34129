"""A user's own script, no recorder, no private pool: tensors freed, the cache emptied,
then an allocation that needs a new segment at once (the release right before the
segment allocation), twice; memory history with PyTorch's defaults (or argv[2] as
`stacks`). argv: OUT.pickle [python|all]"""
import sys
import torch

kw = {"stacks": sys.argv[2]} if len(sys.argv) > 2 else {}
torch.cuda.memory._record_memory_history(**kw)
x = [torch.empty(100 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del x
torch.cuda.empty_cache()
y = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
z = torch.empty(1 << 20, device="cuda")
del y
torch.cuda.empty_cache()
w = [torch.empty((k + 1) << 20, device="cuda") for k in range(8)]
del z
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(sys.argv[1])
print(sys.argv[1], "done")
