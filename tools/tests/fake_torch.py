"""A stand-in for the parts of `torch` that tools/record_torch.py uses, for its unit
tests on machines without a GPU or PyTorch.

The allocator here is not PyTorch's (first fit, no rounding rules worth the name); what
it reproduces is the interface and the bookkeeping the recorder relies on: a trace of
`alloc`/`free_requested`/`free_completed`/`segment_alloc`/`segment_free`/`oom`/
`snapshot` entries in a ring buffer of `max_entries`, a `snapshot` entry appended by
every snapshot after the trace is copied, `time_us` converted anew by every snapshot,
thread-local `user_metadata`, private pools with PyTorch's routing (captures underway
searched last first; a graph capture takes the streams capturing with its id, a
use_mem_pool the current thread on any stream), use counts, pools freed when
released and empty, a memory limit raising OutOfMemoryError, segments with
`segment_pool_id`. Every trace entry also carries `_pool`, the pool that served it:
the ground truth the tests compare the recorder's attribution with.
"""

import contextlib
import itertools
import threading
import types

MiB = 1 << 20
SEGMENT = 2 * MiB
DEFAULT = (0, 0)


class OutOfMemoryError(RuntimeError):
    pass


class Block:
    def __init__(self, addr, size):
        self.addr, self.size, self.allocated, self.requested = addr, size, False, 0


class Segment:
    def __init__(self, address, size, pool, stream):
        self.address, self.size, self.pool, self.stream = address, size, pool, stream
        self.blocks = [Block(address, size)]

    def take(self, size):
        for i, b in enumerate(self.blocks):
            if not b.allocated and b.size >= size:
                if b.size > size:
                    self.blocks.insert(i + 1, Block(b.addr + size, b.size - size))
                    b.size = size
                b.allocated = True
                return b
        return None

    def give_back(self, block):
        block.allocated = False
        merged = []
        for b in self.blocks:
            if merged and not merged[-1].allocated and not b.allocated:
                merged[-1].size += b.size
            else:
                merged.append(b)
        self.blocks = merged

    def empty(self):
        return all(not b.allocated for b in self.blocks)


