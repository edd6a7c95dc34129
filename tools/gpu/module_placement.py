#!/usr/bin/env python3
"""When does the driver stop stacking allocations downward and start filling upward?
(issue 9, docs/fidelity.md "Recovering the placement from the trace".)

The driver model (sim/src/address.rs) stacks 32 MiB chunks downward, as a fresh context
does; in gpt_train_small's first training step the driver packed every segment of
12 MiB or more upward instead, once kernel modules were loaded. This runs, in a fresh
process with only libcuda, the same allocation pattern (2, 20, 2, 20, 64, 12, 16, 16,
12, 20 MiB, the sizes of that step) before any module, then after each module load of a
growing series: modules whose only content is a `.global` array of K MiB (device memory
the module takes at load, as a library's kernels with their globals do) and modules of
N empty kernels (code only). After each pattern the allocations are freed again, so
each pattern starts from the same allocator state but for the modules.

Usage: python3 tools/gpu/module_placement.py > module_placement.jsonl
Needs only libcuda (ctypes; no torch, no allocsim). One JSON line per event on stdout:
  {"event": "device", "name", "driver"}
  {"event": "load", "module": label, "global_mib", "kernels", "free_before", "free_after"}
  {"event": "pattern", "after": label, "sizes_mib": [...], "addrs": [...],
   "rel_mib": [address - first address, in MiB], "direction": "down"/"up"/"mixed"}
"""
import ctypes
import json
import sys

from libcuda import MIB, alloc, check, cuda, free, free_bytes, open_device

PATTERN_MIB = [2, 20, 2, 20, 64, 12, 16, 16, 12, 20]


def ptx(label, global_mib, kernels, arch):
    """A PTX module with one global array of `global_mib` MiB and `kernels` empty
    kernels (names made unique by `label`)."""
    lines = [".version 8.0", f".target {arch}", ".address_size 64", ""]
    if global_mib:
        lines.append(f".visible .global .align 8 .b8 g_{label}[{global_mib * MIB}];")
    for k in range(kernels):
        lines.append(f".visible .entry k_{label}_{k}() {{ ret; }}")
    return ("\n".join(lines) + "\n").encode()


def load(source):
    module = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(source)
    check(cuda.cuModuleLoadData(ctypes.byref(module), buf), "cuModuleLoadData")
    return module


def direction(addrs, sizes):
    """Whether each large (>= 12 MiB) allocation went below or above the previous one."""
    large = [a for a, s in zip(addrs, sizes) if s >= 12]
    steps = {"down" if b < a else "up" for a, b in zip(large, large[1:])}
    return steps.pop() if len(steps) == 1 else "mixed"


def pattern(after):
    addrs = [alloc(s * MIB) for s in PATTERN_MIB]
    print(
        json.dumps(
            {
                "event": "pattern",
                "after": after,
                "sizes_mib": PATTERN_MIB,
                "addrs": addrs,
                "rel_mib": [(a - addrs[0]) // MIB for a in addrs],
                "direction": direction(addrs, PATTERN_MIB),
            }
        ),
        flush=True,
    )
    for a in addrs:
        free(a)


def main():
    dev, name = open_device()
    driver = ctypes.c_int()
    check(cuda.cuDriverGetVersion(ctypes.byref(driver)), "cuDriverGetVersion")
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "compute capability")
    check(cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "compute capability")
    arch = f"sm_{major.value}{minor.value}"
    print(
        json.dumps({"event": "device", "name": name, "driver": driver.value}),
        flush=True,
    )
    pattern("nothing")
    modules = []
    series = [("g1", 1, 1), ("g8", 8, 1), ("g32", 32, 1), ("g64", 64, 1)]
    series += [("k100", 0, 100), ("k1000", 0, 1000)]
    for label, global_mib, kernels in series:
        before = free_bytes()
        modules.append(load(ptx(label, global_mib, kernels, arch)))
        print(
            json.dumps(
                {
                    "event": "load",
                    "module": label,
                    "global_mib": global_mib,
                    "kernels": kernels,
                    "free_before": before,
                    "free_after": free_bytes(),
                }
            ),
            flush=True,
        )
        pattern(label)
    for m in modules:
        check(cuda.cuModuleUnload(m), "cuModuleUnload")
    pattern("every module unloaded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
