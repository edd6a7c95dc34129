# Where the driver places cuMemAlloc ranges in a process that runs PyTorch:
# before any kernel, and after kernels loaded lazily (matmul, conv, sdpa).
import ctypes, torch, sys
cuda = ctypes.CDLL("libcuda.so.1")
MiB = 1 << 20
def alloc(n):
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
    assert r == 0, r
    return p.value
def free(p): assert cuda.cuMemFree_v2(ctypes.c_uint64(p)) == 0
torch.cuda.init(); torch.empty(0, device="cuda")
seq = [2*MiB, 2*MiB, 20*MiB, 2*MiB, 64*MiB, 2*MiB, 1024*MiB, 2*MiB, 36*MiB, 2*MiB]
def run(label):
    ps = [alloc(n) for n in seq]
    base = ps[0]
    print(label, " ".join(f"{n//MiB}M@{(p-base)//MiB:+d}" for n, p in zip(seq, ps)), "first", hex(base))
    for p in ps[1::2]: free(p)
    qs = [alloc(n) for n in [2*MiB, 20*MiB, 2*MiB]]
    print(label, "after freeing odd ones:", " ".join(f"{(q-base)//MiB:+d}" for q in qs))
    for p in ps[0::2] + qs: free(p)
run("fresh-context")
a = torch.randn(1024, 1024, device="cuda"); b = a @ a
c = torch.nn.functional.conv2d(torch.randn(8,3,64,64,device="cuda"), torch.randn(16,3,3,3,device="cuda"))
q = torch.randn(2,4,128,64,device="cuda"); torch.nn.functional.scaled_dot_product_attention(q,q,q)
torch.cuda.synchronize()
free_b, total = torch.cuda.mem_get_info()
print("after kernels: free", free_b, "total", total, "reserved by torch", torch.cuda.memory_reserved())
run("after-kernels")