class Allocator:
    def __init__(self, total, metadata_in_trace=True):
        self.total = total
        self.limit = None
        self.segments = []
        self.next_address = 1 << 40
        self.trace = []
        self.history = False
        self.max_entries = None
        self.clock = 1000
        self.conversion = 0
        self.local = threading.local()
        self.metadata_in_trace = metadata_in_trace
        self.captures = []  # (pool, filter), in the order begun
        self.use_counts = {}
        self.freeable = set()
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.num_ooms = 0
        self.ids = itertools.count(1)

    # -- trace
    def record(self, action, addr, size, stream, pool):
        if not self.history:
            return
        self.clock += 7
        e = {"action": action, "size": size, "stream": stream, "time_approx": self.clock, "frames": [], "_pool": list(pool)}
        e["device_free" if action == "oom" else "addr"] = addr
        if self.metadata_in_trace:
            e["user_metadata"] = getattr(self.local, "metadata", "")
        self.trace.append(e)
        if self.max_entries is not None and len(self.trace) > self.max_entries:
            del self.trace[0]

    def snapshot(self, with_traces=True):
        self.conversion += 3  # PyTorch converts its clock anew for every snapshot
        traces = []
        if with_traces:
            for e in self.trace:
                d = {k: v for k, v in e.items() if k != "time_approx"}
                d["time_us"] = e["time_approx"] + self.conversion
                traces.append(d)
        segments = [self.segment_dict(s) for s in sorted(self.segments, key=lambda s: s.address)]
        self.record("snapshot", 0, self.allocated, 0, DEFAULT)
        return {
            "segments": segments,
            "device_traces": [traces],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
        }

    def segment_dict(self, s):
        return {
            "device": 0,
            "address": s.address,
            "total_size": s.size,
            "stream": s.stream,
            "segment_type": "small" if s.size <= SEGMENT else "large",
            "allocated_size": sum(b.size for b in s.blocks if b.allocated),
            "active_size": sum(b.size for b in s.blocks if b.allocated),
            "requested_size": sum(b.requested for b in s.blocks if b.allocated),
            "is_expandable": False,
            "segment_pool_id": s.pool,
            "blocks": [
                {"address": b.addr, "size": b.size, "requested_size": b.requested,
                 "state": "active_allocated" if b.allocated else "inactive", "frames": []}
                for b in s.blocks
            ],
        }

    # -- pools
    def pool_for(self, stream):
        for pool, accepts in reversed(self.captures):
            if accepts(stream):
                return pool
        return DEFAULT

    def create_or_incref(self, pool):
        self.use_counts[pool] = self.use_counts.get(pool, 0) + 1

    def begin(self, pool, accepts):
        self.create_or_incref(pool)
        self.captures.append((pool, accepts))

    def end(self, pool):
        for i, (p, _) in enumerate(self.captures):
            if p == pool:
                del self.captures[i]
                return
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    def release_pool(self, pool):
        self.use_counts[pool] -= 1
        if self.use_counts[pool] == 0:
            self.freeable.add(pool)

    def release_cached(self, pool=DEFAULT):
        if pool == DEFAULT and not self.captures:
            self._release_where(lambda s: s.pool == DEFAULT)
        for p in sorted(self.freeable):
            if pool == DEFAULT or p == pool:
                self._release_where(lambda s, p=p: s.pool == p)
                if not any(s.pool == p for s in self.segments):
                    self.freeable.discard(p)
                    del self.use_counts[p]

    def checkpoint(self, pool):
        """`getCheckpointState`: each segment of `pool` as its blocks' layout."""
        return [
            (s, [(b.addr, b.size, b.allocated) for b in s.blocks])
            for s in self.segments
            if s.pool == pool
        ]

    def set_checkpoint(self, pool, state):
        """`setCheckpointPoolState`: every allocated block of the pool freed, each
        checkpointed segment carved again block by block from its start, then the
        blocks free in the checkpoint freed; the blocks allocated in it are returned
        (segment, block) for their new owners."""
        for s in [s for s in self.segments if s.pool == pool]:
            for b in [b for b in s.blocks if b.allocated]:
                self.free(s, b)
        live = []
        for s, layout in state:
            carved = []
            for addr, size, _ in layout:
                b = s.take(size)
                assert b.addr == addr and b.size == size
                b.requested = size
                self.allocated += size
                self.record("alloc", addr, size, s.stream, pool)
                carved.append(b)
            for b, (_, _, allocated) in zip(carved, layout):
                if allocated:
                    live.append((s, b))
                else:
                    self.free(s, b)
        return live

    def _release_where(self, which):
        for s in [s for s in self.segments if which(s) and s.empty()]:
            self.segments.remove(s)
            self.reserved -= s.size
            self.record("segment_free", s.address, s.size, s.stream, s.pool)

    # -- requests
    def malloc(self, size, stream):
        pool = self.pool_for(stream)
        rounded = max(512, -(-size // 512) * 512)
        block = segment = None
        for s in self.segments:
            if s.pool == pool and s.stream == stream:
                block = s.take(rounded)
                if block:
                    segment = s
                    break
        if block is None:
            seg_size = max(SEGMENT, -(-rounded // SEGMENT) * SEGMENT)
            limit = self.limit if self.limit is not None else self.total
            if self.reserved + seg_size > limit:
                self.release_cached()
            if self.reserved + seg_size > limit:
                self.record("oom", self.total - self.reserved, rounded, stream, pool)
                self.num_ooms += 1
                raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {rounded} bytes.\nmore lines")
            segment = Segment(self.next_address, seg_size, pool, stream)
            self.next_address += seg_size + SEGMENT
            self.segments.append(segment)
            self.reserved += seg_size
            self.max_reserved = max(self.max_reserved, self.reserved)
            self.record("segment_alloc", segment.address, seg_size, stream, pool)
            block = segment.take(rounded)
        block.requested = size
        self.allocated += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.record("alloc", block.addr, size, stream, pool)
        return segment, block

    def free(self, segment, block):
        self.record("free_requested", block.addr, block.requested, segment.stream, segment.pool)
        self.record("free_completed", block.addr, block.requested, segment.stream, segment.pool)
        self.allocated -= block.size
        segment.give_back(block)

    def stats(self):
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.max_allocated,
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.max_reserved,
            "inactive_split_bytes.all.current": 0,
            "num_alloc_retries": 0,
            "num_ooms": self.num_ooms,
            "segment.all.current": len(self.segments),
        }


def make(total=80 << 30, available=True, metadata=True, metadata_in_trace=True):
    """A fresh fake `torch` module (install it as sys.modules["torch"])."""
    A = Allocator(total, metadata_in_trace)
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    C = types.ModuleType("torch._C")
    torch.cuda, cuda.memory, torch._C = cuda, memory, C
    torch.__version__ = "2.11.0+fake"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.OutOfMemoryError = cuda.OutOfMemoryError = OutOfMemoryError
    torch.uint8, torch.float32 = "uint8", "float32"
    torch.allocator = A
    sizes = {"uint8": 1, "float32": 4}

    class Stream:
        handles = itertools.count(1)

        def __init__(self, handle=None):
            self.cuda_stream = next(Stream.handles) * 0x1000 if handle is None else handle

        def wait_stream(self, other):
            pass

    default_stream = Stream(0)
    local = threading.local()
    capturing = {}  # stream handle -> capture id

    def current_stream():
        return getattr(local, "stream", default_stream)

    @contextlib.contextmanager
    def stream(s):
        prev = current_stream()
        local.stream = s
        try:
            yield
        finally:
            local.stream = prev

    class Tensor:
        def __init__(self, nbytes, device):
            self.nbytes, self.device, self.placed = nbytes, device, None
            if device != "cpu" and nbytes:
                self.placed = A.malloc(nbytes, current_stream().cuda_stream)

        def to(self, device, **_):
            return Tensor(self.nbytes, str(device))

        def __del__(self):
            if self.placed is not None:
                A.free(*self.placed)
                self.placed = None

    def numel(shape):
        n = 1
        for d in shape if isinstance(shape, (list, tuple)) else [shape]:
            n *= d
        return n

    def empty(*shape, dtype="float32", device="cpu", **_):
        shape = shape[0] if len(shape) == 1 else shape
        return Tensor(numel(shape) * sizes[dtype], str(device))

    torch.empty = torch.zeros = empty
    torch.device = str

    # -- torch._C: what the torch.cuda functions call, looked up at call time as in torch
    C._cuda_emptyCache = lambda: A.release_cached()
    C._cuda_resetPeakMemoryStats = lambda device=0: setattr(A, "max_reserved", A.reserved)
    C._cuda_setMemoryFraction = lambda fraction, device=0: setattr(A, "limit", int(fraction * A.total))
    C._accelerator_setAllocatorSettings = lambda env: None

    def begin_thread_to_pool(device, pool):
        tid = threading.get_ident()
        A.begin(tuple(pool), lambda s: threading.get_ident() == tid)

    def begin_stream_to_pool(device, pool):
        stream = current_stream().cuda_stream
        A.begin(tuple(pool), lambda s: s == stream)

    # The bindings use_mem_pool is built on, which torch.compile's CUDA graph trees call
    # themselves.
    C._cuda_beginAllocateCurrentThreadToPool = begin_thread_to_pool
    C._cuda_beginAllocateCurrentStreamToPool = begin_stream_to_pool
    C._cuda_endAllocateToPool = lambda device, pool: A.end(tuple(pool))
    C._cuda_endAllocateCurrentStreamToPool = lambda device, pool: A.end(tuple(pool))
    C._cuda_releasePool = lambda device, pool: A.release_pool(tuple(pool))

    # What torch.compile's CUDA graph trees checkpoint their pool with and set it back
    # by (the state object is opaque in PyTorch). The blocks live in the checkpoint come
    # back as tensors here (PyTorch gives them to the trees' live storages).
    class _AllocatorState:
        def __init__(self, pool, segments):
            self.pool, self.segments = pool, segments

    C._cuda_getCheckpointState = lambda device, pool: _AllocatorState(tuple(pool), A.checkpoint(tuple(pool)))

    def set_checkpoint_pool_state(device, state, stale_storages, storages_to_add_deleters_to):
        out = []
        for placed in A.set_checkpoint(state.pool, state.segments):
            t = Tensor(0, "cpu")
            t.placed = placed
            out.append(t)
        return out

    C._cuda_setCheckpointPoolState = set_checkpoint_pool_state

    def empty_cache():
        torch._C._cuda_emptyCache()

    def reset_peak_memory_stats(device=None):
        torch._C._cuda_resetPeakMemoryStats(0)

    def set_per_process_memory_fraction(fraction, device=None):
        torch._C._cuda_setMemoryFraction(fraction, 0)

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None, **_):
        A.history = enabled is not None
        A.max_entries = max_entries
        if enabled is None:
            A.trace = []

    def _set_memory_metadata(text):
        A.local.metadata = text

    def is_current_stream_capturing():
        return current_stream().cuda_stream in capturing

    class _MemPool:  # the C++ class: its destructor releases the pool and empties it
        def __init__(self, allocator=None, is_user_created=True, use_on_oom=False, no_split=False):
            self._id = (0, next(A.ids))
            A.create_or_incref(self._id)

        @property
        def id(self):
            return self._id

        def use_count(self):
            return A.use_counts[self._id]

        def __del__(self):
            A.release_pool(self._id)
            A.release_cached(self._id)

    class MemPool(_MemPool):
        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            super().__init__(allocator, True, use_on_oom, no_split)

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool.id)
        try:
            yield
        finally:
            torch._C._cuda_endAllocateToPool(0, pool.id)
            torch._C._cuda_releasePool(0, pool.id)

    class _CUDAGraph:  # the C++ class: its destructor resets
        def __init__(self, keep_graph=False):
            self._ended = False
            self._pool = None

        def capture_begin(self, pool=None, capture_error_mode="global"):
            s = current_stream().cuda_stream
            if s == 0:
                raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
            self._pool = tuple(pool) if pool is not None and any(pool) else (next(A.ids), 0)
            self._capture = next(A.ids)
            cid = self._capture
            A.begin(self._pool, lambda st: capturing.get(st) == cid)
            capturing[s] = cid
            self._stream = s

        def capture_end(self):
            del capturing[self._stream]
            A.end(self._pool)
            self._ended = True

        def replay(self):
            pass

        def _reset(self):
            if self._ended:
                A.release_pool(self._pool)
                self._ended = False

        def reset(self):
            self._reset()

        def pool(self):
            if not self._ended:
                raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
            return self._pool

        def __del__(self):
            self._reset()

    class CUDAGraph(_CUDAGraph):
        def capture_begin(self, pool=None, capture_error_mode="global"):
            super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

        def capture_end(self):
            super().capture_end()

        def reset(self):
            super().reset()

    class graph:
        default_capture_stream = None

        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
            if stream is None and graph.default_capture_stream is None:
                graph.default_capture_stream = Stream()
            self.pool = () if pool is None else (pool,)
            self.stream_ctx = torch.cuda.stream(stream or graph.default_capture_stream)
            self.cuda_graph = cuda_graph

        def __enter__(self):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.stream_ctx.__enter__()
            self.cuda_graph.capture_begin(*self.pool)

        def __exit__(self, *args):
            self.cuda_graph.capture_end()
            self.stream_ctx.__exit__(*args)

    def memory_snapshot(mempool_id=None, include_traces=True):
        return A.snapshot(with_traces=False)["segments"]

    memory.empty_cache = empty_cache
    memory.reset_peak_memory_stats = reset_peak_memory_stats
    memory.set_per_process_memory_fraction = set_per_process_memory_fraction
    memory._record_memory_history = _record_memory_history
    memory._snapshot = lambda device=None: A.snapshot()
    memory.memory_snapshot = memory_snapshot
    memory.MemPool = MemPool
    memory.use_mem_pool = use_mem_pool
    if metadata:
        memory._set_memory_metadata = _set_memory_metadata
    for name in ("empty_cache", "reset_peak_memory_stats", "set_per_process_memory_fraction",
                 "memory_snapshot", "MemPool", "use_mem_pool"):
        setattr(cuda, name, getattr(memory, name))
    cuda.is_available = lambda: available
    cuda.init = lambda: None
    cuda.synchronize = lambda device=None: None
    cuda.get_device_name = lambda device=None: "Fake GPU"
    cuda.mem_get_info = lambda device=None: (A.total - A.reserved, A.total)
    cuda.memory_stats = lambda device=None: A.stats()
    cuda.memory_allocated = lambda device=None: A.allocated
    cuda.memory_reserved = lambda device=None: A.reserved
    cuda.max_memory_allocated = lambda device=None: A.max_allocated
    cuda.max_memory_reserved = lambda device=None: A.max_reserved
    cuda.is_current_stream_capturing = is_current_stream_capturing
    cuda.current_stream = lambda device=None: current_stream()
    cuda.Stream = Stream
    cuda.stream = stream
    cuda.CUDAGraph = CUDAGraph
    cuda.graph = graph
    cuda.graph_pool_handle = lambda: (0, next(A.ids))
    return torch
