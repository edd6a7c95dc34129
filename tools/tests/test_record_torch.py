"""Unit tests of tools/record_torch.py against the fake `torch` in fake_torch.py: the
JSON it writes, trace positions (plain, ring buffer, late start), pool windows and the
pool of every request, the command line. Run by .ci/run:

    python3 -m unittest discover -s tools/tests

UPDATE_EXPECT=1 rewrites tests/data/recorder/fake_pools.json, the recorder's output for
the fake_pools workload, which the Rust suite reads as a recorded run.
"""

import contextlib
import io
import json
import os
import pickle
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)

import fake_torch  # noqa: E402
import record_torch as rt  # noqa: E402

MiB = 1 << 20
GOLDEN = os.path.join(ROOT, "tests", "data", "recorder", "fake_pools.json")
ORACLE = os.path.join(ROOT, "tests", "data", "oracle", "h100-torch2.11-pickles")


def T():
    return rt.torch


# ------------------------------------------------------------------ test workloads
@rt.workload(n=30, every=10, seed=3)
def fake_churn(rec, n, every, seed):
    """Test only: n allocations of varying sizes, half of them freed, a checkpoint
    every `every`."""
    import random

    rng = random.Random(seed)
    weights = [T().empty(3 * MiB, dtype=T().uint8, device=rec.dev) for _ in range(2)]
    rec.setup_done()
    live = []
    for i in range(n):
        live.append(T().empty(rng.randrange(1000, 3 * MiB), dtype=T().uint8, device=rec.dev))
        if i % 2:
            live.pop(rng.randrange(len(live)))
        if i % every == every - 1:
            rec.cp(f"i{i}")
    live.clear()
    del weights


def _trees_pool(torch):
    """The trees' pool, (0, 9), made as torch.compile's CUDA graph trees make theirs: by
    an empty capture into it. The graph (which keeps the pool) and the pool."""
    g = torch.cuda.CUDAGraph()
    pool = (0, 9)
    with torch.cuda.graph(g, pool=pool):
        pass
    return g, pool


@rt.workload()
def fake_tree_pool(rec):
    """Test only: what torch.compile's CUDA graph trees do: an empty capture makes the
    trees' pool, then warm-ups allocate to it through the bindings outside any capture
    (begin, the work, end, release); an eager request after them goes to the default
    pool."""
    torch, dev = T(), rec.dev
    u8 = torch.uint8
    rec.setup_done()
    g, pool = _trees_pool(torch)
    keep = []
    for size in (2 * MiB, 3 * MiB):
        torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool)
        try:
            keep.append(torch.empty(size, dtype=u8, device=dev))
        finally:
            torch._C._cuda_endAllocateToPool(0, pool)
            torch._C._cuda_releasePool(0, pool)
        rec.cp(f"warm{size}")
    eager = torch.empty(MiB, dtype=u8, device=dev)
    del eager, keep, g


