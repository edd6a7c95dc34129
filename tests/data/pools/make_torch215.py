#!/usr/bin/env python3
"""Writes PyTorch 2.15-shaped snapshot pickles from the 2.11 runs recorded beside this
script: <run>__torch215.pickle is <run>.pickle with the `pool_id` that PyTorch 2.15
writes on every trace entry (pytorch/pytorch#177717), taken from the ground truth of
<run>.json (the recorder's `request_pools`, which every request of these runs got from
the segments' `segment_pool_id`):

- `alloc`, `oom`: the request's pool;
- `free_requested`, `free_completed`: the pool of the block freed;
- `segment_alloc`, `segment_map`: the pool of the request that caused it (the next
  `alloc` or `oom` entry);
- `segment_free`, `segment_unmap`: the pool of the memory given back;
- `snapshot`: (0, 0), as for every entry of the default pools.

Only the standard library is needed:

    python3 tests/data/pools/make_torch215.py
"""

import bisect
import json
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = ["graph_capture", "graph_capture__expandable_segments-True", "mempool_phases__use_on_oom-1__cap1265M"]
DEFAULT = (0, 0)


def with_pools(snapshot, recorded):
    entries = snapshot["device_traces"][0]
    # The JSON holds the pickle's entries plus the recorder's empty_cache markers.
    events = recorded["events"]
    json_of = [i for i, e in enumerate(events) if e[0] != "empty_cache"]
    assert len(json_of) == len(entries), (len(json_of), len(entries))
    for k, e in enumerate(entries):
        j = json_of[k]
        assert (e["action"], e.get("addr", 0), e["size"]) == (events[j][0], events[j][1], events[j][2]) or e["action"] == "oom", (k, e, events[j])
    request = {i: tuple(p) for i, *p in recorded["request_pools"]}
    blocks = {}  # live block address -> pool
    ranges = []  # sorted [start, end, pool] of memory held (segments, mapped pages)
    out = []

    for k, e in enumerate(entries):
        a = e["action"]
        pool = DEFAULT
        if a in ("alloc", "oom"):
            pool = request.get(json_of[k], DEFAULT)
            if a == "alloc":
                blocks[e["addr"]] = pool
        elif a in ("free_requested", "free_completed"):
            pool = blocks[e["addr"]]
            if a == "free_completed":
                del blocks[e["addr"]]
        elif a in ("segment_alloc", "segment_map"):
            nxt = next(m for m in range(k + 1, len(entries)) if entries[m]["action"] in ("alloc", "oom"))
            pool = request.get(json_of[nxt], DEFAULT)
            bisect.insort(ranges, [e["addr"], e["addr"] + e["size"], pool])
        elif a in ("segment_free", "segment_unmap"):
            lo, hi = e["addr"], e["addr"] + e["size"]
            hit = [r for r in ranges if r[0] < hi and r[1] > lo]
            assert hit and len({tuple(r[2]) for r in hit}) == 1, (k, e, hit)
            pool = hit[0][2]
            for r in hit:
                ranges.remove(r)
                if r[0] < lo:
                    bisect.insort(ranges, [r[0], lo, pool])
                if hi < r[1]:
                    bisect.insort(ranges, [hi, r[1], pool])
        e = dict(e)
        e["pool_id"] = pool
        out.append(e)
    result = dict(snapshot)
    result["device_traces"] = [out]
    return result


def main():
    for run in RUNS:
        with open(os.path.join(HERE, run + ".pickle"), "rb") as f:
            snapshot = pickle.load(f)
        with open(os.path.join(HERE, run + ".json")) as f:
            recorded = json.load(f)
        with open(os.path.join(HERE, run + "__torch215.pickle"), "wb") as f:
            pickle.dump(with_pools(snapshot, recorded), f, protocol=4)


if __name__ == "__main__":
    main()
