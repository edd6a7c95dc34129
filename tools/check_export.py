#!/usr/bin/env python3
"""Checks snapshots written by `allocsim export` the way PyTorch's viewers read them.

Usage: python3 tools/check_export.py [--torch] SNAPSHOT.pickle|SNAPSHOT.json...

For each file:

1. It is loaded as the viewers load it (`pickle.load`; JSON with `json.load`).
2. The walk of PyTorch's web viewer (pytorch.org/memory_viz, `MemoryViz.js`, "Allocator
   State History"), which draws the memory at any entry by undoing the trace from the
   final `segments`: done here for every entry, failing where the viewer would (a
   block drawn outside every segment, a `free_requested` of a block that is not live,
   a `segment_alloc` undone that is not a segment, a `segment_map` undone outside every
   mapped run). Entries are elided as the viewer elides them (a `free_requested` right
   before its `free_completed` is one `free`).
3. With `--torch` (or when `torch` imports): `torch.cuda._memory_viz`'s own `segsum`
   (what `python -m torch.cuda._memory_viz stats` prints), `trace` and `segments` (its
   flamegraph lines; the flamegraph script it would download is not needed for them),
   each printed under a header.

Prints one line per file and exits 1 at the first file that fails.
Needs only the Python standard library (and torch for step 3).
"""

import bisect
import json
import pickle
import sys


class Bad(Exception):
    """A snapshot the viewer would fail on."""


def load(path):
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    with open(path, "rb") as f:
        return pickle.load(f)


def elide(entries):
    """The viewer's `annotate_snapshot`: a `free_requested` right before the
    `free_completed` of the same address becomes one `free`."""
    out = []
    for e in entries:
        if (
            e["action"] == "free_completed"
            and out
            and out[-1]["action"] == "free_requested"
            and out[-1]["addr"] == e["addr"]
        ):
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(e)
    return out


class Memory:
    """Segments (sorted by address) and live blocks, as the viewer keeps them."""

    def __init__(self, snapshot, device=0):
        self.segs = []  # [addr, size, stream], sorted by addr
        self.blocks = {}  # addr -> [size, free_requested]
        for seg in snapshot["segments"]:
            if seg.get("device", 0) != device:
                continue
            self.segs.append([seg["address"], seg["total_size"], seg["stream"]])
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    self.blocks[addr] = [b["size"], b["state"] == "active_pending_free"]
                addr += b["size"]
            if addr != seg["address"] + seg["total_size"]:
                raise Bad(f"the blocks of segment {seg['address']:#x} do not tile it")
        self.segs.sort()

    def segment_of(self, addr):
        i = bisect.bisect_right([s[0] for s in self.segs], addr) - 1
        if i >= 0 and addr < self.segs[i][0] + self.segs[i][1]:
            return i
        return None

    def check_block(self, addr, where):
        if self.segment_of(addr) is None:
            raise Bad(f"{where}: block {addr:#x} is outside every segment")

    def check_empty(self, lo, hi, where):
        for a in self.blocks:
            if lo <= a < hi:
                raise Bad(f"{where}: block {a:#x} lies in [{lo:#x}, {hi:#x}), no segment then")

    def add_segment(self, addr, size, stream, merge):
        addrs = [s[0] for s in self.segs]
        i = bisect.bisect_left(addrs, addr)
        self.segs.insert(i, [addr, size, stream])
        if not merge:
            return
        if i + 1 < len(self.segs):
            nxt = self.segs[i + 1]
            if addr + size == nxt[0] and stream == nxt[2]:
                self.segs[i][1] += nxt[1]
                del self.segs[i + 1]
        if i > 0:
            prev = self.segs[i - 1]
            if prev[0] + prev[1] == addr and prev[2] == stream:
                prev[1] += self.segs[i][1]
                del self.segs[i]

    def remove_segment(self, addr, size, merge, where):
        if not merge:
            for i, s in enumerate(self.segs):
                if s[0] == addr:
                    self.check_empty(s[0], s[0] + s[1], where)
                    del self.segs[i]
                    return
            raise Bad(f"{where}: segment_alloc of {addr:#x}, which is not a segment then")
        end = addr + size
        for i, s in enumerate(self.segs):
            if s[0] <= addr and end <= s[0] + s[1]:
                self.check_empty(addr, end, where)
                s_end = s[0] + s[1]
                if s[0] == addr:
                    s[0] += size
                    s[1] -= size
                    if s[1] == 0:
                        del self.segs[i]
                elif s_end == end:
                    s[1] -= size
                else:
                    s[1] = addr - s[0]
                    self.segs.insert(i + 1, [end, s_end - end, s[2]])
                return
        raise Bad(f"{where}: segment_map of [{addr:#x}, {end:#x}), not mapped then")


def walk(snapshot, device=0):
    """Undoes the whole trace as the viewer does, checking every step; returns the
    number of entries walked."""
    mem = Memory(snapshot, device)
    for addr in mem.blocks:
        mem.check_block(addr, "at the end")
    traces = snapshot.get("device_traces") or []
    entries = elide(traces[device]) if device < len(traces) else []
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        where = f"entry {i} ({e['action']})"
        a = e["action"]
        if a in ("free", "free_completed"):
            mem.blocks[e["addr"]] = [e["size"], a == "free_completed"]
            mem.check_block(e["addr"], where)
        elif a == "free_requested":
            if e["addr"] not in mem.blocks:
                raise Bad(f"{where}: free_requested of {e['addr']:#x}, not live then")
            mem.blocks[e["addr"]][1] = False
        elif a == "alloc":
            mem.blocks.pop(e["addr"], None)
        elif a in ("segment_free", "segment_unmap"):
            mem.add_segment(e["addr"], e["size"], e["stream"], a == "segment_unmap")
        elif a in ("segment_alloc", "segment_map"):
            mem.remove_segment(e["addr"], e["size"], a == "segment_map", where)
        elif a == "oom":
            if "device_free" not in e or "size" not in e:
                raise Bad(f"{where}: an oom entry needs size and device_free")
    return len(entries)


def with_torch(snapshot):
    import torch.cuda._memory_viz as viz

    print("--- stats (torch.cuda._memory_viz.segsum)")
    print(viz.segsum(snapshot))
    print("--- trace (torch.cuda._memory_viz.trace)")
    print(viz.trace(snapshot))
    print("--- segments (torch.cuda._memory_viz.segments, flamegraph lines)")
    print(viz.segments(snapshot, format_flamegraph=lambda lines: lines))


def main(argv):
    use_torch = "--torch" in argv
    paths = [a for a in argv if a != "--torch"]
    if not paths:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if not use_torch:
        try:
            import torch.cuda._memory_viz  # noqa: F401

            use_torch = True
        except ImportError:
            pass
    for path in paths:
        snapshot = load(path)
        try:
            n = walk(snapshot)
        except Bad as e:
            print(f"{path}: FAILED: {e}")
            return 1
        print(
            f"{path}: ok ({n} entries after eliding, {len(snapshot['segments'])} segments)"
        )
        if use_torch:
            with_torch(snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
