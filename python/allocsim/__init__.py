"""allocsim from Python: how much GPU memory a workload takes under an allocator.

The same engine as the ``allocsim`` command line (one native module, ``allocsim._native``,
over the Rust library crates): replay a trace under a policy, compare policies and
capacities, find the least memory a trace fits in, run sweeps (on a Dask cluster too).

A trace is a path to any file the command line reads (YAML, CSV, recorded JSON, PyTorch
snapshot pickles, RMM logs) or a PyTorch memory snapshot in memory: the ``dict`` that
``torch.cuda.memory._snapshot()`` returns (or its pickled ``bytes``)::

    import allocsim, torch
    r = allocsim.replay(torch.cuda.memory._snapshot(), policy="caching",
                        alloc_conf="expandable_segments:True", capacity="24GiB")
    r.reserved_bytes_peak, r.oom

Rows (``compare``, ``fit``, ``sweep``) are dicts whose keys are the CSV columns of the
matching command (``docs/metrics.md``); ``.to_pandas()`` or ``as_frame=True`` gives a
pandas DataFrame. Errors are ``TraceError`` (a trace that does not read or replay: the
file or snapshot and the line, event or entry), ``ConfigError`` (settings that do not
make a run), both ``ValueError``s, and ``ReplayError`` (a ``RuntimeError``). Running out
of memory is a result (``Replay.oom``), not an exception. See ``docs/python.md``.
"""

from __future__ import annotations

import array
import json
import os
import pickle
import sys
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._native import ConfigError, ReplayError, TraceError

__version__: str = _native.__version__

__all__ = [
    "ConfigError",
    "Oom",
    "Replay",
    "ReplayError",
    "Rows",
    "SweepResult",
    "Timeline",
    "TraceError",
    "compare",
    "fit",
    "gpu_profiles",
    "merge",
    "policies",
    "replay",
    "sweep",
]

PathLike = Union[str, "os.PathLike[str]"]
#: A trace: a file path, a snapshot dict (``torch.cuda.memory._snapshot()``), the bytes
#: of a pickled snapshot, or a ``(name, snapshot)`` pair naming a snapshot for reports.
TraceLike = Union[PathLike, Mapping[str, Any], bytes, Tuple[str, Any]]
#: A size: bytes as an integer, or text as the command line takes it (``"24GiB"``).
Size = Union[int, str]

#: The numeric columns of a timeline, as ``allocsim replay --timeline`` writes them
#: (``op``, ``id`` and ``bytes`` are the others).
TIMELINE_COLUMNS: Tuple[str, ...] = (
    "event_index",
    "requested_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "charged_bytes",
    "allocation_count",
    "segment_count",
)


