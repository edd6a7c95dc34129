#!/usr/bin/env python3
"""Record PyTorch's CUDA caching allocator on a real GPU: ground truth for allocsim.

    python3 tools/record_torch.py WORKLOAD [OUTDIR] [options]
    python3 tools/record_torch.py --list

Runs one workload in this process on cuda:0 with the allocator's history recording on,
and writes OUTDIR/<name>.json: PyTorch's allocator trace, its statistics at labelled
checkpoints, the final segments, the OOM if one happened and, for runs with private
pools (CUDA graphs, torch.cuda.MemPool), the windows in which allocation to each pool
was active and the pool every request was served from. `allocsim` reads the JSON as a
recorded run. docs/recording.md describes every workload, option and field.

One workload per process: PYTORCH_CUDA_ALLOC_CONF is read when CUDA initializes.
Exit status: 0 recorded (an out-of-memory inside the workload is a result), 1 the
workload failed otherwise (nothing written), 2 bad usage, 3 no CUDA device.
"""

import argparse
import bisect
import contextlib
import json
import math
import os
import pickle
import random
import re
import sys
import tempfile
import time

RECORDER = "allocsim tools/record_torch.py"
# Version of the JSON this script writes (files without "recorder" are version 1: the
# fields every version has; version 2 adds the fields marked [v2] in docs/trace-format.md).
FORMAT_VERSION = 2

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_POOL = (0, 0)
# A mark's `snapshot` entry carries this user_metadata (followed by the mark's number).
MARK_TAG = "allocsim-mark:"
# Trace entries remembered per mark, to find it again after a ring-buffer wrap where
# PyTorch cannot tag entries with user_metadata.
TAIL = 8
UNLIMITED = sys.maxsize

torch = None  # imported by main() after PYTORCH_CUDA_ALLOC_CONF is settled


class UsageError(Exception):
    """Bad command line: one line on stderr, exit 2."""


class NoCuda(Exception):
    """No usable CUDA device: one line on stderr, exit 3."""


class RecorderError(Exception):
    """The recording is inconsistent (a bug here or in an assumption about PyTorch)."""


# ------------------------------------------------------------------ workload registry
WORKLOADS = {}


class Workload:
    """A registered workload: its function, its parameters (name -> default) and doc."""

    def __init__(self, fn, params):
        self.name = fn.__name__
        self.fn = fn
        self.params = dict(params)
        self.doc = " ".join((fn.__doc__ or "").split())


def workload(**params):
    """Registers `fn(rec, **params)` as a workload; keyword defaults are its parameters,
    settable with `--set key=value`. Defaults of the classic workloads reproduce the
    programs behind tests/data/oracle exactly."""

    def register(fn):
        WORKLOADS[fn.__name__] = Workload(fn, params)
        return fn

    return register


def convert_param(workload_name, key, text, default):
    """`text` converted to the type of `default` (bool, int, float, tuple of ints, str)."""
    try:
        if isinstance(default, bool):
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.split(",") if x.strip())
        return text
    except ValueError:
        kind = ("0 or 1" if isinstance(default, bool) else "an integer" if isinstance(default, int)
                else "a number" if isinstance(default, float) else "a list of integers")
        raise UsageError(
            f"--set {key}={text}: {workload_name}'s {key} takes {kind} (default {format_param(default)})"
        ) from None


