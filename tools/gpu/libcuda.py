"""The libcuda calls the tools/gpu probes share (ctypes; no torch, no allocsim): one
place for the library handle, error checks, free memory, allocation and the context.

Import from a script in this folder (`python3 tools/gpu/NAME.py` puts the folder on the
module path): `from libcuda import cuda, check, ...`.
"""
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")
MIB = 1 << 20
PAGE = 2 * MIB


def check(rc, what):
    """Raises naming `what` unless the CUresult `rc` is CUDA_SUCCESS."""
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def free_bytes():
    """cuMemGetInfo's free memory."""
    free_, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free_), ctypes.byref(total)), "cuMemGetInfo")
    return free_.value


def try_alloc(size):
    """cuMemAlloc of `size` bytes: the address, or None where the driver refuses."""
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size))
    return p.value if rc == 0 else None


def alloc(size):
    """cuMemAlloc of `size` bytes: the address; raises where the driver refuses."""
    p = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)), f"cuMemAlloc({size})")
    return p.value


def free(ptr):
    """cuMemFree."""
    check(cuda.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")


def open_device(ordinal=0):
    """cuInit, then device `ordinal`'s primary context made current: (device, name)."""
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    check(cuda.cuDeviceGetName(name, 255, dev), "cuDeviceGetName")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev, name.value.decode(errors="replace")