def _numpy() -> Any:
    """numpy when it is installed, else None."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as e:
        raise ImportError("allocsim: pandas is not installed (pip install pandas)") from e
    return pandas


def _trace_arg(trace: Any, name: Optional[str] = None) -> Any:
    """A trace as the native module takes it: a path string, or (name, pickle bytes)."""
    if isinstance(trace, tuple) and len(trace) == 2 and isinstance(trace[0], str):
        return _trace_arg(trace[1], trace[0])
    if isinstance(trace, Mapping):
        label = name or "snapshot"
        try:
            data = pickle.dumps(dict(trace), protocol=4)
        except Exception as e:  # anything pickle refuses: lambdas, open files...
            raise TraceError(f"{label}: the snapshot dict cannot be pickled: {e}") from e
        return (label, data)
    if isinstance(trace, (bytes, bytearray, memoryview)):
        return (name or "snapshot", bytes(trace))
    if isinstance(trace, (str, os.PathLike)):
        return os.fspath(trace)
    raise TypeError(
        "allocsim: a trace is a path, a snapshot dict (torch.cuda.memory._snapshot()), "
        f"pickled snapshot bytes or a (name, snapshot) pair, not {type(trace).__name__}"
    )


def _sizes(value: Union[None, Size, Sequence[Size]]) -> List[Size]:
    if value is None:
        return []
    # One size, whatever it is (a float is refused by the native module, naming it).
    if isinstance(value, (int, float, str)):
        return [value]
    return list(value)


def _policies(value: Union[None, str, Sequence[str]]) -> List[str]:
    if value is None:
        return [",".join(_native.policy_names())]
    if isinstance(value, str):
        return [value]
    return list(value)


#: The keyword arguments that mean the same to every function that takes them, and go to
#: the native module under their own names: each function passes its ``locals()``.
_SETTINGS: Tuple[str, ...] = (
    "alloc_conf",
    "cap",
    "memory_fraction",
    "gpu_profile",
    "timeline",
    "explain",
    "device",
    "format",
    "lenient",
    "no_recorded_addresses",
    "check_invariants",
    "continue_after_oom",
)


def _options(given: Mapping[str, Any], **extra: Any) -> str:
    """The native module's options: the settings among ``given`` (a function's
    ``locals()``) and ``extra`` (what the function turned into another form), as JSON,
    without those left at ``None``."""
    kw = {k: given[k] for k in _SETTINGS if k in given}
    kw.update(extra)
    return json.dumps({k: v for k, v in kw.items() if v is not None})


def _trace_list(traces: Any) -> List[Any]:
    """One trace or several, as the native module's list."""
    if isinstance(traces, (str, os.PathLike, Mapping, bytes, bytearray, tuple)):
        traces = [traces]
    return [_trace_arg(t) for t in traces]


def _utilization(row: Dict[str, Any]) -> Dict[str, Any]:
    # The CSV writes six decimals, empty when nothing was reserved; here a float or None.
    u = row.get("utilization")
    if isinstance(u, str):
        row["utilization"] = float(u) if u else None
    return row


class Rows(List[Dict[str, Any]]):
    """Rows of a table: a list of dicts whose keys are the CSV's columns, in order.

    ``utilization`` is a float (``None`` when nothing was reserved) where the CSV has
    six decimals. ``to_pandas()`` gives a DataFrame with those columns (integer columns
    with empty cells as pandas' nullable ``Int64``).
    """

    def __init__(self, rows: Iterable[Dict[str, Any]], columns: Sequence[str]):
        super().__init__(rows)
        #: The columns, in the CSV's order.
        self.columns: List[str] = list(columns)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        pd = _pandas()
        frame = pd.DataFrame.from_records(list(self), columns=self.columns)
        for c in self.columns:
            values = [r.get(c) for r in self]
            present = [v for v in values if v is not None]
            if (
                len(present) < len(values)
                and present
                and all(isinstance(v, int) and not isinstance(v, bool) for v in present)
            ):
                frame[c] = pd.array(values, dtype="Int64")
        return frame


def _rows(text: str, columns: Optional[Sequence[str]] = None) -> Rows:
    rows = [_utilization(r) for r in json.loads(text)]
    if columns is None:
        columns = list(rows[0].keys()) if rows else []
    return Rows(rows, columns)