def format_param(value):
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def parse_size(text):
    """Bytes from `123`, `64KiB`, `5120M`, `80GiB` (binary units; `K`, `M`, `G` too)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    units = {"": 1, "b": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}
    if not m or m.group(2).lower() not in units:
        raise UsageError(f"{text!r} is not a size (examples: 1073741824, 5120M, 5GiB)")
    return int(m.group(1)) * units[m.group(2).lower()]


def safe_tag(text):
    """`text` made safe for a file name the way recorded runs are named:
    ':'→'-', ','→'_', '['→'(', ']'→')', '>'→'gt', anything else odd → '-'."""
    for a, b in ((":", "-"), (",", "_"), ("[", "("), ("]", ")"), (">", "gt"), ("=", "-")):
        text = text.replace(a, b)
    return re.sub(r"[^A-Za-z0-9._()+-]", "-", text)


def run_name(workload_name, changed_params, conf, cap, max_entries, late_start, tag):
    """`<workload>[__<params>][__<conf>][__cap<N>M][__wrap<N>][__late][__<tag>]`."""
    name = workload_name
    if changed_params:
        name += "__" + safe_tag("_".join(f"{k}-{format_param(v)}" for k, v in changed_params))
    if conf:
        name += "__" + safe_tag(conf)
    if cap is not None:
        name += f"__cap{cap // MiB}M" if cap % MiB == 0 else f"__cap{cap}B"
    if max_entries != UNLIMITED:
        name += f"__wrap{max_entries}"
    if late_start:
        name += "__late"
    if tag:
        name += "__" + safe_tag(tag)
    return name


# ------------------------------------------------------------------ trace positions
class Mark:
    """A moment of the run, found again in the final trace by `resolve_marks`.

    Taking a mark calls `torch.cuda.memory._snapshot()`, which appends a `snapshot`
    entry to the trace: that entry sits at the mark's position. Where PyTorch has
    `_set_memory_metadata`, the entry carries the user_metadata `tag` (the thread's
    metadata is set just before and cleared just after). `raw`: entries recorded
    before the mark (None while not recording); `tail`: identity of the last TAIL of
    them. `pos` is filled at the end: the index of the mark's entry in the final trace,
    None when it lies before the first recorded entry."""

    __slots__ = ("raw", "tail", "tag", "pos")

    def __init__(self, raw, tail, tag=None):
        self.raw = raw
        self.tail = tail
        self.tag = tag
        self.pos = None


def entry_key(e):
    """What identifies a trace entry across snapshots (time_us does not: PyTorch
    converts its clock anew for every snapshot)."""
    return (e.get("action"), e.get("addr", 0), e.get("size", 0), e.get("stream", 0))


def resolve_marks(trace, marks, wrapped):
    """Fills `mark.pos` for `marks` (in the order taken) from the final `trace` and
    returns how: "metadata" (each mark's entry found by its tag), "count" (no wrap:
    the position is the count of entries at the time, checked against the remembered
    tail) or "tail" (a wrap without tags: the remembered tail searched for, later
    marks after earlier ones; in a loop that repeats the same allocations at the same
    addresses this can pick a later repetition, so such positions are best effort).
    A mark whose entry fell out of the ring buffer lies before the trace (None)."""
    tagged = {}
    for i, e in enumerate(trace):
        md = e.get("user_metadata")
        if e.get("action") == "snapshot" and isinstance(md, str) and md.startswith(MARK_TAG):
            tagged.setdefault(md, i)
    keys = [entry_key(e) for e in trace]
    method = "metadata" if tagged else ("tail" if wrapped else "count")
    index = {}
    last = 0
    for m in marks:
        m.pos = None
        if m.raw is None:
            continue
        if method == "metadata":
            m.pos = tagged.get(m.tag)
            if not wrapped and m.pos != m.raw:
                raise RecorderError(
                    f"mark {m.tag} taken after {m.raw} trace entries is at {m.pos} in the final trace"
                )
            continue
        k = len(m.tail)
        if method == "count":
            if m.raw > len(keys) or tuple(keys[m.raw - k : m.raw]) != m.tail:
                raise RecorderError(
                    f"a mark taken after {m.raw} trace entries does not match the final trace "
                    f"({len(keys)} entries): the trace changed other than by appending"
                )
            m.pos = m.raw
            continue
        if k == 0:
            continue  # taken before anything was recorded; the wrap dropped that start
        if k not in index:
            table = {}
            for end in range(k, len(keys) + 1):
                table.setdefault(tuple(keys[end - k : end]), []).append(end)
            index[k] = table
        ends = index[k].get(m.tail, [])
        i = bisect.bisect_left(ends, last)
        if i < len(ends):
            m.pos = last = ends[i]
    return method


def insert_markers(rows, marker_positions):
    """`rows` with an `empty_cache` row inserted before raw entry p for each p (p may be
    len(rows)); a marker takes the time of the entry it precedes. Returns (events,
    index) where index(p) maps a raw position to its index in events."""
    markers = sorted(marker_positions)
    events = []
    j = 0
    for r, row in enumerate(rows):
        while j < len(markers) and markers[j] == r:
            events.append(["empty_cache", 0, 0, 0, row[4]])
            j += 1
        events.append(row)
    while j < len(markers):
        events.append(["empty_cache", 0, 0, 0, rows[-1][4] if rows else 0])
        j += 1

    def index(p):
        return None if p is None else p + bisect.bisect_left(markers, p)

    return events, index


# ------------------------------------------------------------------ pool attribution
class _Range:
    """Device memory PyTorch got for one pool: a segment (`segment_alloc`) or a mapped
    range of an expandable segment (`segment_map`)."""

    __slots__ = ("observed", "window_pool")

    def __init__(self, observed, window_pool):
        self.observed = observed  # pool seen in a snapshot while the range was live
        self.window_pool = window_pool  # pool the windows give for its creating entry


class _Intervals:
    """Disjoint live address intervals [start, end) → _Range."""

    def __init__(self):
        self.starts = []
        self.items = {}  # start -> (end, range)

    def _overlapping(self, s, e):
        i = max(bisect.bisect_right(self.starts, s) - 1, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < e:
            st = self.starts[i]
            en, r = self.items[st]
            if en > s:
                out.append((st, en, r))
            i += 1
        return out

    def _put(self, s, e, r):
        bisect.insort(self.starts, s)
        self.items[s] = (e, r)

    def remove(self, s, e):
        for st, en, r in self._overlapping(s, e):
            self.starts.remove(st)
            del self.items[st]
            if st < s:
                self._put(st, s, r)
            if en > e:
                self._put(e, en, r)

    def add(self, s, e, r):
        self.remove(s, e)
        self._put(s, e, r)

    def find(self, x):
        i = bisect.bisect_right(self.starts, x) - 1
        if i >= 0:
            e, r = self.items[self.starts[i]]
            if x < e:
                return r
        return None

    def observe(self, s, e, pool):
        """Marks every live range in [s, e) as `pool`'s and covers the gaps (memory
        that existed before the trace) with new ranges of `pool`. Returns how many
        ranges had been observed in another pool."""
        conflicts = 0
        cursor = s
        for st, en, r in self._overlapping(s, e):
            if r.observed is not None and r.observed != pool:
                conflicts += 1
            r.observed = pool
            if st > cursor:
                self._put(cursor, st, _Range(pool, None))
            cursor = max(cursor, en)
        if cursor < e:
            self._put(cursor, e, _Range(pool, None))
        return conflicts


def window_pool(windows, i, stream):
    """The pool the windows route entry `i` on `stream` to: among windows open at i
    (begin <= i < end; begin None = before the trace) whose scope takes the stream
    (`capture`: one of its streams; `thread`: any stream), the one begun last, as
    PyTorch searches captures_underway last first; else the default pool."""
    best = None
    for w in windows:
        b = -1 if w["begin"] is None else w["begin"]
        if b <= i < w["end"] and w["pool"] is not None:
            if w["scope"] == "thread" or stream in w["streams"]:
                if best is None or b >= best[0]:
                    best = (b, tuple(w["pool"]))
    return DEFAULT_POOL if best is None else best[1]


def attribute_pools(events, windows, observations, entry_pools=None):
    """The pool each request (`alloc` and `oom` entry) of `events` was served from.

    `windows`: dicts with pool, scope, streams, begin, end (indexes into events).
    `observations`: (index, [(address, total_size, pool), ...]): the segments a snapshot
    taken at events[index] showed (all pools). `entry_pools`: pool per entry where the
    trace carries it (PyTorch versions that write `pool_id`), else None.

    Where an entry carries its pool, that is the answer ("trace"). Otherwise the
    request's address lies in a segment or mapped range the trace created; if a
    snapshot showed that memory while it was live, its segment_pool_id is the answer
    ("address"); else the windows at the entry that created the memory
    ("segment_window"); an `oom` entry, or an address outside any known memory, gets
    the windows at the request ("window"). Returns (pools, methods, disagreements):
    pools[i] for each request index i, the count per method, and the requests whose
    address-based pool differs from what the windows alone say (a MemPool's window
    covers one thread only; use_on_oom pools serve requests outside any window).
    """
    obs_at = {}
    for idx, extents in observations:
        obs_at.setdefault(idx, []).extend(extents)
    live = _Intervals()
    requests = []
    for i, ev in enumerate(events):
        for addr, size, pool in obs_at.pop(i, ()):
            live.observe(addr, addr + size, tuple(pool))
        action, addr, size, stream = ev[0], ev[1], ev[2], ev[3]
        if action in ("segment_alloc", "segment_map"):
            live.add(addr, addr + size, _Range(None, window_pool(windows, i, stream)))
        elif action in ("segment_free", "segment_unmap"):
            live.remove(addr, addr + size)
        elif action == "alloc":
            rng = live.find(addr)
            if rng is None:  # memory from before the trace: a later snapshot may show it
                rng = _Range(None, None)
                live.add(addr, addr + 1, rng)
            requests.append((i, rng, window_pool(windows, i, stream)))
        elif action == "oom":
            requests.append((i, None, window_pool(windows, i, stream)))
    for idx in sorted(obs_at):  # snapshots after the last entry
        for addr, size, pool in obs_at[idx]:
            live.observe(addr, addr + size, tuple(pool))
    pools = {}
    methods = {"trace": 0, "address": 0, "segment_window": 0, "window": 0}
    disagreements = []
    for i, rng, wpool in requests:
        carried = entry_pools[i] if entry_pools is not None else None
        if carried is not None:
            pool, how = tuple(carried), "trace"
        elif rng is not None and rng.observed is not None:
            pool, how = rng.observed, "address"
        elif rng is not None and rng.window_pool is not None:
            pool, how = rng.window_pool, "segment_window"
        else:
            pool, how = wpool, "window"
        if how in ("trace", "address") and pool != wpool:
            disagreements.append([i, list(pool), list(wpool)])
        pools[i] = pool
        methods[how] += 1
    return pools, methods, disagreements


# ------------------------------------------------------------------ snapshots
def device_trace(snap, device=0):
    traces = snap.get("device_traces") or []
    return traces[device] if device < len(traces) else []


def trace_row(e):
    """A trace entry as `[action, addr, size, stream, time_us]` (an `oom` has no addr)."""
    return [e["action"], int(e.get("addr", 0)), int(e.get("size", 0)), int(e.get("stream", 0)), int(e.get("time_us", 0))]


def segment_json(s):
    """A snapshot segment: the fields allocsim's reader needs, and [v2] the rest of
    what a mid-run rebuild needs (block addresses, requested sizes, pool)."""
    blocks = s.get("blocks", [])
    return {
        "address": s["address"],
        "total_size": s["total_size"],
        "stream": s["stream"],
        "segment_type": s["segment_type"],
        "allocated_size": s["allocated_size"],
        "blocks": [[b["size"], b["state"]] for b in blocks],
        "device": s.get("device", 0),
        "active_size": s.get("active_size"),
        "requested_size": s.get("requested_size"),
        "is_expandable": bool(s.get("is_expandable", False)),
        "segment_pool_id": list(s.get("segment_pool_id", DEFAULT_POOL)),
        "block_details": [[b.get("address"), b["size"], b.get("requested_size"), b["state"]] for b in blocks],
    }


def pool_of(value):
    """A pool id as a tuple of two ints, from what a snapshot holds; None otherwise."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    return None


def device_segments(segments, device=0):
    return [s for s in segments if s.get("device", 0) == device]


