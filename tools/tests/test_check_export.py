"""Unit tests of tools/check_export.py: the viewer's walk accepts a consistent snapshot
and fails where PyTorch's web viewer would. Run by .ci/run:

    python3 -m unittest discover -s tools/tests
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))

import check_export as ce  # noqa: E402

MiB = 1 << 20


def entry(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream}


def segment(addr, blocks, expandable=False):
    return {
        "device": 0,
        "address": addr,
        "total_size": sum(b["size"] for b in blocks),
        "stream": 0,
        "is_expandable": expandable,
        "blocks": blocks,
    }


def block(size, state):
    return {"size": size, "state": state, "requested_size": size, "frames": []}


class ViewerWalk(unittest.TestCase):
    def test_consistent_snapshot_passes(self):
        """A segment allocated, a block allocated and freed, one live at the end."""
        snap = {
            "segments": [segment(0, [block(MiB, "active_allocated"), block(MiB, "inactive")])],
            "device_traces": [[
                entry("segment_alloc", 0, 2 * MiB),
                entry("alloc", MiB, 10),
                entry("free_requested", MiB, 10),
                entry("free_completed", MiB, 10),
                entry("alloc", 0, MiB),
                {"action": "oom", "device_free": 0, "size": 4 * MiB, "stream": 0},
            ]],
        }
        self.assertEqual(ce.walk(snap), 5)  # the free pair is one entry

    def test_expandable_mappings_pass(self):
        """Mappings undone cut the mapped run they belong to."""
        snap = {
            "segments": [segment(0, [block(2 * MiB, "inactive"), block(2 * MiB, "active_allocated")], True)],
            "device_traces": [[
                entry("segment_map", 0, 2 * MiB),
                entry("segment_map", 2 * MiB, 2 * MiB),
                entry("alloc", 2 * MiB, 5),
            ]],
        }
        self.assertEqual(ce.walk(snap), 3)

    def test_block_outside_segments_fails(self):
        """A block freed where no segment is then: the viewer cannot draw it."""
        snap = {
            "segments": [],
            "device_traces": [[entry("free_requested", 5, 1), entry("free_completed", 5, 1)]],
        }
        with self.assertRaisesRegex(ce.Bad, "outside every segment"):
            ce.walk(snap)

    def test_free_requested_of_a_dead_block_fails(self):
        """A free_requested whose block is not live (the viewer reads a missing key)."""
        snap = {
            "segments": [segment(0, [block(2 * MiB, "inactive")])],
            "device_traces": [[entry("free_requested", 0, 1), entry("alloc", MiB, 1)]],
        }
        with self.assertRaisesRegex(ce.Bad, "not live then"):
            ce.walk(snap)

    def test_segment_alloc_holding_blocks_fails(self):
        """A segment allocated around a block that was already live."""
        snap = {
            "segments": [segment(0, [block(2 * MiB, "active_allocated")])],
            "device_traces": [[entry("segment_alloc", 0, 2 * MiB)]],
        }
        with self.assertRaisesRegex(ce.Bad, "no segment then"):
            ce.walk(snap)

    def test_untiled_segment_fails(self):
        """Blocks that do not tile their segment (`_memory_viz stats` asserts it)."""
        seg = segment(0, [block(MiB, "inactive")])
        seg["total_size"] = 2 * MiB
        with self.assertRaisesRegex(ce.Bad, "do not tile"):
            ce.walk({"segments": [seg], "device_traces": [[]]})


if __name__ == "__main__":
    unittest.main()