class Timeline:
    """Memory after each event of a replay: the columns of ``allocsim replay --timeline``.

    ``timeline["reserved_bytes"]`` is a numpy ``uint64`` array when numpy is installed,
    else a list; ``op`` is a list of str, ``id`` and ``bytes`` lists with ``None`` where
    the event has none. ``to_pandas()`` gives a DataFrame.
    """

    def __init__(self, numeric: bytes, op: List[str], ids: List[Optional[int]], sizes: List[Optional[int]]):
        n = len(op)
        np = _numpy()
        self._columns: Dict[str, Any] = {}
        for k, name in enumerate(TIMELINE_COLUMNS):
            chunk = memoryview(numeric)[k * 8 * n : (k + 1) * 8 * n]
            if np is not None:
                self._columns[name] = np.frombuffer(chunk, dtype="<u8").copy()
            else:
                a = array.array("Q")
                a.frombytes(chunk)
                if sys.byteorder != "little":
                    a.byteswap()
                self._columns[name] = a.tolist()
        self._columns["op"] = op
        self._columns["id"] = ids
        self._columns["bytes"] = sizes

    #: Column order, as the CSV.
    columns: Tuple[str, ...] = (
        "event_index",
        "op",
        "id",
        "bytes",
        "requested_bytes",
        "allocated_bytes",
        "reserved_bytes",
        "charged_bytes",
        "allocation_count",
        "segment_count",
    )

    def __len__(self) -> int:
        return len(self._columns["op"])

    def __getitem__(self, column: str) -> Any:
        return self._columns[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def to_dict(self) -> Dict[str, Any]:
        """Every column by name."""
        return {c: self._columns[c] for c in self.columns}

    def to_pandas(self) -> Any:
        """The timeline as a pandas DataFrame (needs pandas)."""
        pd = _pandas()
        data = {}
        for c in self.columns:
            v = self._columns[c]
            data[c] = pd.array(v, dtype="Int64") if c in ("id", "bytes") else v
        return pd.DataFrame(data, columns=list(self.columns))

    def __repr__(self) -> str:
        return f"<allocsim.Timeline of {len(self)} events>"


class Oom:
    """Where a replay first ran out of memory.

    ``event_index`` numbers events as the command line does (``event`` is how it names
    that event, with the line or entry of the file); ``requested_bytes`` is what the
    request asked, ``tried_bytes`` what the policy last tried to get from the device.
    ``cause``, ``verdict`` and ``fix`` say why (``explanation`` holds the breakdown of
    the free memory by cause), when the replay was explained.

    A trace that starts mid-run whose starting state the device cannot hold runs out
    before the first event: ``event_index`` is ``None``, ``event`` says "before the
    first event", ``requested_bytes`` is the starting state's, ``cause`` is
    ``"starting state"`` and ``verdict`` says what can help (no allocator setting can:
    ``fix`` is ``None``).
    """

    def __init__(self, d: Dict[str, Any]):
        self.event_index: Optional[int] = d["oom_event_index"]
        self.event: str = d["oom_event"]
        self.requested_bytes: int = d["oom_requested_bytes"]
        self.tried_bytes: int = d["oom_tried_bytes"]
        self.allocated_bytes: int = d["allocated_bytes_at_oom"]
        self.reserved_bytes: int = d["reserved_bytes_at_oom"]
        self.device_free_bytes: int = d["oom_device_free_bytes"]
        self.message: Optional[str] = d["oom_message"]
        self.count: int = d["oom_count"]
        #: The stack PyTorch recorded for that request, innermost first (``file:line
        #: name``), when the trace is a snapshot recorded with stacks; else empty.
        self.stack: List[str] = d.get("oom_stack") or []
        e = d.get("explanation")
        self.explanation: Optional[Dict[str, Any]] = e
        self.cause: Optional[str] = e["cause"] if e else (d.get("oom_cause") or None)
        self.verdict: Optional[str] = d.get("oom_verdict")
        self.fix: Optional[str] = e["fix"] if e else None

    def __repr__(self) -> str:
        why = f": {self.verdict}" if self.verdict else ""
        at = self.event if self.event_index is None else f"at {self.event}"
        return f"<allocsim.Oom {at}, request of {self.requested_bytes} bytes{why}>"


class Replay:
    """One replay's answer.

    Every column of ``allocsim compare``'s CSV is an attribute (``reserved_bytes_peak``,
    ``allocated_bytes_peak``, ``requested_bytes_peak``, ``charged_bytes_peak``,
    ``utilization``, ``segment_count_peak``, ...), and ``to_dict()`` gives them all with
    what only a single replay shows: the settings in force (``alloc_conf``,
    ``settings``: which recorded settings applied), ``caveats`` (why the numbers may
    not be exact), ``oom`` (an :class:`Oom`, or ``None``), ``timeline`` (a
    :class:`Timeline` with ``timeline=True``, else ``None``).
    """

    def __init__(self, d: Dict[str, Any], timeline: Optional[Timeline]):
        self._d = d
        # Every replay that ran out has its request's bytes (before the first event, too).
        self.oom: Optional[Oom] = Oom(d) if d.get("oom_requested_bytes") is not None else None
        self.timeline: Optional[Timeline] = timeline

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__.get("_d")
        if d is not None and name in d:
            return d[name]
        raise AttributeError(f"allocsim.Replay has no attribute {name!r}")

    @property
    def peaks(self) -> Dict[str, int]:
        """The peaks: requested, allocated, reserved and charged bytes."""
        return {
            k: self._d[k]
            for k in (
                "requested_bytes_peak",
                "allocated_bytes_peak",
                "reserved_bytes_peak",
                "charged_bytes_peak",
            )
        }

    def to_dict(self) -> Dict[str, Any]:
        """Every field (not the timeline)."""
        return dict(self._d)

    def __repr__(self) -> str:
        d = self._d
        at = "" if d["oom_event_index"] is None else "at "
        oom = f", out of memory {at}{d['oom_event']}" if self.oom else ""
        return (
            f"<allocsim.Replay {d['trace']} under {d['policy']}: reserved peak "
            f"{d['reserved_bytes_peak']} bytes, allocated peak {d['allocated_bytes_peak']}{oom}>"
        )


def replay(
    trace: TraceLike,
    policy: str = "caching",
    *,
    alloc_conf: Optional[str] = None,
    capacity: Optional[Size] = None,
    cap: Optional[Size] = None,
    memory_fraction: Optional[float] = None,
    gpu_profile: Optional[str] = None,
    timeline: bool = False,
    explain: bool = True,
    name: Optional[str] = None,
    device: int = 0,
    format: Optional[str] = None,
    lenient: bool = False,
    no_recorded_addresses: bool = False,
    check_invariants: bool = False,
    continue_after_oom: bool = False,
) -> Replay:
    """Replays one trace under one policy (``allocsim replay``).

    ``policy`` is a specification as the command line takes it (``caching``,
    ``caching:expandable_segments=true``, ``buddy:min_block=4KiB``). A recorded run
    (snapshot, recorded JSON) replays under its recorded ``PYTORCH_CUDA_ALLOC_CONF``
    and cap unless ``alloc_conf``, ``cap``, ``memory_fraction`` or ``capacity`` replace
    them (``Replay.settings`` says which applied). ``capacity`` is the GPU's total
    memory (``"24GiB"``), ``gpu_profile`` a built-in profile (``h100``) or a profile
    file; without either, a recorded JSON run replays on the device it recorded (its
    total and free memory, as in :func:`compare`), anything else on an 80 GiB device.
    ``timeline=True`` keeps
    the memory after every event. ``explain`` says why
    an out-of-memory happened and checks the settings that would avoid it (more
    replays). ``name`` names a snapshot given in memory in messages and reports.
    """
    options = _options(locals(), policies=[policy], capacity=_sizes(capacity))
    text, numeric = _native.replay(_trace_arg(trace, name), options)
    d = json.loads(text)
    _utilization(d)
    line = None
    if numeric is not None:
        line = Timeline(numeric, d.pop("timeline_op"), d.pop("timeline_id"), d.pop("timeline_bytes"))
    for k in ("timeline_op", "timeline_id", "timeline_bytes"):
        d.pop(k, None)
    return Replay(d, line)


def compare(
    traces: Union[TraceLike, Sequence[TraceLike]],
    policies: Union[None, str, Sequence[str]] = None,
    *,
    capacity: Union[None, Size, Sequence[Size]] = None,
    alloc_conf: Optional[str] = None,
    cap: Optional[Size] = None,
    memory_fraction: Optional[float] = None,
    gpu_profile: Optional[str] = None,
    device: int = 0,
    format: Optional[str] = None,
    lenient: bool = False,
    no_recorded_addresses: bool = False,
    check_invariants: bool = False,
    continue_after_oom: bool = False,
    as_frame: bool = False,
) -> Any:
    """Every trace × policy × capacity (``allocsim compare``), replayed in parallel.

    ``policies`` is a comma-separated list or a list of specifications (default: every
    registered policy); ``capacity`` one size or several (without it or
    ``gpu_profile``, a recorded JSON run replays on the device it recorded, anything
    else on an 80 GiB device). Rows come in the CSV's order
    (trace, then policy, then capacity), with its columns. ``as_frame=True`` returns a
    pandas DataFrame instead of :class:`Rows`.
    """
    options = _options(locals(), policies=_policies(policies), capacity=_sizes(capacity))
    text, notes = _native.compare(_trace_list(traces), options)
    rows = _rows(text)
    rows.settings = dict(notes)  # type: ignore[attr-defined]
    return rows.to_pandas() if as_frame else rows


def fit(
    traces: Union[TraceLike, Sequence[TraceLike]],
    policies: Union[None, str, Sequence[str]] = "caching",
    *,
    gpus: Union[None, str, Sequence[str]] = None,
    alloc_conf: Optional[str] = None,
    cap: Optional[Size] = None,
    memory_fraction: Optional[float] = None,
    gpu_profile: Optional[str] = None,
    device: int = 0,
    format: Optional[str] = None,
    lenient: bool = False,
    no_recorded_addresses: bool = False,
    check_invariants: bool = False,
    as_frame: bool = False,
) -> Any:
    """The least GPU memory each trace × policy runs in (``allocsim fit``): bisection to
    the 2 MiB page, checked around the answer (``monotonic`` says whether every size
    tried agreed). ``gpus`` names GPU profiles (``"all"``, ``["h100", "a100-40gb"]``);
    each adds a column saying whether the trace fits on it. Where a profile's usable
    memory varies between processes (``usable_spread_bytes``: 4 MiB on the H200),
    ``min_capacity_with_spread_bytes`` is the least total that fits with that to spare,
    and ``marginal_gpus`` names the GPUs on which the answer could differ in another
    process (``docs/metrics.md``, "The driver's variation").
    """
    if isinstance(gpus, str):
        gpus = [g for g in gpus.split(",") if g]
    options = _options(locals(), policies=_policies(policies), gpus=list(gpus or []))
    columns, rows = json.loads(_native.fit(_trace_list(traces), options))
    out = Rows([{c: r[c] for c in columns} for r in rows], columns)
    return out.to_pandas() if as_frame else out


class SweepResult:
    """A sweep's answer: ``rows`` (the CSV's rows, :class:`Rows`), ``csv`` (the CSV
    text, byte for byte what ``allocsim sweep -o`` writes) and ``needs`` (for a whole
    run, each trace's least memory for its recommended configuration; empty for a
    shard or a merge, as ``allocsim merge``).
    """

    def __init__(self, csv: str, rows: str, needs: Sequence[Tuple[str, Optional[int]]] = ()):
        self.csv: str = csv
        # The CSV's header names the columns (no field of a sweep row holds a comma).
        self.rows: Rows = _rows(rows, csv.split("\n", 1)[0].strip().split(","))
        self.needs: Dict[str, Optional[int]] = dict(needs)

    @property
    def recommended(self) -> Rows:
        """The recommended row of each trace."""
        return Rows([r for r in self.rows if r["recommended"]], self.rows.columns)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        return self.rows.to_pandas()

    def __repr__(self) -> str:
        return f"<allocsim.SweepResult of {len(self.rows)} rows>"


def _sweep_spec(spec: Union[PathLike, Mapping[str, Any]]) -> Tuple[str, str]:
    """A sweep file's text and the path naming it (trace files are relative to its
    directory); a dict is written as JSON (which is YAML), relative to the current
    directory."""
    if isinstance(spec, Mapping):
        return json.dumps(spec, indent=1), os.path.join(os.getcwd(), "<sweep dict>")
    path = os.path.abspath(os.fspath(spec))
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), path
    except OSError as e:
        raise ConfigError(f"{os.fspath(spec)}: {e.strerror or e}") from e


