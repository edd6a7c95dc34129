#!/usr/bin/env python3
"""Writes the synthetic snapshot pickles beside this script.

They reproduce the shapes torch.cuda.memory._snapshot() has up to PyTorch 2.15
(torch/csrc/cuda/Module.cpp THCPModule_memorySnapshot, torch/cuda/memory.py), built
the way PyTorch builds them, so that Python's pickler memoizes and shares what it
shares in real files (one empty frames list for every block without context, one list
per distinct traceback, one dict per distinct frame). Only the standard library is
needed:

    python3 tests/data/torch/synthetic/make_snapshots.py

Files (the Rust tests in workloads/src/snapshot.rs say what each checks):

- torch215_p{0,2,4,5}.pickle: one run in four pickle protocols. Trace entries with
  time_us, compile_context, user_metadata (a string, and once a dict), pool_id,
  frames, forward_frames and internal_metadata; `annotate` entries; expandable and
  private-pool segments; blocks in the three states; every allocator setting;
  external_annotations; host_segments/host_traces.
- torch215_frames.pickle, torch215_frames_p0.pickle: protocols 4 and 0 with frames
  on every entry (and shared).
- torch215_default_pool.pickle: the same run without the private pool.
- no_traces.pickle: include_traces=False (device_traces holds no lists).
- segments_only.pickle: torch.cuda.memory_snapshot() pickled: a list of segments.
- skip_free_completed.pickle: recorded with skip_actions=['free_completed'].
- skip_alloc.pickle: recorded with skip_actions=['alloc'].
"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
T0 = 1_795_000_000_000_000

# One frame dict per distinct frame, one list per distinct traceback (py_symbolize).
FRAME_TABLE = {}


def frame(filename, line, name):
    key = (filename, line, name)
    if key not in FRAME_TABLE:
        FRAME_TABLE[key] = {"filename": filename, "line": line, "name": name}
    return FRAME_TABLE[key]


TRACEBACKS = {}


def traceback(kind):
    if kind not in TRACEBACKS:
        TRACEBACKS[kind] = [
            frame("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward"),
            frame(f"/home/user/project/model_{kind}.py", 40 + len(kind), f"step_{kind}"),
            frame("/home/user/project/train.py", 12, "main"),
        ]
    return TRACEBACKS[kind]


EMPTY_FRAMES = []


class Trace:
    def __init__(self, with_frames):
        self.entries = []
        self.t = T0
        self.with_frames = with_frames

    def add(self, action, addr, size, stream=0, pool=(0, 0), meta="", kind="a", **extra):
        self.t += 7
        e = {"action": action}
        if action == "oom":
            e["device_free"] = addr
        else:
            e["addr"] = addr
        e["size"] = size
        e["stream"] = stream
        e["time_us"] = self.t
        e["compile_context"] = "N/A"
        e["user_metadata"] = meta
        e["pool_id"] = pool
        if self.with_frames:
            e["frames"] = traceback(kind)
        e.update(extra)
        self.entries.append(e)


def settings():
    return {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
        "max_split_size": 512 * MiB,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": True,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }


def block(address, size, requested, state):
    return {
        "address": address,
        "size": size,
        "requested_size": requested,
        "state": state,
        "frames": EMPTY_FRAMES,
    }


def segment(address, total, blocks, expandable=False, pool=(0, 0), stream=0):
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in blocks if b["state"] != "inactive")
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": active,
        "requested_size": requested,
        "stream": stream,
        "segment_type": "large" if total > MiB else "small",
        "segment_pool_id": pool,
        "is_expandable": expandable,
        "frames": EMPTY_FRAMES,
        "blocks": blocks,
    }


S1 = 0x7F00_0000_0000  # a 20 MiB segment
S2 = 0x7F10_0000_0000  # an expandable segment, 2 pages mapped
S3 = 0x7F20_0000_0000  # a private pool's segment (CUDA graph)
STREAM2 = 0x5581_0000_0AB0  # a side stream handle


def torch215(with_frames=False, private_pool=True):
    t = Trace(with_frames)
    t.add("segment_alloc", S1, 20 * MiB)
    t.add("alloc", S1, 4 * MiB, meta="phase=forward", kind="w")
    t.add("alloc", S1 + 4 * MiB, 8 * MiB, internal_metadata={"tag": 3}, kind="x",
          forward_frames=["  File \"/home/user/project/model.py\", line 9, in forward\n    y = self.lin(x)\n"])
    t.add("annotate", S1 + 4 * MiB, 8 * MiB, meta="packed for backward", kind="x")
    t.add("segment_map", S2, 2 * 2 * MiB)
    t.add("alloc", S2, 3 * MiB, stream=STREAM2, meta={"layer": "attn", "step": 2})
    t.add("free_requested", S1, 4 * MiB)
    t.add("free_completed", S1, 4 * MiB)
    if private_pool:
        t.add("segment_alloc", S3, 2 * MiB, pool=(1, 0))
        t.add("alloc", S3, 512 * 1024, pool=(1, 0), kind="g")
    t.add("snapshot", 0, 0)
    t.add("free_requested", S2, 3 * MiB, stream=STREAM2)
    # A block freed on another stream still in use: pending at snapshot time.
    t.add("alloc", S1 + 12 * MiB, 2 * MiB + 100, kind="y")
    t.add("free_requested", S1 + 12 * MiB, 2 * MiB + 512)
    segments = [
        segment(S1, 20 * MiB, [
            block(S1, 4 * MiB, 0, "inactive"),
            block(S1 + 4 * MiB, 8 * MiB, 8 * MiB, "active_allocated"),
            block(S1 + 12 * MiB, 2 * MiB + 512, 2 * MiB + 100, "active_pending_free"),
            block(S1 + 14 * MiB + 512, 6 * MiB - 512, 0, "inactive"),
        ]),
        segment(S2, 4 * MiB, [
            block(S2, 3 * MiB, 3 * MiB, "active_pending_free"),
            block(S2 + 3 * MiB, MiB, 0, "inactive"),
        ], expandable=True, stream=STREAM2),
    ]
    if private_pool:
        segments.append(segment(S3, 2 * MiB, [
            block(S3, 512 * 1024, 512 * 1024, "active_allocated"),
            block(S3 + 512 * 1024, 1536 * 1024, 0, "inactive"),
        ], pool=(1, 0)))
    annotations = [
        {"stage": "START", "name": "forward", "device": 0, "time_us": T0 + 10},
        {"stage": "END", "name": "forward", "device": 0, "time_us": T0 + 30},
        {"stage": "START", "name": "other_gpu", "device": 1, "time_us": T0 + 31},
    ]
    host_trace = [{"action": "alloc", "addr": 0x10000, "size": 4096, "stream": 0,
                   "time_us": T0 + 5, "frames": EMPTY_FRAMES}]
    return {
        "segments": segments,
        "device_traces": [t.entries],
        "allocator_settings": settings(),
        "external_annotations": annotations,
        "host_segments": [{"address": 0x10000, "total_size": 4096, "blocks": []}],
        "host_traces": [host_trace],
    }


def small_run(skip=()):
    t = Trace(False)
    for action, addr, size in [
        ("segment_alloc", S1, 2 * MiB),
        ("alloc", S1, MiB),
        ("free_requested", S1, MiB),
        ("free_completed", S1, MiB),
        ("alloc", S1, MiB),
    ]:
        if action not in skip:
            t.add(action, addr, size)
    return {
        "segments": [segment(S1, 2 * MiB, [
            block(S1, MiB, MiB, "active_allocated"),
            block(S1 + MiB, MiB, 0, "inactive"),
        ])],
        "device_traces": [t.entries],
        "allocator_settings": settings(),
        "external_annotations": [],
    }


def write(name, value, protocol=4):
    with open(os.path.join(HERE, name), "wb") as f:
        pickle.dump(value, f, protocol=protocol)


def main():
    run = torch215()
    for protocol in (0, 2, 4, 5):
        write(f"torch215_p{protocol}.pickle", run, protocol)
    write("torch215_frames.pickle", torch215(with_frames=True))
    write("torch215_frames_p0.pickle", torch215(with_frames=True), 0)
    write("torch215_default_pool.pickle", torch215(private_pool=False))
    no_traces = small_run()
    no_traces["device_traces"] = []
    write("no_traces.pickle", no_traces)
    write("segments_only.pickle", small_run()["segments"])
    write("skip_free_completed.pickle", small_run(skip=("free_completed",)))
    write("skip_alloc.pickle", small_run(skip=("alloc",)))


if __name__ == "__main__":
    main()