@rt.workload()
def fake_checkpoint(rec):
    """Test only: what torch.compile's CUDA graph trees do to record a graph on another
    path: their pool checkpointed after a warm-up, used further, then set back to the
    checkpoint (every block freed, the checkpoint's blocks allocated again where they
    were, its free blocks freed), then the blocks live in it freed."""
    torch, dev = T(), rec.dev
    u8 = torch.uint8
    rec.setup_done()
    g, pool = _trees_pool(torch)
    torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool)
    a = torch.empty(MiB // 2, dtype=u8, device=dev)
    b = torch.empty(MiB // 4, dtype=u8, device=dev)
    del a
    state = torch._C._cuda_getCheckpointState(0, pool)
    c = torch.empty(MiB, dtype=u8, device=dev)
    torch._C._cuda_endAllocateToPool(0, pool)
    torch._C._cuda_releasePool(0, pool)
    # The trees own these storages now: the restore frees their blocks.
    b.placed = c.placed = None
    restored = torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    del b, c
    rec.cp("restored")
    del restored, g


@rt.workload()
def fake_pools(rec):
    """Test only: two graph captures, default-pool work, a MemPool phase with a
    request from another thread, a reset graph, a destroyed graph, a destroyed
    MemPool, empty_cache."""
    torch, dev = T(), rec.dev
    u8 = torch.uint8
    weights = torch.empty(3 * MiB, dtype=u8, device=dev)
    rec.setup_done()
    graphs = []
    for b in (1, 4):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = torch.empty(b * MiB, dtype=u8, device=dev)
            tmp = torch.empty(b * 100000, dtype=u8, device=dev)
            del tmp
        graphs.append((g, out))
        del g, out
        rec.cp(f"captured{b}")
    eager = torch.empty(5 * MiB, dtype=u8, device=dev)
    del eager
    pool = torch.cuda.MemPool()
    other = []
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(MiB, dtype=u8, device=dev)
        t = threading.Thread(target=lambda: other.append(torch.empty(4096, dtype=u8, device=dev)))
        t.start()
        t.join()
        b = torch.empty(700000, dtype=u8, device=dev)
    rec.cp("mempool")
    del b
    torch.cuda.reset_peak_memory_stats()
    g0, out0 = graphs.pop(0)
    del out0
    g0.reset()
    del g0
    graphs.clear()  # the second graph is destroyed without a reset
    del a
    del pool
    other.clear()
    torch.cuda.empty_cache()
    rec.cp("end")
    del weights


@rt.workload(mib=64)
def fake_capture_oom(rec, mib):
    """Test only: a graph capture that runs out of memory under a cap."""
    torch, dev = T(), rec.dev
    keep = [torch.empty(4 * MiB, dtype=torch.uint8, device=dev)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        keep.append(torch.empty(mib * MiB, dtype=torch.uint8, device=dev))


# ------------------------------------------------------------------ harness
class RecorderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = self.tmp.name
        self.saved = {k: os.environ.get(k) for k in ("MAX_ENTRIES", "DUMP_PICKLE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        for k in self.saved:
            os.environ.pop(k, None)

    def tearDown(self):
        self.tmp.cleanup()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.modules.pop("torch", None)

    def run_recorder(self, *args, fake=None, **fake_options):
        """Runs main() with a fresh fake torch; returns (status, stdout, stderr)."""
        sys.modules["torch"] = fake or fake_torch.make(**fake_options)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = rt.main(list(args))
        return status, out.getvalue(), err.getvalue()

    def record(self, *args, **fake_options):
        status, out, err = self.run_recorder(*args, self.out, **fake_options)
        self.assertEqual(status, 0, err)
        name = out.split(":")[0]
        with open(os.path.join(self.out, name + ".json")) as f:
            return name, json.load(f)


def requests(events):
    """What a replay takes from a trace: allocations (size, stream), frees and
    empty_cache markers, in order; frees as the index of the allocation they free."""
    out, live, n = [], {}, 0
    for action, addr, size, stream, _ in events:
        if action == "alloc":
            live[addr] = n
            out.append(("alloc", size))
            n += 1
        elif action == "free_completed":
            out.append(("free", live.pop(addr)))
        elif action == "empty_cache":
            out.append(("empty_cache",))
    return out


# ------------------------------------------------------------------ tests
class JsonTests(RecorderTest):
    def test_recorded_json_has_the_fields_allocsim_reads(self):
        """A plain run writes every field of the recorded-run JSON, events as 5-element
        rows, checkpoints at the index of their own snapshot entry."""
        name, j = self.record("fake_churn")
        self.assertEqual(name, "fake_churn")
        for key in ("workload", "alloc_conf", "cap_bytes", "device", "total_bytes", "torch", "wall_s",
                    "events", "checkpoints", "oom", "final_stats", "segments"):
            self.assertIn(key, j)
        self.assertTrue(all(len(e) == 5 and isinstance(e[0], str) for e in j["events"]))
        self.assertEqual([c["label"] for c in j["checkpoints"]], ["setup", "i9", "i19", "i29", "final"])
        for c in j["checkpoints"]:  # trace_len counts entries before the checkpoint's own
            self.assertEqual(j["events"][c["trace_len"]][0], "snapshot")
            self.assertEqual(set(c) - {"label"}, {"trace_len", "allocated", "reserved", "max_allocated", "max_reserved",
                                                  "inactive_split", "num_alloc_retries", "num_ooms", "segments", "driver_free"})
        for s in j["segments"]:
            self.assertTrue(all(len(b) == 2 for b in s["blocks"]))
            self.assertEqual([b[1] for b in s["block_details"]], [b[0] for b in s["blocks"]])
        self.assertFalse(j["wrapped"])
        self.assertEqual(j["mark_positions"], "metadata")
        self.assertEqual(j["recorder"]["format"], rt.FORMAT_VERSION)
        self.assertEqual(j["request_pools"], [])

    def test_pickle_is_the_same_snapshot(self):
        """--pickle (or DUMP_PICKLE=1) writes the snapshot the JSON was made from."""
        os.environ["DUMP_PICKLE"] = "1"
        name, j = self.record("fake_churn")
        with open(os.path.join(self.out, name + ".pickle"), "rb") as f:
            snap = pickle.load(f)
        rows = [e for e in j["events"] if e[0] != "empty_cache"]
        self.assertEqual([[e["action"], e.get("addr", 0), e["size"]] for e in snap["device_traces"][0]],
                         [r[:3] for r in rows])
        self.assertEqual(len(snap["segments"]), len(j["segments"]))

    def test_empty_cache_marker_sits_where_it_was_called(self):
        """torch.cuda.empty_cache() becomes an `empty_cache` event right before the
        segment frees it caused; checkpoints count entries without markers."""
        name, j = self.record("fake_pools")
        ev = j["events"]
        marks = [i for i, e in enumerate(ev) if e[0] == "empty_cache"]
        self.assertEqual(len(marks), 3)  # two graph captures and the explicit call
        last = marks[-1]
        self.assertEqual(ev[last + 1][0], "snapshot")
        self.assertEqual({e[0] for e in ev[last + 2 : last + 4]}, {"segment_free"})
        end = [c for c in j["checkpoints"] if c["label"] == "end"][0]
        self.assertEqual(ev[end["trace_len"] + len(marks)][0], "snapshot")


class PoolTests(RecorderTest):
    def test_every_request_gets_the_pool_that_served_it(self):
        """Graph captures and a MemPool phase: the recorded pool of every request equals
        the fake allocator's ground truth, including the request another thread made
        inside the MemPool window (served from the default pool)."""
        os.environ["DUMP_PICKLE"] = "1"
        name, j = self.record("fake_pools")
        with open(os.path.join(self.out, name + ".pickle"), "rb") as f:
            trace = pickle.load(f)["device_traces"][0]
        truth, k = {}, 0
        for i, e in enumerate(j["events"]):
            if e[0] == "empty_cache":
                continue
            if e[0] in ("alloc", "oom") and trace[k]["_pool"] != [0, 0]:
                truth[i] = trace[k]["_pool"]
            k += 1
        self.assertEqual({r[0]: r[1:] for r in j["request_pools"]}, truth)
        self.assertEqual(len(truth), 6)
        attr = j["pool_attribution"]
        self.assertEqual(attr["window_disagreements"], 1)  # the other thread's request
        i, observed, windowed = attr["first_window_disagreements"][0]
        self.assertEqual((observed, windowed), ([0, 0], [0, 5]))
        self.assertEqual(j["events"][i][2], 4096)

    def test_windows_and_releases(self):
        """Each capture and the use_mem_pool phase is a window bracketing exactly its
        requests; releases name how each pool was let go."""
        name, j = self.record("fake_pools")
        ev = j["events"]
        w = j["pool_windows"]
        self.assertEqual([(x["kind"], x["scope"]) for x in w],
                         [("graph_capture", "capture"), ("graph_capture", "capture"), ("use_mem_pool", "thread")])
        self.assertEqual([x["pool"] for x in w], [[1, 0], [3, 0], [0, 5]])
        for x in w:
            inside = [e for e in ev[x["begin"] + 1 : x["end"]] if e[0] == "alloc"]
            self.assertTrue(inside)
            self.assertEqual(ev[x["begin"]][0], "snapshot")
            self.assertEqual(ev[x["end"]][0], "snapshot")
        self.assertEqual(w[0]["streams"], [T().cuda.graph.default_capture_stream.cuda_stream])
        self.assertEqual([(r["pool"], r["how"]) for r in j["pool_releases"]],
                         [([0, 5], "use_mem_pool_exit"), ([1, 0], "graph_reset"),
                          ([3, 0], "graph_destroyed"), ([0, 5], "mem_pool_destroyed")])
        self.assertEqual(j["pool_releases"][0]["at"], w[2]["end"])
        self.assertEqual([(p["id"], p["kind"]) for p in j["pools"]],
                         [([1, 0], "graph"), ([3, 0], "graph"), ([0, 5], "mem_pool")])
        self.assertEqual([c["call"] for c in j["calls"]], ["reset_peak_memory_stats"])
        self.assertTrue(all(s["pool"] != [0, 0] for s in j["pool_segments"]))

    def test_allocation_to_a_pool_through_the_bindings(self):
        """The bindings under use_mem_pool called directly (torch.compile's CUDA graph
        trees warm up that way) are windows of kind allocate_to_pool with their releases,
        so every request they route agrees with the pool that served it; use_mem_pool
        itself stays one use_mem_pool window (test_windows_and_releases)."""
        name, j = self.record("fake_tree_pool")
        w = j["pool_windows"]
        self.assertEqual([(x["kind"], x["scope"], x["pool"]) for x in w],
                         [("graph_capture", "capture", [0, 9]),
                          ("allocate_to_pool", "thread", [0, 9]),
                          ("allocate_to_pool", "thread", [0, 9])])
        self.assertEqual([(r["pool"], r["how"]) for r in j["pool_releases"]],
                         [([0, 9], "release_pool"), ([0, 9], "release_pool"), ([0, 9], "graph_destroyed")])
        self.assertEqual(j["pool_attribution"]["window_disagreements"], 0)
        self.assertEqual(len(j["request_pools"]), 2)
        for x in w[1:]:
            inside = [e for e in j["events"][x["begin"] + 1 : x["end"]] if e[0] == "alloc"]
            self.assertEqual(len(inside), 1)

    def test_checkpoint_restore_span(self):
        """A pool set back to a checkpoint is a set_checkpoint_pool_state call with the
        positions it began and returned at, and the allocations it made (one per
        checkpointed block, each served from the pool) lie between them."""
        name, j = self.record("fake_checkpoint")
        calls = [c for c in j["calls"] if c["call"] == "set_checkpoint_pool_state"]
        self.assertEqual(len(calls), 1)
        at, end = calls[0]["at"], calls[0]["end"]
        self.assertLess(at, end)
        inside = [(i, e) for i, e in enumerate(j["events"]) if at < i < end]
        allocs = [(i, e) for i, e in inside if e[0] == "alloc"]
        self.assertEqual([e[2] for _, e in allocs], [MiB // 2, MiB // 4, MiB + MiB // 4])
        pools = {r[0]: r[1:] for r in j["request_pools"]}
        self.assertTrue(all(pools.get(i) == [0, 9] for i, _ in allocs))

    def test_golden_fake_pools_json(self):
        """The fake_pools recording is byte-for-byte the committed fixture (the Rust
        suite reads it as a recorded run); UPDATE_EXPECT=1 rewrites it."""
        name, j = self.record("fake_pools")
        j["wall_s"] = 0.0
        j["driver_version"] = None
        text = json.dumps(j, indent=1, sort_keys=True) + "\n"
        if os.environ.get("UPDATE_EXPECT") == "1":
            os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
            with open(GOLDEN, "w") as f:
                f.write(text)
        with open(GOLDEN) as f:
            self.assertEqual(f.read(), text, "rerun with UPDATE_EXPECT=1 if the change is intended")

    def test_oom_during_capture_is_a_result(self):
        """An OOM inside a graph capture under a cap: exit 0, the OOM recorded, the
        window closed, the failed request attributed to the graph's pool."""
        name, j = self.record("fake_capture_oom", "--cap", "32M")
        self.assertEqual(name, "fake_capture_oom__cap32M")
        self.assertTrue(j["oom"]["message"].startswith("CUDA out of memory"))
        ooms = [i for i, e in enumerate(j["events"]) if e[0] == "oom"]
        self.assertEqual(len(ooms), 1)
        self.assertLessEqual(ooms[0], j["oom"]["trace_len"])
        w = j["pool_windows"][0]
        self.assertTrue(w["closed"])
        self.assertLess(w["begin"], ooms[0])
        self.assertLess(ooms[0], w["end"])
        self.assertIn([ooms[0]] + w["pool"], j["request_pools"])
        self.assertEqual(j["cap_bytes"], 32 * MiB)


class PositionTests(RecorderTest):
    def test_ring_buffer_positions(self):
        """With a ring buffer that wrapped, the JSON holds the last entries, and each
        checkpoint's position points at its own snapshot entry, the same entry as in
        an unwrapped run of the same program; earlier checkpoints are listed apart."""
        _, full = self.record("fake_churn", "--set", "n=60")
        for meta in (True, False):
            _, ring = self.record("fake_churn", "--set", "n=60", "--max-entries", "70", "--overwrite", metadata=meta)
            self.assertTrue(ring["wrapped"])
            self.assertEqual(ring["mark_positions"], "metadata" if meta else "tail")
            rows = [e for e in ring["events"] if e[0] != "empty_cache"]
            self.assertEqual(len(rows), 70)
            full_rows = [e for e in full["events"] if e[0] != "empty_cache"]
            dropped = len(full_rows) - 70
            self.assertEqual([r[:4] for r in rows], [r[:4] for r in full_rows[dropped:]])
            by_label = {c["label"]: c["trace_len"] for c in full["checkpoints"]}
            for c in ring["checkpoints"]:
                self.assertEqual(c["trace_len"], by_label[c["label"]] - dropped)
            before = [c["label"] for c in ring["checkpoints_before_trace"]]
            self.assertEqual(before + [c["label"] for c in ring["checkpoints"]], list(by_label))
            self.assertTrue(before)
            self.assertTrue(all(c["trace_len"] is None for c in ring["checkpoints_before_trace"]))

    def test_late_start(self):
        """--late-start begins recording after the workload's setup: the state then
        is in start_state, the setup checkpoint is before the trace."""
        name, j = self.record("fake_churn", "--late-start")
        self.assertEqual(name, "fake_churn__late")
        self.assertTrue(j["late_start"])
        self.assertEqual([c["label"] for c in j["checkpoints_before_trace"]], ["setup"])
        segs = j["start_state"]["segments"]
        self.assertEqual(len(segs), 2)
        self.assertTrue(all(s["block_details"][0][3] == "active_allocated" for s in segs))
        created = {e[1] for e in j["events"] if e[0] == "segment_alloc"}
        self.assertFalse({s["address"] for s in segs} & created)
        # the weights are freed at the end: frees of memory allocated before the trace
        freed = {e[1] for e in j["events"] if e[0] == "free_completed"}
        self.assertTrue({s["address"] for s in segs} <= freed)


class ClassicWorkloadTests(RecorderTest):
    def assert_same_program(self, workload, recorded):
        _, j = self.record(workload)
        with open(os.path.join(ORACLE, recorded)) as f:
            real = json.load(f)
        self.assertEqual(requests(j["events"]), requests(real["events"]))
        self.assertEqual([c["label"] for c in j["checkpoints"]], [c["label"] for c in real["checkpoints"]])

    def test_seed000_is_the_recorded_program(self):
        """seed000 asks for the same allocations, frees and empty_cache, with the same
        checkpoints, as the real recorded run in tests/data/oracle."""
        self.assert_same_program("seed000", "seed000.json")

    def test_random_stress_is_the_recorded_program(self):
        """random_stress's defaults reproduce the recorded run's 6000-step request
        sequence."""
        self.assert_same_program("random_stress", "random_stress.json")

    def test_multistream_is_the_recorded_program(self):
        """multistream reproduces the recorded run's requests."""
        self.assert_same_program("multistream", "multistream.json")


class CommandLineTests(RecorderTest):
    def test_usage_errors_exit_2(self):
        """Bad workloads, parameters, sizes and directories: one line, exit 2."""
        cases = [
            (["nope", self.out], "unknown workload 'nope'"),
            (["fake_churn", self.out, "--set", "x=1"], "has no parameter 'x' (known: every, n, seed)"),
            (["fake_churn", self.out, "--set", "n=many"], "fake_churn's n takes an integer (default 30)"),
            (["fake_churn", self.out, "--cap", "5 potatoes"], "is not a size"),
            (["fake_churn", os.path.join(self.out, "missing")], "not a directory"),
            (["fake_churn", self.out, "--max-entries", "0"], "must be at least 1"),
            ([], "name a workload"),
            (["fake_capture_oom", self.out, "--late-start"], "has no setup point"),
        ]
        for args, message in cases:
            status, _, err = self.run_recorder(*args)
            self.assertEqual(status, 2, args)
            self.assertIn(message, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_no_cuda_exits_3_and_no_overwrite(self):
        """Without a CUDA device: exit 3. An existing output is not replaced unless
        --overwrite."""
        status, _, err = self.run_recorder("fake_churn", self.out, available=False)
        self.assertEqual((status, err.strip()), (3, "record_torch.py: no CUDA device is available to PyTorch"))
        self.record("fake_churn")
        status, _, err = self.run_recorder("fake_churn", self.out)
        self.assertEqual(status, 2)
        self.assertIn("exists (--overwrite replaces it)", err)
        self.record("fake_churn", "--overwrite")

    def test_names_and_settings(self):
        """The file name carries the changed parameters, the allocator settings, the
        cap, the ring buffer, the late start and a tag; the conf is recorded."""
        name, j = self.record("fake_churn", "--set", "n=12", "--set", "every=4", "--alloc-conf",
                              "expandable_segments:True,roundup_power2_divisions:[256:1,>:8]",
                              "--cap", "3GiB", "--max-entries", "1000", "--tag", "try 2")
        self.assertEqual(name, "fake_churn__n-12_every-4__expandable_segments-True_roundup_power2_divisions-(256-1_gt-8)"
                               "__cap3072M__wrap1000__try-2")
        self.assertEqual(j["alloc_conf"], "expandable_segments:True,roundup_power2_divisions:[256:1,>:8]")
        self.assertEqual(j["params"], {"n": 12, "every": 4, "seed": 3})
        self.assertEqual(os.environ["PYTORCH_CUDA_ALLOC_CONF"], j["alloc_conf"])
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
        status, _, err = self.run_recorder("fake_churn", self.out, "--alloc-conf", "x:1")
        self.assertEqual(status, 2)
        self.assertIn("PYTORCH_ALLOC_CONF is set", err)

    def test_list_shows_every_workload(self):
        """--list names every workload with its parameters."""
        status, out, _ = self.run_recorder("--list")
        self.assertEqual(status, 0)
        for name in ("seed000", "gpt_train", "kv_cache_inference", "unet_train", "resnet_train",
                     "graph_capture", "mempool_phases", "random_stress"):
            self.assertIn(name, out)
        self.assertIn("graph_capture  batches=1,8,32", out)


class AttributionTests(unittest.TestCase):
    def test_addresses_windows_and_partial_unmaps(self):
        """A snapshot's segment pool wins over the windows; memory never seen in a
        snapshot takes the window of the entry that created it; a partial unmap keeps
        the rest of a range; memory from before the trace is covered by observation."""
        ev = [
            ["segment_map", 1000, 400, 7, 0],  # 0: created inside the capture window
            ["alloc", 1100, 10, 7, 0],  # 1
            ["segment_unmap", 1000, 100, 7, 0],  # 2: [1000, 1100) gone, [1100, 1400) stays
            ["alloc", 1300, 10, 9, 0],  # 3: another stream, outside the window's streams
            ["alloc", 5000, 10, 0, 0],  # 4: memory from before the trace
            ["oom", 0, 4096, 7, 0],  # 5: inside the window
            ["snapshot", 0, 0, 0, 0],  # 6: a snapshot shows [5000, 6000) in pool (0, 9)
        ]
        windows = [{"pool": [2, 0], "scope": "capture", "streams": [7], "begin": None, "end": 6}]
        pools, methods, dis = rt.attribute_pools(ev, windows, [(6, [(5000, 1000, (0, 9))])])
        self.assertEqual(pools, {1: (2, 0), 3: (2, 0), 4: (0, 9), 5: (2, 0)})
        self.assertEqual(methods, {"trace": 0, "address": 1, "segment_window": 2, "window": 1})
        self.assertEqual(dis, [[4, [0, 9], [0, 0]]])
        # the trace's own pool ids (newer PyTorch) come first
        carried = [None, (5, 5), None, None, None, None, None]
        pools, methods, _ = rt.attribute_pools(ev, windows, [], carried)
        self.assertEqual((pools[1], methods["trace"]), ((5, 5), 1))

    def test_sizes(self):
        """Sizes in bytes and binary units."""
        self.assertEqual([rt.parse_size(s) for s in ("512", "4KiB", "5120M", "2GiB", "3g")],
                         [512, 4096, 5120 * MiB, 2 << 30, 3 << 30])


if __name__ == "__main__":
    unittest.main()