def _sweep_shard(text: str, path: str, traces: List[str], options: str) -> str:
    """One shard of a sweep, as a cluster's task runs it: its CSV."""
    csv, _, _ = _native.sweep(text, path, traces, options)
    return csv


def sweep(
    spec: Union[PathLike, Mapping[str, Any]],
    traces: Optional[Sequence[PathLike]] = None,
    *,
    shard: Union[None, str, Tuple[int, int]] = None,
    client: Any = None,
    shards: Optional[int] = None,
    check_invariants: bool = False,
    as_frame: bool = False,
) -> Any:
    """Runs a sweep (``allocsim sweep``): a sweep file's path, or the same structure
    as a dict (``{"traces": [...], "policies": {...}, "capacities": [...]}``,
    ``docs/sweeps.md``). ``traces`` replaces the file's traces (``--trace``).

    ``shard=(k, n)`` (or ``"k/n"``) runs one part, as ``--shard K/N``: the rows whose
    combination index is ``k - 1`` modulo ``n``, unranked; :func:`merge` joins parts.

    ``client`` (a ``dask.distributed.Client``) spreads the sweep over a cluster: one
    task per shard (``shards`` of them; default, one per worker thread), each running
    :func:`sweep` with ``shard=(k, n)`` on a worker, joined by :func:`merge` into the
    CSV one run gives, byte for byte. The workers must see the trace files at the
    same paths (a shared file system). The least-memory bisection of the
    recommendation (``needs``) is only in a whole run on one machine.

    Returns a :class:`SweepResult`, or with ``as_frame=True`` its rows as a DataFrame.
    """
    text, path = _sweep_spec(spec)
    paths = [os.path.abspath(os.fspath(t)) for t in (traces or [])]
    if client is not None:
        if shard is not None:
            raise ConfigError("shard: give client= or shard=, not both")
        n = shards or max(1, sum(client.nthreads().values()))
        n = max(1, min(n, _native.sweep_rows(text, path, paths)))
        given = dict(locals())  # the function's (a comprehension has its own scope)
        tasks = [_options(given, shard=f"{k}/{n}") for k in range(1, n + 1)]
        futures = client.map(_sweep_shard, [text] * n, [path] * n, [paths] * n, tasks, pure=False)
        result = merge(client.gather(futures))
    else:
        if isinstance(shard, tuple):
            shard = f"{shard[0]}/{shard[1]}"
        result = SweepResult(*_native.sweep(text, path, paths, _options(locals(), shard=shard)))
    return result.to_pandas() if as_frame else result


def merge(shards: Sequence[Union[SweepResult, str]]) -> SweepResult:
    """Joins the parts of a sweep (``allocsim merge``): each a :class:`SweepResult` of
    ``sweep(..., shard=...)`` or its CSV text, in any order. The rows are ranked as one
    run ranks them; the CSV is the one a single run writes.
    """
    parts = [(f"shard {i + 1}", s.csv if isinstance(s, SweepResult) else s) for i, s in enumerate(shards)]
    return SweepResult(*_native.merge(parts))


def policies() -> List[str]:
    """The registered policies' names (``allocsim policies`` describes their options)."""
    return list(_native.policy_names())


def gpu_profiles() -> List[str]:
    """The built-in GPU profiles' names (for ``gpu_profile=`` and ``fit(gpus=...)``)."""
    return list(_native.gpu_profiles())