def numeric_stats(stats):
    return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def find_oom(exc):
    """The OutOfMemoryError behind `exc` (itself, or raised while it was handled, as
    when a failed capture's capture_end raises again), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def driver_version():
    """cuDriverGetVersion(), or None where libcuda cannot be asked."""
    try:
        import ctypes

        v = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
            return v.value
    except (OSError, AttributeError):
        pass
    return None


# ------------------------------------------------------------------ the recorder
class Recorder:
    """Runs a workload and keeps everything the JSON needs. Workloads get it as `rec`:
    `rec.dev` (cuda:0), `rec.cp(label)` (a checkpoint of PyTorch's statistics) and
    `rec.setup_done()` (where `--late-start` begins recording: after the model is
    loaded). Graph captures, MemPools, use_mem_pool, allocation to a pool through
    the bindings under it (as torch.compile's CUDA graph trees use them) and the calls
    that change the allocator are recorded through patches installed by `install()`."""

    def __init__(self, opts):
        self.opts = opts
        self.dev = torch.device("cuda:0")
        self.recording = False
        self.finished = False
        self.marks = []  # every mark, in the order taken
        self.checkpoints = []  # (label, mark, stats)
        self.empty_cache_marks = []
        self.calls = []  # (mark, call, args, end mark or None)
        self.pools = {}  # pool id -> dict
        self.windows = []  # dicts with begin/end marks
        self.releases = []  # (pool, mark, how)
        self.observations = []  # (mark, [(address, size, pool, is_expandable)])
        self.start_state = None
        self.final_snapshot = None
        self.can_tag = hasattr(torch.cuda.memory, "_set_memory_metadata")
        self.quiet = 0  # inside use_mem_pool's own enter or exit: its bindings record nothing
        self.pool_windows_open = []  # windows of the allocate-to-pool bindings, open

    # -- marks and checkpoints
    def mark(self):
        if not self.recording:
            m = Mark(None, ())
        else:
            tag = f"{MARK_TAG}{len(self.marks)}" if self.can_tag else None
            if tag:
                torch.cuda.memory._set_memory_metadata(tag)
            try:
                snap = torch.cuda.memory._snapshot()
            finally:
                if tag:
                    torch.cuda.memory._set_memory_metadata("")
            trace = device_trace(snap)
            m = Mark(len(trace), tuple(entry_key(e) for e in trace[-TAIL:]), tag)
            extents = [
                (s["address"], s["total_size"], pool_of(s.get("segment_pool_id")) or DEFAULT_POOL, bool(s.get("is_expandable", False)))
                for s in device_segments(snap.get("segments", []))
            ]
            self.observations.append((m, extents))
        self.marks.append(m)
        return m

    def cp(self, label):
        """Checkpoint: PyTorch's statistics now, at the trace position now. Not
        allowed during graph capture (it synchronizes)."""
        if torch.cuda.is_current_stream_capturing():
            raise RecorderError(f"cp({label!r}) during CUDA graph capture")
        torch.cuda.synchronize()
        s = torch.cuda.memory_stats()
        stats = {
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "inactive_split": s.get("inactive_split_bytes.all.current", 0),
            "num_alloc_retries": s.get("num_alloc_retries", 0),
            "num_ooms": s.get("num_ooms", 0),
            "segments": s.get("segment.all.current", 0),
            "driver_free": torch.cuda.mem_get_info()[0],
        }
        self.checkpoints.append((label, self.mark(), stats))

    def start_recording(self):
        segments = device_segments(torch.cuda.memory_snapshot())
        self.start_state = {
            "segments": [segment_json(s) for s in segments],
            "stats": numeric_stats(torch.cuda.memory_stats()),
        }
        torch.cuda.memory._record_memory_history(
            enabled="all",
            context=self.opts.context,
            stacks=self.opts.stacks,
            max_entries=self.opts.max_entries,
        )
        self.recording = True

    def setup_done(self, label="setup"):
        """The workload's setup (model, optimizer, static buffers) is in place: a
        checkpoint named `label`; with --late-start, recording begins here."""
        self.cp(label)
        if self.opts.late_start and not self.recording:
            self.start_recording()

    # -- pools
    def note_pool(self, pool, kind, mark=None, **options):
        if pool not in self.pools:
            self.pools[pool] = dict(kind=kind, created=mark, **options)

    def open_window(self, pool, kind, scope, streams):
        w = {
            "pool": pool,
            "kind": kind,
            "scope": scope,
            "streams": list(streams),
            "begin": self.mark(),
            "end": None,
        }
        self.windows.append(w)
        if pool is not None:
            self.note_pool(pool, "graph" if kind in ("graph_capture", "allocate_to_pool") else "mem_pool", w["begin"])
        return w

    def close_window(self, w):
        if w["end"] is None:
            w["end"] = self.mark()

    def release(self, pool, how, mark=None):
        self.releases.append((pool, mark if mark is not None else self.mark(), how))

    # -- patches
    def install(self):
        """Wraps the PyTorch entry points whose effect the trace does not show."""
        rec = self
        C = torch._C

        def patch_c(name, call):
            orig = getattr(C, name, None)
            if orig is None:
                return

            def wrapper(*args, **kwargs):
                if rec.finished:
                    return orig(*args, **kwargs)
                m = rec.mark()
                if call == "empty_cache":
                    rec.empty_cache_marks.append(m)
                    return orig(*args, **kwargs)
                record = [m, call, [a if isinstance(a, (int, float, str)) else repr(a) for a in args], None]
                rec.calls.append(record)
                out = orig(*args, **kwargs)
                if call == "set_checkpoint_pool_state":
                    # The call's allocations and frees (a pool set back to a checkpoint)
                    # lie between its two marks.
                    record[3] = rec.mark()
                return out

            setattr(C, name, wrapper)

        patch_c("_cuda_emptyCache", "empty_cache")
        patch_c("_accelerator_emptyCache", "empty_cache")
        patch_c("_cuda_resetPeakMemoryStats", "reset_peak_memory_stats")
        patch_c("_cuda_resetAccumulatedMemoryStats", "reset_accumulated_memory_stats")
        patch_c("_cuda_setMemoryFraction", "set_per_process_memory_fraction")
        patch_c("_cuda_cudaCachingAllocator_enable", "caching_allocator_enable")
        patch_c("_accelerator_setAllocatorSettings", "set_allocator_settings")

        patch_c("_cuda_setCheckpointPoolState", "set_checkpoint_pool_state")

        # Allocation to a private pool outside a graph capture, through the bindings
        # that `torch.cuda.use_mem_pool` is built on: inductor's CUDA graph trees
        # (`torch.compile(mode="reduce-overhead")`) warm their graphs up in the trees'
        # pool this way (`_use_cuda_memory_pool_manager`: begin, the work, end, then
        # release). `use_mem_pool` itself is recorded below, so these record nothing
        # while it enters or exits (`rec.quiet`).
        def patch_begin(name, scope):
            orig = getattr(C, name, None)
            if orig is None:
                return

            def begin_to_pool(device, pool, *args, **kwargs):
                out = orig(device, pool, *args, **kwargs)
                if not rec.finished and not rec.quiet:
                    streams = [torch.cuda.current_stream().cuda_stream] if scope == "stream" else []
                    rec.pool_windows_open.append(rec.open_window(tuple(pool), "allocate_to_pool", scope, streams))
                return out

            setattr(C, name, begin_to_pool)

        def patch_end(name):
            orig = getattr(C, name, None)
            if orig is None:
                return

            def end_to_pool(device, *args, **kwargs):
                if not rec.finished and not rec.quiet and rec.pool_windows_open:
                    pool = tuple(args[0]) if args else None
                    open_ = rec.pool_windows_open
                    i = max((k for k, w in enumerate(open_) if pool is None or w["pool"] == pool), default=None)
                    if i is not None:
                        rec.close_window(open_.pop(i))
                return orig(device, *args, **kwargs)

            setattr(C, name, end_to_pool)

        patch_begin("_cuda_beginAllocateCurrentStreamToPool", "stream")
        patch_begin("_cuda_beginAllocateCurrentThreadToPool", "thread")
        patch_end("_cuda_endAllocateCurrentStreamToPool")
        patch_end("_cuda_endAllocateToPool")
        orig_release_pool = getattr(C, "_cuda_releasePool", None)
        if orig_release_pool is not None:

            def release_pool(device, pool, *args, **kwargs):
                if not rec.finished and not rec.quiet:
                    rec.release(tuple(pool), "release_pool")
                return orig_release_pool(device, pool, *args, **kwargs)

            C._cuda_releasePool = release_pool

        G = torch.cuda.CUDAGraph
        orig_begin, orig_end, orig_reset = G.capture_begin, G.capture_end, G.reset
        orig_del = getattr(G, "__del__", None)

        def capture_begin(g, *args, **kwargs):
            pool = args[0] if args else kwargs.get("pool")
            orig_begin(g, *args, **kwargs)
            # The allocator routes to the pool once the stream captures, which it does
            # from here; the pool id of a new pool is known after capture_end.
            stream = torch.cuda.current_stream().cuda_stream
            g._allocsim_window = rec.open_window(
                tuple(pool) if pool is not None and any(pool) else None, "graph_capture", "capture", [stream]
            )

        def capture_end(g):
            w = getattr(g, "_allocsim_window", None)
            if w is not None:
                rec.close_window(w)
            orig_end(g)
            if w is not None:
                pool = tuple(g.pool())
                w["pool"] = pool
                rec.note_pool(pool, "graph", w["begin"])
                g._allocsim_window = None
                g._allocsim_pool = pool

        def reset(g):
            pool = getattr(g, "_allocsim_pool", None)
            if pool is not None and not rec.finished:
                rec.release(pool, "graph_reset")
                g._allocsim_pool = None
            orig_reset(g)

        def graph_del(g):
            # Runs before the C++ destructor, which releases the pool of a graph
            # whose capture ended and that was not reset.
            try:
                pool = getattr(g, "_allocsim_pool", None)
                if pool is not None and not rec.finished:
                    rec.release(pool, "graph_destroyed")
                    g._allocsim_pool = None
            finally:
                if orig_del is not None:
                    orig_del(g)

        G.capture_begin, G.capture_end, G.reset, G.__del__ = capture_begin, capture_end, reset, graph_del

        Base = torch.cuda.memory.MemPool

        class MemPool(Base):
            """torch.cuda.MemPool, recorded: creation and destruction."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                use_on_oom = kwargs.get("use_on_oom", args[1] if len(args) > 1 else False)
                no_split = kwargs.get("no_split", args[2] if len(args) > 2 else False)
                custom = kwargs.get("allocator", args[0] if args else None) is not None
                self._allocsim_pool = tuple(self.id)
                rec.note_pool(
                    self._allocsim_pool, "mem_pool", rec.mark(),
                    use_on_oom=bool(use_on_oom), no_split=bool(no_split), custom_allocator=custom,
                )

            def __del__(self):
                # The C++ destructor then releases the pool and empties its cache.
                try:
                    pool = getattr(self, "_allocsim_pool", None)
                    if pool is not None and not rec.finished:
                        rec.release(pool, "mem_pool_destroyed")
                        self._allocsim_pool = None
                finally:
                    parent = getattr(super(), "__del__", None)
                    if parent is not None:
                        parent()

        orig_use = torch.cuda.memory.use_mem_pool

        @contextlib.contextmanager
        def use_mem_pool(pool, device=None):
            w = None
            inner = orig_use(pool, device)
            rec.quiet += 1
            try:
                inner.__enter__()
            finally:
                rec.quiet -= 1
            try:
                # PyTorch routes this thread's requests, on every stream, to the pool.
                w = rec.open_window(tuple(pool.id), "use_mem_pool", "thread", [])
                try:
                    yield
                finally:
                    rec.close_window(w)
            finally:
                rec.quiet += 1
                try:
                    inner.__exit__(*sys.exc_info())
                finally:
                    rec.quiet -= 1
                if w is not None:  # the exit ended the window and released the pool once
                    rec.release(tuple(pool.id), "use_mem_pool_exit", w["end"])

        for module in (torch.cuda, torch.cuda.memory):
            module.MemPool = MemPool
            module.use_mem_pool = use_mem_pool

    # -- the run
    def run(self, wl, params):
        torch.cuda.init()
        total = torch.cuda.mem_get_info()[1]
        if self.opts.cap is not None:
            if self.opts.cap > total:
                raise UsageError(f"--cap {self.opts.cap} is more than the device's {total} bytes")
            torch.cuda.set_per_process_memory_fraction(self.opts.cap / total)
        self.install()
        if not self.opts.late_start:
            self.start_recording()
        t0 = time.time()
        oom = None
        try:
            wl.fn(self, **params)
        except Exception as e:  # an OOM is a result; anything else fails the run
            found = find_oom(e)
            if found is None:
                raise
            oom = (str(found).splitlines()[0][:400] if str(found) else "out of memory", self.mark())
            # Leaving this block frees the workload's frames (and tensors), as at the
            # end of a program that caught the error.
            del found
        wall = time.time() - t0
        if self.opts.late_start and not self.recording:
            raise UsageError(
                f"{self.opts.workload} has no setup point (rec.setup_done()), so --late-start would record nothing"
            )
        for w in self.windows:  # windows a failed capture left open
            if w["end"] is None:
                w["end"] = self.mark()
                w["closed"] = False
        if not torch.cuda.is_current_stream_capturing():
            self.cp("final")
        snap = self.final_snapshot = torch.cuda.memory._snapshot()
        if self.recording:
            torch.cuda.memory._record_memory_history(enabled=None)
        self.finished = True
        return self.build(snap, oom, wall, total)

    def build(self, snap, oom, wall, total):
        trace = device_trace(snap)
        rows = [trace_row(e) for e in trace]
        wrapped = self.opts.max_entries != UNLIMITED and len(trace) >= self.opts.max_entries
        mark_method = resolve_marks(trace, self.marks, wrapped)
        events, index = insert_markers(rows, [m.pos for m in self.empty_cache_marks if m.pos is not None])

        def at(m):
            return index(m.pos) if m is not None else None

        checkpoints, before = [], []
        for label, m, stats in self.checkpoints:
            (checkpoints if m.pos is not None else before).append(dict(label=label, trace_len=m.pos, **stats))
        windows = []
        for w in self.windows:
            end = at(w["end"])
            windows.append({
                "pool": list(w["pool"]) if w["pool"] is not None else None,
                "kind": w["kind"],
                "scope": w["scope"],
                "streams": w["streams"],
                "begin": at(w["begin"]),
                "end": end,
                "closed": w.get("closed", True),
            })
        # A window that ended before the trace began routes nothing in it.
        routing = [w for w in windows if w["end"] is not None]
        observations = [
            (at(m), [(a, s, p) for a, s, p, _ in extents]) for m, extents in self.observations if m.pos is not None
        ]
        carried = [pool_of(e.get("pool_id")) for e in trace]
        entry_pools = None
        if any(p is not None for p in carried):
            entry_pools, j = [], 0
            for ev in events:  # markers carry none
                if j < len(rows) and ev is rows[j]:
                    entry_pools.append(carried[j])
                    j += 1
                else:
                    entry_pools.append(None)
        pools, methods, disagreements = attribute_pools(events, routing, observations, entry_pools)
        seen = {}
        for m, extents in self.observations:
            if m.pos is None:
                continue
            for a, s, p, expandable in extents:
                if p != DEFAULT_POOL:
                    k = (a, s, p)
                    if k not in seen:
                        seen[k] = {"address": a, "total_size": s, "pool": list(p), "is_expandable": expandable,
                                   "first_seen": at(m), "last_seen": at(m)}
                    seen[k]["last_seen"] = at(m)
        final_segments = device_segments(snap.get("segments", []))
        return {
            "workload": self.opts.workload,
            "alloc_conf": self.opts.alloc_conf,
            "cap_bytes": self.opts.cap,
            "device": torch.cuda.get_device_name(0),
            "total_bytes": total,
            "torch": torch.__version__,
            "wall_s": wall,
            "events": events,
            "checkpoints": checkpoints,
            "oom": {"message": oom[0], "trace_len": oom[1].pos if oom[1].pos is not None else len(rows)} if oom else None,
            "final_stats": numeric_stats(torch.cuda.memory_stats()),
            "segments": [segment_json(s) for s in final_segments],
            # [v2]
            "recorder": {"name": RECORDER, "format": FORMAT_VERSION},
            "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.opts.params.items()},
            "cuda": getattr(torch.version, "cuda", None),
            "driver_version": driver_version(),
            "allocator_settings": snap.get("allocator_settings"),
            "context": self.opts.context,
            "max_entries": None if self.opts.max_entries == UNLIMITED else self.opts.max_entries,
            "wrapped": wrapped,
            "mark_positions": mark_method,
            "late_start": self.opts.late_start,
            "start_state": self.start_state,
            "checkpoints_before_trace": before,
            "calls": [
                dict({"call": c, "at": at(m), "args": args}, **({"end": at(end)} if end is not None else {}))
                for m, c, args, end in self.calls
            ],
            "pools": [
                {"id": list(p), "created_at": at(info.get("created")),
                 **{k: v for k, v in info.items() if k != "created"}}
                for p, info in self.pools.items()
            ],
            "pool_windows": windows,
            "pool_releases": [{"pool": list(p), "at": at(m), "how": how} for p, m, how in self.releases],
            "request_pools": [[i, p[0], p[1]] for i, p in sorted(pools.items()) if p != DEFAULT_POOL],
            "pool_attribution": {
                "methods": methods,
                "window_disagreements": len(disagreements),
                "first_window_disagreements": disagreements[:20],
            },
            "pool_segments": list(seen.values()),
        }


# ------------------------------------------------------------------ command line
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = _Parser(
        prog="record_torch.py",
        description="Record PyTorch's CUDA caching allocator running one workload (see docs/recording.md).",
    )
    p.add_argument("workload", nargs="?", help="workload name (--list shows them)")
    p.add_argument("outdir", nargs="?", default=".", help="directory for the JSON (default: .)")
    p.add_argument("--list", action="store_true", help="list the workloads and their parameters")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a workload parameter (repeatable)")
    p.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF for this run (default: the environment's)")
    p.add_argument("--cap", help="limit PyTorch to SIZE bytes: set_per_process_memory_fraction(SIZE / total)")
    p.add_argument("--max-entries", help="record into a ring buffer of N entries (default: $MAX_ENTRIES, else unlimited)")
    p.add_argument("--late-start", action="store_true", help="begin recording when the workload's setup is done")
    p.add_argument("--pickle", action="store_true", help="also write PyTorch's snapshot pickle (default: $DUMP_PICKLE)")
    p.add_argument("--context", choices=["none", "state", "alloc", "all"], default="none",
                   help="stack traces PyTorch records (default: none)")
    p.add_argument("--stacks", choices=["python", "all"], default="python", help="frames in stack traces (default: python)")
    p.add_argument("--tag", help="extra suffix for the file name")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")

    opts = p.parse_intermixed_args(argv)
    if opts.list:
        return opts
    if not opts.workload:
        raise UsageError("name a workload (--list shows them)")
    wl = WORKLOADS.get(opts.workload)
    if wl is None:
        raise UsageError(f"unknown workload {opts.workload!r} (known: {', '.join(sorted(WORKLOADS))})")
    params = dict(wl.params)
    changed = []
    for item in opts.set:
        key, sep, value = item.partition("=")
        if not sep or key not in wl.params:
            known = ", ".join(sorted(wl.params)) or "none"
            raise UsageError(f"--set {item}: {opts.workload} has no parameter {key!r} (known: {known})")
        params[key] = convert_param(opts.workload, key, value, wl.params[key])
        if params[key] != wl.params[key]:
            changed = [(k, v) for k, v in changed if k != key] + [(key, params[key])]
    opts.params = params
    opts.changed = changed
    opts.cap = parse_size(opts.cap) if opts.cap is not None else None
    env_entries = os.environ.get("MAX_ENTRIES")
    text = opts.max_entries if opts.max_entries is not None else env_entries
    if text is None or text == "":
        opts.max_entries = UNLIMITED
    else:
        try:
            opts.max_entries = int(text)
        except ValueError:
            raise UsageError(f"max entries {text!r} is not a number") from None
        if opts.max_entries < 1:
            raise UsageError(f"max entries {text!r} must be at least 1")
    opts.pickle = opts.pickle or os.environ.get("DUMP_PICKLE", "") not in ("", "0")
    opts.context = None if opts.context == "none" else opts.context
    both = os.environ.get("PYTORCH_ALLOC_CONF")
    if opts.alloc_conf is not None:
        if both is not None:
            raise UsageError("PYTORCH_ALLOC_CONF is set in the environment; unset it to use --alloc-conf")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = opts.alloc_conf
    cuda_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if both is not None and cuda_conf is not None and both != cuda_conf:
        raise UsageError("PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF differ; set only one")
    opts.alloc_conf = both if both is not None else (cuda_conf or "")
    opts.name = run_name(opts.workload, changed, opts.alloc_conf, opts.cap, opts.max_entries, opts.late_start, opts.tag)
    return opts


def list_workloads():
    for name in sorted(WORKLOADS):
        wl = WORKLOADS[name]
        params = " ".join(f"{k}={format_param(v)}" for k, v in wl.params.items())
        print(f"{name}{'  ' + params if params else ''}")
        print(f"    {wl.doc}")


def write_atomic(path, write):
    """Writes through a temporary file in the same directory, then renames it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".record-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def main(argv=None):
    global torch
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        if opts.list:
            list_workloads()
            return 0
        if not os.path.isdir(opts.outdir):
            raise UsageError(f"{opts.outdir}: not a directory")
        json_path = os.path.join(opts.outdir, opts.name + ".json")
        pickle_path = os.path.join(opts.outdir, opts.name + ".pickle")
        outputs = [json_path] + ([pickle_path] if opts.pickle else [])
        for path in outputs:
            if os.path.exists(path) and not opts.overwrite:
                raise UsageError(f"{path}: exists (--overwrite replaces it)")
        import importlib

        torch = importlib.import_module("torch")
        if not torch.cuda.is_available():
            raise NoCuda("no CUDA device is available to PyTorch")
        rec = Recorder(opts)
        out = rec.run(WORKLOADS[opts.workload], opts.params)
        if opts.pickle:  # what torch.cuda.memory._dump_snapshot writes, of the same snapshot
            write_atomic(pickle_path, lambda f: pickle.dump(rec.final_snapshot, f))
        write_atomic(json_path, lambda f: f.write(json.dumps(out).encode()))
    except UsageError as e:
        print(f"record_torch.py: {e}", file=sys.stderr)
        return 2
    except NoCuda as e:
        print(f"record_torch.py: {e}", file=sys.stderr)
        return 3
    peak = out["checkpoints"][-1]["max_reserved"] if out["checkpoints"] else None
    print(
        f"{opts.name}: events={len(out['events'])} oom={'yes' if out['oom'] else 'no'} "
        f"max_reserved={peak} wrapped={'yes' if out['wrapped'] else 'no'} "
        f"private_pools={len(out['pools'])} wall={out['wall_s']:.1f}s"
    )
    return 0


# ================================================================== workloads
# The classic workloads are the programs behind tests/data/oracle and tests/data/recorded:
# their defaults must keep producing the same allocation sequence.


@workload()
def seed000(rec):
    """1 GiB tensors: cache reuse, a reassignment that needs twice the memory, `del`
    keeping memory reserved, a host round trip, empty_cache."""
    dev, cp = rec.dev, rec.cp
    shape = [256, 1024, 1024]
    a = torch.zeros(shape, device=dev); cp("a")
    b = torch.zeros(shape, device=dev); cp("b")
    b = b.to("cpu"); cp("b_to_cpu")
    c = torch.zeros(shape, device=dev); cp("c")
    c = torch.zeros(shape, device=dev); cp("c_again")
    d = torch.zeros(shape, device=dev); cp("d")
    del d; cp("del_d")
    e = torch.zeros(shape, device="cpu")
    e = e.to("cuda"); cp("e_to_cuda")
    torch.cuda.empty_cache(); cp("empty_cache")
    del a, b, c, e


def _seed002(rec, retain):
    x = torch.zeros([1, 1024, 1024, 256], requires_grad=True, device=rec.dev); rec.cp("x")
    y = 5 * x
    if retain:
        y.retain_grad()
    rec.cp("y")
    torch.mean(y).backward(); rec.cp("backward")
    torch.cuda.empty_cache(); rec.cp("empty_cache")


@workload()
def seed002_plain(rec):
    """A 1 GiB leaf, y = 5x, backward of mean(y): autograd buffers, empty_cache."""
    _seed002(rec, False)


@workload()
def seed002_retain(rec):
    """seed002_plain with y.retain_grad(): the gradient of y stays alive."""
    _seed002(rec, True)


@workload()
def seed003(rec):
    """Attention-shaped matmuls inside and outside a function: temporaries freed at
    return."""
    dev, cp = rec.dev, rec.cp
    B, L, C, H = 64, 32, 512, 8
    D = C // H
    q = torch.randn(B, H, L, D).to(dev)
    k = torch.randn(B, H, D, L).to(dev)
    v = torch.randn(B, H, L, D).to(dev)
    x = torch.randn(B, L, C).to(dev); cp("init")

    def attention(x):
        x = x + 1; cp("fn_x_plus_1")
        attn = (q @ k) * 0.125; cp("fn_matmul")
        x = (attn @ v).transpose(1, 2).reshape(B, L, C); cp("fn_final")

    attention(x); cp("after_fn")
    attn = (q @ k) * 0.125; cp("top_matmul")
    x = (attn @ v).transpose(1, 2).reshape(B, L, C); cp("top_final")


@workload()
def mlp_train(rec):
    """Four Adam steps of a 3-layer MLP (4096-8192-8192-4096), batch 2048."""
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 8192), nn.GELU(), nn.Linear(8192, 4096)).to(rec.dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    rec.setup_done("model")
    for step in range(4):
        x = torch.randn(2048, 4096, device=rec.dev)
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.cp(f"step{step}")


@workload(batch=8, seq=256, layers=4, d_model=512, steps=3)
def gpt_train_small(rec, batch, seq, layers, d_model, steps):
    """AdamW training of nn.TransformerEncoder (16 heads, dropout 0.1) with a 32000-token
    embedding and head: the classic small transformer run."""
    torch.manual_seed(0)
    nn = torch.nn
    vocab = 32000
    layer = nn.TransformerEncoderLayer(d_model, 16, 4 * d_model, batch_first=True, dropout=0.1)
    m = nn.TransformerEncoder(layer, layers).to(rec.dev)
    emb = nn.Embedding(vocab, d_model).to(rec.dev)
    head = nn.Linear(d_model, vocab).to(rec.dev)
    params = list(m.parameters()) + list(emb.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    rec.setup_done("model")
    for step in range(steps):
        tok = torch.randint(0, vocab, (batch, seq), device=rec.dev)
        h = m(emb(tok))
        logits = head(h)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), tok.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del h, logits, loss
        rec.cp(f"step{step}")


@workload(tokens=256)
def kv_inference(rec, tokens):
    """A KV cache grown by concatenation (16 tensors of 4x16xTx64, one token at a
    time): every step reallocates every cache tensor."""
    torch.manual_seed(0)
    layers, heads, hd = 8, 16, 64
    kv = [torch.empty(4, heads, 0, hd, device=rec.dev) for _ in range(2 * layers)]
    rec.cp("start")
    for t in range(tokens):
        for i in range(len(kv)):
            kv[i] = torch.cat([kv[i], torch.randn(4, heads, 1, hd, device=rec.dev)], dim=2)
        if t % 64 == 63:
            rec.cp(f"t{t}")


@workload(iterations=6000, seed=7)
def random_stress(rec, iterations, seed):
    """Log-uniform sizes from 256 B to 256 MiB with random lifetimes (48 % frees):
    splitting, merging and oversize blocks."""
    rng = random.Random(seed)
    live = []
    rec.cp("start")
    for i in range(iterations):
        if live and rng.random() < 0.48:
            live.pop(rng.randrange(len(live)))
        else:
            n = int(math.exp(rng.uniform(math.log(256), math.log(256 * MiB))))
            live.append(torch.empty(n, dtype=torch.uint8, device=rec.dev))
        if i % 1000 == 999:
            rec.cp(f"i{i}")
    live.clear()
    rec.cp("end")


@workload()
def multistream(rec):
    """Allocations alternating between two side streams, a third kept alive: per-stream
    pools."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    keep = []
    rec.cp("start")
    for i in range(50):
        with torch.cuda.stream(s1 if i % 2 else s2):
            t = torch.empty((i % 7 + 1) * 3 * MiB, dtype=torch.uint8, device=rec.dev)
            if i % 3:
                keep.append(t)
            del t
    rec.cp("mid")
    keep.clear()
    torch.cuda.synchronize()
    rec.cp("end")


# ------------------------------------------------------------------ real-job workloads
def _gelu_mlp(width, layers, device):
    """`layers` pairs of Linear(width, width) and GELU, built on the CPU (seeded by the
    caller) and moved to `device`."""
    nn = torch.nn
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*mods).to(device)


def _autocast(enabled):
    if enabled:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _gpt(vocab, seq, layers, d_model, heads):
    """A decoder-only transformer (pre-norm blocks, causal attention through
    scaled_dot_product_attention, tied embedding), built from torch.nn parts. With
    `caches` (per block a (keys, values) pair of shape batch x heads x seq x head_dim),
    a call writes its keys and values at `pos` and attends over the whole cache under
    `mask` (True = visible), so shapes stay fixed, as a captured decode step needs."""
    nn, F = torch.nn, torch.nn.functional
    hd = d_model // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def attend(self, x, cache, pos, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            if cache is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                kc, vc = cache
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v)
                y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
            return self.proj(y.transpose(1, 2).reshape(b, t, d_model))

        def forward(self, x, cache=None, pos=None, mask=None):
            x = x + self.attend(x, cache, pos, mask)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d_model)

        def forward(self, idx, caches=None, pos=None, mask=None):
            if pos is None:
                pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for i, blk in enumerate(self.blocks):
                x = blk(x, None if caches is None else caches[i], pos, mask)
            return F.linear(self.ln(x), self.tok.weight)

    return GPT()


