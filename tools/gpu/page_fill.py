#!/usr/bin/env python3
"""Where the driver's free memory goes near the boundary (issue 14, the H200 that runs out
one 2 MiB page early): fills the GPU one allocation at a time after a ballast and logs
every step at which cuMemGetInfo's free memory dropped by more than the allocation's
pages, and how many pages fitted against (free after the ballast - the profile's
"driver keeps" figure) / 2 MiB, the model's prediction.

Usage: python3 tools/gpu/page_fill.py [FREE_MIB ...]   (default: 1024 4096 5632 14336)
Needs only libcuda (ctypes; no torch, no allocsim). One JSON line per fill on stdout:
  path       cuMemAlloc (2 MiB and 1 MiB requests) or vmm (cuMemCreate+cuMemMap of 2 MiB)
  free_after_ballast, fitted (allocations), pages (2 MiB pages they took),
  model_pages (what the profile's figure predicts), extra_drops ([step, bytes] where
  free fell by more than the pages the allocation took: the driver's own memory)
"""
import ctypes
import json
import sys

from libcuda import MIB, PAGE, check, cuda, free, free_bytes, open_device, try_alloc

KEEPS = {"NVIDIA H200": 3276800, "NVIDIA H100 80GB HBM3": 2293760}


class Prop(ctypes.Structure):
    # CUmemAllocationProp: type, requestedHandleTypes, location {type, id}, win32 ptr,
    # allocFlags {compressionType, gpuDirectRDMACapable, usage, reserved[4]}
    _fields_ = [("type", ctypes.c_int), ("handle", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("comp", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Access(ctypes.Structure):
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


def vmm_fill(limit):
    """cuMemCreate + cuMemMap + cuMemSetAccess of 2 MiB chunks into one reserved range."""
    prop = Prop(type=1, handle=0, loc_type=1, loc_id=0)
    va = ctypes.c_uint64()
    check(cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(limit * PAGE), ctypes.c_size_t(0),
                                   ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
    handles, drops, before = [], [], free_bytes()
    for i in range(limit):
        h = ctypes.c_uint64()
        if cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(PAGE), ctypes.byref(prop), ctypes.c_uint64(0)) != 0:
            break
        addr = va.value + i * PAGE
        if cuda.cuMemMap(ctypes.c_uint64(addr), ctypes.c_size_t(PAGE), ctypes.c_size_t(0), h, ctypes.c_uint64(0)) != 0:
            cuda.cuMemRelease(h)
            break
        acc = Access(loc_type=1, loc_id=0, flags=3)
        if cuda.cuMemSetAccess(ctypes.c_uint64(addr), ctypes.c_size_t(PAGE), ctypes.byref(acc), ctypes.c_size_t(1)) != 0:
            cuda.cuMemUnmap(ctypes.c_uint64(addr), ctypes.c_size_t(PAGE))
            cuda.cuMemRelease(h)
            break
        handles.append((addr, h))
        now = free_bytes()
        if before - now > PAGE:
            drops.append([i, before - now])
        before = now
    for addr, h in handles:
        check(cuda.cuMemUnmap(ctypes.c_uint64(addr), ctypes.c_size_t(PAGE)), "cuMemUnmap")
        check(cuda.cuMemRelease(h), "cuMemRelease")
    check(cuda.cuMemAddressFree(va, ctypes.c_size_t(limit * PAGE)), "cuMemAddressFree")
    return len(handles), len(handles), drops


def plain_fill(size, limit):
    ptrs, drops, before = [], [], free_bytes()
    while len(ptrs) < limit:
        p = try_alloc(size)
        if p is None:
            break
        ptrs.append(p)
        now = free_bytes()
        # One allocation of at most a page takes a page or nothing (packed).
        if before - now > PAGE:
            drops.append([len(ptrs) - 1, before - now])
        before = now
    n = len(ptrs)
    for p in ptrs:
        free(p)
    return n, (n * size + PAGE - 1) // PAGE, drops


def main():
    _, name = open_device()
    keeps = KEEPS.get(name, 0)
    targets = [int(a) for a in sys.argv[1:]] or [1024, 4096, 5632, 14336]
    for target_mib in targets:
        for path, size in (("cuMemAlloc-2m", PAGE), ("cuMemAlloc-1m", MIB), ("vmm-2m", PAGE)):
            # The ballast as validate makes it (gpu-backend's set_ballast_for_free_bytes,
            # whose first chunk is all it takes on an idle GPU): the free memory above the
            # target rounded down to whole pages, leaving [target, target + 2 MiB) free.
            ballast = try_alloc((free_bytes() - target_mib * MIB) // PAGE * PAGE)
            if ballast is None:
                raise RuntimeError("ballast refused")
            start = free_bytes()
            if path == "vmm-2m":
                fitted, pages, drops = vmm_fill(start // PAGE + 4)
            else:
                fitted, pages, drops = plain_fill(size, start // size + 4)
            free(ballast)
            print(json.dumps({
                "gpu": name, "path": path, "target_free_mib": target_mib,
                "free_after_ballast": start, "fitted": fitted, "pages": pages,
                "model_pages": (start - keeps) // PAGE, "extra_drops": drops[:20],
                "extra_drop_count": len(drops),
            }), flush=True)


if __name__ == "__main__":
    main()
