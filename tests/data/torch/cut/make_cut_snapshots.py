#!/usr/bin/env python3
"""Writes the ring-buffer and late-start snapshot pickles beside this script.

Each is a real snapshot of tests/data/oracle/h100-torch2.11-pickles with the head of
its trace cut off, which is exactly what PyTorch keeps when the recording's ring
buffer (`_record_memory_history(max_entries=N)`) wraps: the last N entries, and the
same final `segments` (the allocator's state when the snapshot was taken). A
recording started late (after the model was built) keeps the entries from that point
on, with the same final segments. Only the standard library is needed:

    python3 tests/data/torch/cut/make_cut_snapshots.py

Files: `<run>__wrap<N>.pickle` keeps the last N entries; `<run>__late<K>.pickle` drops
the first K entries (for gpt_train_small, K = 59: the entries before its `model`
checkpoint, when the model and optimizer were built). The Rust tests
(`sim/tests/midrun.rs`) replay each from its rebuilt starting state and check it
against what PyTorch did inside the window.
"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "..", "oracle", "h100-torch2.11-pickles")

# (run, entries kept from the end, or None; entries dropped from the start, or None)
CUTS = [
    ("gpt_train_small", 2000, None),
    ("gpt_train_small", None, 59),
    ("random_stress", 3000, None),
    ("random_stress__cap5120M", 1000, None),
    ("multistream", 100, None),
    ("seed002_retain", 20, None),
    ("seed000", 10, None),
]


def main():
    for run, keep, drop in CUTS:
        with open(os.path.join(SOURCE, run + ".pickle"), "rb") as f:
            snap = pickle.load(f)
        trace = snap["device_traces"][0]
        if keep is not None:
            cut, name = trace[-keep:], f"{run}__wrap{keep}.pickle"
        else:
            cut, name = trace[drop:], f"{run}__late{drop}.pickle"
        snap["device_traces"][0] = cut
        with open(os.path.join(HERE, name), "wb") as f:
            pickle.dump(snap, f, protocol=4)
        print(f"{name}: {len(cut)} of {len(trace)} entries")


if __name__ == "__main__":
    main()