@workload(batch=8, seq=512, layers=6, d_model=768, heads=12, vocab=32000, steps=4, accum=2, amp=False)
def gpt_train(rec, batch, seq, layers, d_model, heads, vocab, steps, accum, amp):
    """GPT-like training: a decoder-only transformer (pre-norm, causal SDPA attention,
    tied embedding) trained with AdamW (fused=False) on random tokens, gradient
    accumulation over `accum` micro-batches, optional bf16 autocast (`amp`). Setup
    (model and optimizer) is done before the first step; --late-start records the
    steps only (the optimizer state appears during the first step)."""
    torch.manual_seed(0)
    m = _gpt(vocab, seq, layers, d_model, heads).to(rec.dev)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=False)
    rec.setup_done()
    for step in range(steps):
        for _ in range(accum):
            tok = torch.randint(0, vocab, (batch, seq + 1), device=rec.dev)
            with _autocast(amp):
                logits = m(tok[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
            (loss / accum).backward()
            del logits, loss, tok
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.cp(f"step{step}")


@workload(batch=8, prompt=384, new_tokens=64, layers=8, d_model=1024, heads=16, vocab=32000, rounds=3,
          graphs=False, graph_batches=(1, 4, 8))
def kv_cache_inference(rec, batch, prompt, new_tokens, layers, d_model, heads, vocab, rounds, graphs, graph_batches):
    """Inference with a preallocated KV cache, as serving engines do: the model in
    bf16 under no_grad, a static cache of prompt+new_tokens positions per layer. Each
    round prefills prompts (64 tokens shorter each round, at least 1) and decodes up to
    new_tokens tokens one at a time. Without graphs each round allocates its cache and
    drops it at the end. With graphs=1 each batch size in graph_batches gets a cache
    and a CUDA graph of the decode step (warm-up on a side stream, then capture into
    the graph's own private pool); round r uses batch graph_batches[r % n] and replays
    its graph for every decode step; at the end each graph is reset (its pool
    released) and the cache emptied."""
    torch.manual_seed(0)
    hd = d_model // heads
    total = prompt + new_tokens
    bf16 = torch.bfloat16
    m = _gpt(vocab, total, layers, d_model, heads).to(rec.dev, dtype=bf16).eval()
    positions = torch.arange(total, device=rec.dev)

    def new_cache(b):
        return [
            (torch.zeros(b, heads, total, hd, device=rec.dev, dtype=bf16),
             torch.zeros(b, heads, total, hd, device=rec.dev, dtype=bf16))
            for _ in range(layers)
        ]

    rec.setup_done()
    captured = {}
    with torch.no_grad():
        if graphs:
            side = torch.cuda.Stream()
            for b in graph_batches:
                caches = new_cache(b)
                tok = torch.zeros(b, 1, dtype=torch.long, device=rec.dev)
                pos = torch.zeros(1, dtype=torch.long, device=rec.dev)
                mask = (positions <= 0).view(1, 1, 1, total)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        m(tok, caches=caches, pos=pos, mask=mask)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = m(tok, caches=caches, pos=pos, mask=mask)
                captured[b] = (g, caches, tok, pos, mask, out)
                rec.cp(f"captured_b{b}")
        for r in range(rounds):
            b = graph_batches[r % len(graph_batches)] if graphs else batch
            length = max(1, prompt - 64 * r)
            if graphs:
                g, caches, tok, pos, mask, out = captured[b]
            else:
                caches = new_cache(b)
            idx = torch.randint(0, vocab, (b, length), device=rec.dev)
            where = positions[:length]
            causal = (positions[None, :] <= where[:, None]).view(1, 1, length, total)
            logits = m(idx, caches=caches, pos=where, mask=causal)
            nxt = logits[:, -1:].argmax(-1)
            del logits, causal, idx
            rec.cp(f"round{r}_prefill")
            for t in range(length, min(length + new_tokens, total)):
                step_mask = (positions <= t).view(1, 1, 1, total)
                if graphs:
                    tok.copy_(nxt)
                    pos.fill_(t)
                    mask.copy_(step_mask)
                    g.replay()
                    nxt = out[:, -1:].argmax(-1)
                else:
                    logits = m(nxt, caches=caches, pos=positions[t : t + 1], mask=step_mask)
                    nxt = logits[:, -1:].argmax(-1)
                    del logits
                del step_mask
            del nxt
            caches = None
            rec.cp(f"round{r}_decoded")
    g = tok = pos = mask = out = None  # the last round's references to graph tensors
    for b in list(captured):
        g = captured.pop(b)[0]
        g.reset()
        rec.cp(f"released_b{b}")
    torch.cuda.empty_cache()
    rec.cp("empty_cache")


@workload(batch=16, image=128, channels=64, depth=4, steps=4, amp=False)
def unet_train(rec, batch, image, channels, depth, steps, amp):
    """A U-Net (two 3x3 convolutions with GroupNorm and SiLU per level, strided-conv
    down, transposed-conv up, skip connections by concatenation) trained to denoise
    random images with Adam: convolution workspaces and large activations."""
    torch.manual_seed(0)
    nn = torch.nn

    def double(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
        )

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            widths = [channels * 2 ** i for i in range(depth)]
            self.inp = double(3, widths[0])
            self.downs = nn.ModuleList(nn.Conv2d(widths[i], widths[i], 4, stride=2, padding=1) for i in range(depth - 1))
            self.encs = nn.ModuleList(double(widths[i], widths[i + 1]) for i in range(depth - 1))
            self.ups = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(depth - 1))
            self.decs = nn.ModuleList(double(2 * widths[i], widths[i]) for i in range(depth - 1))
            self.out = nn.Conv2d(widths[0], 3, 1)

        def forward(self, x):
            skips = [self.inp(x)]
            for down, enc in zip(self.downs, self.encs):
                skips.append(enc(down(skips[-1])))
            h = skips.pop()
            for i in reversed(range(depth - 1)):
                h = self.decs[i](torch.cat([self.ups[i](h), skips.pop()], dim=1))
            return self.out(h)

    m = UNet().to(rec.dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    rec.setup_done()
    for step in range(steps):
        clean = torch.randn(batch, 3, image, image, device=rec.dev)
        noisy = clean + 0.1 * torch.randn_like(clean)
        with _autocast(amp):
            loss = torch.nn.functional.mse_loss(m(noisy).float(), clean)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del clean, noisy, loss
        rec.cp(f"step{step}")


@workload(batch=64, image=160, width=64, blocks=(2, 2, 2, 2), classes=1000, steps=4, amp=False, channels_last=False)
def resnet_train(rec, batch, image, width, blocks, classes, steps, amp, channels_last):
    """A ResNet (basic blocks with BatchNorm, stages of `blocks`, widths doubling from
    `width`) trained with SGD and momentum on random images and labels."""
    torch.manual_seed(0)
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, n in enumerate(blocks):
        cout = width * 2 ** stage
        for i in range(n):
            layers.append(Basic(cin, cout, 2 if i == 0 and stage > 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    m = nn.Sequential(*layers).to(rec.dev)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    rec.setup_done()
    for step in range(steps):
        x = torch.randn(batch, 3, image, image, device=rec.dev)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,), device=rec.dev)
        with _autocast(amp):
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        rec.cp(f"step{step}")


# ------------------------------------------------------------------ private pools
@workload(batches=(1, 8, 32), hidden=4096, layers=4, replays=5, shared_pool=False, eager_after=True)
def graph_capture(rec, batches, hidden, layers, replays, shared_pool, eager_after):
    """CUDA graphs of an MLP's inference for several batch sizes, as inference servers
    capture them: warm-up on a side stream, one torch.cuda.graph capture per batch
    size (each into its own private pool, or all into one pool with shared_pool=1,
    largest batch first as PyTorch recommends), replays with new inputs copied into the
    static input, eager work in the default pool between them, then each graph reset
    (its pool released) and the cache emptied."""
    torch.manual_seed(0)
    m = _gelu_mlp(hidden, layers, rec.dev).eval()
    rec.setup_done()
    order = sorted(batches, reverse=True) if shared_pool else list(batches)
    pool = torch.cuda.graph_pool_handle() if shared_pool else None
    graphs = {}
    with torch.no_grad():
        side = torch.cuda.Stream()
        for b in order:
            static_in = torch.randn(b, hidden, device=rec.dev)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    m(static_in)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                static_out = m(static_in)
            graphs[b] = (g, static_in, static_out)
            rec.cp(f"captured_b{b}")
        for r in range(replays):
            for b in batches:
                g, static_in, static_out = graphs[b]
                static_in.copy_(torch.randn(b, hidden, device=rec.dev))
                g.replay()
                static_out.sum().item()  # read the result
            if eager_after:
                x = torch.randn(3 * max(batches), hidden, device=rec.dev)
                m(x)
                del x
            rec.cp(f"replay{r}")
    for b in batches:
        g, static_in, static_out = graphs.pop(b)
        del static_in, static_out
        g.reset()
        rec.cp(f"reset_b{b}")
    torch.cuda.empty_cache()
    rec.cp("empty_cache")


@workload(phases=3, allocations=400, max_mib=64, keep=0.25, use_on_oom=False, no_split=False, seed=11)
def mempool_phases(rec, phases, allocations, max_mib, keep, use_on_oom, no_split, seed):
    """A job that runs one phase of each round inside torch.cuda.use_mem_pool: phases
    of random-lifetime allocations (log-uniform 512 B to max_mib MiB) alternate between
    the default pool and one MemPool (created with use_on_oom / no_split as given);
    a fraction `keep` of each pool phase's tensors outlives its window and is freed
    later in the default phase; the pool is entered again each round, and finally
    destroyed (its cache emptied) and the default cache emptied."""
    rng = random.Random(seed)
    pool = torch.cuda.MemPool(use_on_oom=use_on_oom, no_split=no_split)
    rec.setup_done()

    def churn(live, n):
        for _ in range(n):
            if live and rng.random() < 0.45:
                live.pop(rng.randrange(len(live)))
            else:
                size = int(math.exp(rng.uniform(math.log(512), math.log(max_mib * MiB))))
                live.append(torch.empty(size, dtype=torch.uint8, device=rec.dev))

    outside, survivors = [], []
    for p in range(phases):
        churn(outside, allocations)
        rec.cp(f"default{p}")
        inside = []
        with torch.cuda.use_mem_pool(pool):
            churn(inside, allocations)
            rng.shuffle(inside)
            survivors += inside[: int(len(inside) * keep)]
            del inside[: int(len(inside) * keep)]
            inside.clear()
        rec.cp(f"pool{p}")
        churn(outside, allocations // 4)
        while len(survivors) > allocations // 8:
            survivors.pop(rng.randrange(len(survivors)))
        rec.cp(f"after{p}")
    survivors.clear()
    outside.clear()
    rec.cp("freed")
    del pool
    rec.cp("pool_destroyed")
    torch.cuda.empty_cache()
    rec.cp("empty_cache")


@workload(batch=65536, width=4096, layers=4, steps=6, floor=256)
def oom_backoff(rec, batch, width, layers, steps, floor):
    """Training that finds its batch size by running out of memory (the pattern of
    `find_executable_batch_size`): an MLP (`layers` Linear + GELU of `width`) with
    Adam; a step that raises OutOfMemoryError is dropped, the batch halved and the step
    tried again (down to `floor`), and training goes on at the batch that fits; a
    checkpoint after every step and every caught out-of-memory."""
    torch.manual_seed(0)
    m = _gelu_mlp(width, layers, rec.dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    rec.setup_done("model")
    step, ooms = 0, 0
    while step < steps:
        try:
            x = torch.randn(batch, width, device=rec.dev)
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
        except torch.cuda.OutOfMemoryError:
            # Leaving the handler drops the tensors of the frames the error came
            # through; `x` (this frame's) lives until the retry assigns it again,
            # as in a user's loop; the gradients computed so far are dropped here.
            opt.zero_grad(set_to_none=True)
            if batch <= floor:
                raise
            batch //= 2
            ooms += 1
            rec.cp(f"oom{ooms}_b{batch}")
            continue
        rec.cp(f"step{step}_b{batch}")
        step += 1


@workload(experts=8, tokens=8192, d_model=1024, d_ff=4096, steps=5, seed=3)
def moe_train(rec, experts, tokens, d_model, d_ff, steps, seed):
    """A mixture-of-experts layer trained with AdamW: each step routes `tokens` tokens
    to `experts` feed-forward experts by a random, skewed assignment (each expert's
    share drawn afresh), so every expert's activations take a new size each step;
    index_select, index_add_ and the backward of both."""
    torch.manual_seed(0)
    rng = random.Random(seed)
    nn = torch.nn
    gate = nn.Linear(d_model, experts).to(rec.dev)
    ffs = nn.ModuleList(
        nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)) for _ in range(experts)
    ).to(rec.dev)
    opt = torch.optim.AdamW(list(gate.parameters()) + list(ffs.parameters()), lr=1e-4)
    rec.setup_done("model")
    for step in range(steps):
        weights = [rng.random() ** 3 + 0.01 for _ in range(experts)]
        total = sum(weights)
        counts = [int(tokens * w / total) for w in weights]
        counts[0] += tokens - sum(counts)
        order = list(range(tokens))
        rng.shuffle(order)
        x = torch.randn(tokens, d_model, device=rec.dev)
        score = torch.softmax(gate(x), dim=-1)
        out = torch.zeros_like(x)
        at = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = torch.tensor(order[at : at + n], device=rec.dev)
            at += n
            h = ffs[e](x.index_select(0, idx)) * score.index_select(0, idx)[:, e : e + 1]
            out.index_add_(0, idx, h)
            del h, idx
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, score, out, loss
        rec.cp(f"step{step}")


@workload(batches=12, batch=512, features=8192, hidden=4096, depth=3)
def prefetch_train(rec, batches, batch, features, hidden, depth):
    """Training fed by a prefetching side stream, as a data loader's CUDA prefetcher
    does: each batch is copied from pinned host memory on a side stream one step
    ahead (allocated on that stream), the training stream waits for it and marks it
    used there (`record_stream`), and it is freed while the step's kernels may still
    read it: frees that wait for the other stream's work (`free_requested`, then
    `free_completed`). An MLP of `depth` layers with SGD."""
    torch.manual_seed(0)
    nn = torch.nn
    layers = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    m = nn.Sequential(*layers, nn.Linear(hidden, 1)).to(rec.dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    host = [torch.randn(batch, features).pin_memory() for _ in range(2)]
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    rec.setup_done("model")

    def fetch(i):
        with torch.cuda.stream(side):
            x = host[i % 2].to(rec.dev, non_blocking=True)
            y = torch.randn(batch, 1, device=rec.dev)
            ready = torch.cuda.Event()
            ready.record(side)
        return x, y, ready

    nxt = fetch(0)
    for i in range(batches):
        x, y, ready = nxt
        main.wait_event(ready)
        x.record_stream(main)
        y.record_stream(main)
        if i + 1 < batches:
            nxt = fetch(i + 1)
        loss = (m(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        if i % 4 == 3:
            rec.cp(f"batch{i}")


@workload(requests=48, max_seq=4096, d_model=1024, heads=16, layers=6, seed=5, empty_every=16)
def serve_dynamic(rec, requests, max_seq, d_model, heads, layers, seed, empty_every):
    """Inference serving of requests of random shapes: each request has a batch of 1 to
    16 and a prompt of log-uniform length (64 to `max_seq` tokens); it allocates a
    bf16 KV cache per layer for its prompt, runs attention over it layer by layer and
    frees it. A request that raises OutOfMemoryError is dropped and serving goes on;
    `empty_cache` every `empty_every` requests; a checkpoint after every eighth
    request and every dropped one (run it under `--cap`)."""
    torch.manual_seed(0)
    rng = random.Random(seed)
    F = torch.nn.functional
    hd = d_model // heads
    proj = [torch.nn.Linear(d_model, 3 * d_model).to(rec.dev, torch.bfloat16) for _ in range(layers)]
    rec.setup_done("model")

    @torch.no_grad()
    def serve(b, t):
        # Its tensors die with its frame, also when it raises (once handled).
        x = torch.randn(b, t, d_model, device=rec.dev, dtype=torch.bfloat16)
        caches = []
        for p in proj:
            q, k, v = p(x).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            caches.append((k.contiguous(), v.contiguous()))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + y.transpose(1, 2).reshape(b, t, d_model)
            del q, k, v, y

    dropped = 0
    for r in range(requests):
        b = rng.randint(1, 16)
        t = int(math.exp(rng.uniform(math.log(64), math.log(max_seq))))
        try:
            serve(b, t)
        except torch.cuda.OutOfMemoryError:
            dropped += 1
            rec.cp(f"dropped{dropped}_r{r}")
            continue
        if (r + 1) % empty_every == 0:
            torch.cuda.empty_cache()
        if r % 8 == 7:
            rec.cp(f"r{r}")


def _compiled_rounds(rec, sizes, calls, call, label):
    """The rounds of the compiled workloads: `calls` calls of `call` per size, a
    checkpoint named `label` and the size after each, then every size once more
    (checkpoint `again`)."""
    for size in sizes:
        for _ in range(calls):
            call(size)
        rec.cp(f"{label}{size}")
    for size in sizes:
        call(size)
    rec.cp("again")


def _compiled_teardown(rec):
    """After the compiled function is dropped: dynamo reset (the CUDA graph trees and
    their pool go), then the cache emptied, a checkpoint after each."""
    torch._dynamo.reset()
    torch.cuda.synchronize()
    rec.cp("reset")
    torch.cuda.empty_cache()
    rec.cp("empty_cache")


@workload(batches=(4, 16, 64), hidden=2048, layers=4, calls=4, train=False, mode="reduce-overhead", reset=True)
def compiled_graphs(rec, batches, hidden, layers, calls, train, mode, reset):
    """An MLP under `torch.compile(mode="reduce-overhead")`, as users turn CUDA graphs
    on: inductor's CUDA graph trees record each batch size's graph on its second call
    and replay it after, all graphs in one private pool that the trees manage
    themselves (checkpointing and restoring the pool's state between graphs); `calls`
    calls per batch size, in order, then every size again; with train=1 a training step
    (forward and backward graphs, SGD outside them); `mode` is torch.compile's
    (`default`: inductor's kernels, no CUDA graphs)."""
    torch.manual_seed(0)
    m = _gelu_mlp(hidden, layers, rec.dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4) if train else None
    if not train:
        m.eval()
    f = torch.compile(m, mode=mode)
    rec.setup_done()

    def call(b):
        x = torch.randn(b, hidden, device=rec.dev)
        if train:
            torch.compiler.cudagraph_mark_step_begin()
            loss = f(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            return f(x).sum().item()

    _compiled_rounds(rec, batches, calls, call, "b")
    del f
    if reset:
        _compiled_teardown(rec)


@workload(batch=4, seqs=(128, 256, 512, 256, 1024), layers=4, d_model=768, heads=12, vocab=32000, calls=3, train=False, reset=True)
def compiled_gpt(rec, batch, seqs, layers, d_model, heads, vocab, calls, train, reset):
    """A GPT-like decoder (`_gpt`) under `torch.compile(mode="reduce-overhead",
    dynamic=False)`, as a server or trainer turns CUDA graphs on with inputs bucketed by
    length: each sequence length in `seqs` its own graph in inductor's CUDA graph trees,
    recorded on the second call, and every length after the first recorded on another
    path of the tree (the pool set back to a checkpoint first); `calls` calls per
    length, then every length again; with train=1 a training step (forward and backward
    graphs, AdamW outside them); reset=0 as `compiled_graphs`'."""
    torch.manual_seed(0)
    m = _gpt(vocab, max(seqs), layers, d_model, heads).to(rec.dev)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=False) if train else None
    if not train:
        m.eval()
    f = torch.compile(m, mode="reduce-overhead", dynamic=False)
    rec.setup_done()

    def call(seq):
        tok = torch.randint(0, vocab, (batch, seq + 1), device=rec.dev)
        torch.compiler.cudagraph_mark_step_begin()
        if train:
            logits = f(tok[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
        with torch.no_grad():
            return f(tok[:, :-1]).float().mean().item()

    _compiled_rounds(rec, seqs, calls, call, "seq")
    del f
    if reset:
        _compiled_teardown(rec)


@workload(batch=64, hidden=2048, layers=4, steps=6)
def graphed_callables(rec, batch, hidden, layers, steps):
    """`torch.cuda.make_graphed_callables` of an MLP for training, as its docs show: the
    forward and the backward captured into graphs sharing one pool (after warm-up
    iterations on a side stream), then training steps that replay them, SGD outside."""
    torch.manual_seed(0)
    m = _gelu_mlp(hidden, layers, rec.dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    rec.setup_done()
    sample = torch.randn(batch, hidden, device=rec.dev)
    g = torch.cuda.make_graphed_callables(m, (sample,))
    del sample
    rec.cp("graphed")
    for step in range(steps):
        x = torch.randn(batch, hidden, device=rec.dev)
        loss = g(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
        rec.cp(f"step{step}")
    del g
    torch.cuda.synchronize()
    rec.cp("released")


def _one_rank_training(rec, port, wrap, batch, hidden, layers, steps):
    """The distributed workloads: a process group of one rank (NCCL, on `port`), the MLP
    wrapped by `wrap` (DDP, FSDP), AdamW, `steps` training steps with a checkpoint
    after each, then the group destroyed (checkpoint `destroyed`)."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    torch.cuda.set_device(rec.dev)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        m = wrap(_gelu_mlp(hidden, layers, rec.dev))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=False)
        rec.setup_done()
        for step in range(steps):
            x = torch.randn(batch, hidden, device=rec.dev)
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
            rec.cp(f"step{step}")
        del m, opt
    finally:
        dist.destroy_process_group()
    torch.cuda.synchronize()
    rec.cp("destroyed")


@workload(batch=32, hidden=4096, layers=4, steps=4, bucket_mb=25, as_view=False)
def ddp_train(rec, batch, hidden, layers, steps, bucket_mb, as_view):
    """DistributedDataParallel training in one process (NCCL, world size 1): gradient
    buckets of `bucket_mb` MiB (`as_view=1`: gradients as views into the buckets), the
    buckets' all-reduce hooked into the backward pass, AdamW."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def wrap(mlp):
        return DDP(mlp, device_ids=[rec.dev.index], bucket_cap_mb=bucket_mb, gradient_as_bucket_view=bool(as_view))

    _one_rank_training(rec, 29531, wrap, batch, hidden, layers, steps)


@workload(batch=16, hidden=4096, layers=6, steps=4, reshard=True)
def fsdp_train(rec, batch, hidden, layers, steps, reshard):
    """FullyShardedDataParallel (FSDP2, `fully_shard`) in one process (NCCL, world size
    1): each layer's parameters gathered before use on the all-gather stream and freed
    after (`reshard=1`: after the forward too, gathered again for the backward), the
    gradients reduce-scattered on their own stream, AdamW."""
    from torch.distributed.fsdp import fully_shard

    def wrap(mlp):
        for layer in mlp:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, reshard_after_forward=bool(reshard))
        fully_shard(mlp, reshard_after_forward=bool(reshard))
        return mlp

    _one_rank_training(rec, 29532, wrap, batch, hidden, layers, steps)


@workload(batch=8, seq=1024, layers=6, d_model=1024, heads=16, steps=4, fp16=True)
def checkpointed_train(rec, batch, seq, layers, d_model, heads, steps, fp16):
    """Transformer blocks trained with activation checkpointing
    (`torch.utils.checkpoint`, non-reentrant: each block's activations recomputed in the
    backward pass) under fp16 autocast with a GradScaler (its scale and found-inf
    tensors, unscaling, skipped steps), AdamW."""
    torch.manual_seed(0)
    nn = torch.nn
    from torch.utils.checkpoint import checkpoint

    blocks = nn.ModuleList(
        nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True, dropout=0.0) for _ in range(layers)
    ).to(rec.dev)
    head = nn.Linear(d_model, 1).to(rec.dev)
    params = list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)
    rec.setup_done("model")
    for step in range(steps):
        x = torch.randn(batch, seq, d_model, device=rec.dev)
        with torch.autocast("cuda", dtype=torch.float16, enabled=fp16):
            h = x
            for blk in blocks:
                h = checkpoint(blk, h, use_reentrant=False)
            loss = head(h).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        del x, h, loss
        rec.cp(f"step{step}")


@workload(stages=3, micro=6, batch=64, width=4096)
def stream_pipeline(rec, stages, micro, batch, width):
    """A pipeline of `stages` MLP stages, each on its own CUDA stream (the last with high
    priority), micro-batches handed from stage to stage through events and
    device-to-device copies on the receiving stream, each hand-off's source freed on the
    sending stream while the receiver may still read it (`record_stream`)."""
    torch.manual_seed(0)
    nn = torch.nn
    mods = [nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width)).to(rec.dev).eval() for _ in range(stages)]
    streams = [torch.cuda.Stream(priority=-1 if i == stages - 1 else 0) for i in range(stages)]
    rec.setup_done("model")
    outs = []
    with torch.no_grad():
        for m in range(micro):
            prev, prev_done = None, None
            for i, (mod, st) in enumerate(zip(mods, streams)):
                with torch.cuda.stream(st):
                    if prev is None:
                        x = torch.randn(batch, width, device=rec.dev)
                    else:
                        st.wait_event(prev_done)
                        x = torch.empty_like(prev)
                        x.copy_(prev, non_blocking=True)
                        prev.record_stream(st)
                    y = mod(x)
                    done = torch.cuda.Event()
                    done.record(st)
                    del x
                prev, prev_done = y, done
            outs.append(prev)
            if len(outs) > 2:
                outs.pop(0)
            rec.cp(f"micro{m}")
    torch.cuda.synchronize()
    outs.clear()
    rec.cp("end")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RecorderError as e:
        print(f"record_torch.py: {e}", file=sys.stderr)
        sys.exit(1)
