"""The allocsim Python package against the repository's bundled traces (pytest).

Run by .ci/run from a fresh virtual environment with the wheel installed; by hand:
``pip install maturin pytest numpy pandas "dask[distributed]"``, ``maturin build -o
target/wheels`` in python/, ``pip install target/wheels/allocsim-*.whl``, then
``pytest python/tests``.
"""

import ast
import csv
import io
import pickle
from pathlib import Path

import pytest

import allocsim
from allocsim import _native

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SNAPSHOT = DATA / "torch" / "multistream.pickle"
SWEEP = ROOT / "examples" / "sweep.yaml"


def load_snapshot(path=SNAPSHOT):
    with open(path, "rb") as f:
        return pickle.load(f)


def csv_cell(value):
    """A row's value as the CSV writes it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value)


@pytest.mark.parametrize("name", ["two_streams", "one_gib_plus_one", "empty_cache", "seed000"])
def test_compare_rows_equal_the_golden_csv(name):
    """compare() gives, column for column, the hand-checked golden CSV of the command line,
    under every registered policy (allocsim.policies(), as tests/golden.rs)."""
    rows = allocsim.compare(DATA / "traces" / f"{name}.yaml", allocsim.policies())
    with open(DATA / "expected" / f"{name}.csv", newline="") as f:
        expected = list(csv.DictReader(f))
    assert rows.columns == list(expected[0].keys())
    assert [{k: csv_cell(v) for k, v in r.items()} for r in rows] == expected


def test_replay_reads_peaks_and_the_timeline():
    """replay() gives the peaks of the compare row and a timeline whose maxima are those peaks."""
    path = DATA / "traces" / "seed000.yaml"
    r = allocsim.replay(path, "caching", timeline=True)
    [row] = allocsim.compare(path, "caching")
    assert r.peaks == {k: row[k] for k in r.peaks}
    assert r.reserved_bytes_peak == row["reserved_bytes_peak"] > 0
    assert r.utilization == row["utilization"]
    assert r.oom is None
    t = r.timeline
    assert len(t) == r.events_replayed == r.events
    assert list(t["event_index"]) == list(range(len(t)))
    assert int(max(t["reserved_bytes"])) == r.reserved_bytes_peak
    assert int(max(t["requested_bytes"])) == r.requested_bytes_peak
    assert str(t["reserved_bytes"].dtype) == "uint64"
    assert t["op"][0] == "alloc" and t["bytes"][0] > 0
    frame = t.to_pandas()
    assert list(frame.columns) == list(allocsim.Timeline.columns)
    assert int(frame["reserved_bytes"].max()) == r.reserved_bytes_peak


def test_timeline_without_numpy_is_lists(monkeypatch):
    """Without numpy the timeline's columns are plain lists with the same values."""
    path = DATA / "traces" / "two_streams.yaml"
    with_numpy = allocsim.replay(path, timeline=True).timeline
    monkeypatch.setattr(allocsim, "_numpy", lambda: None)
    without = allocsim.replay(path, timeline=True).timeline
    assert isinstance(without["reserved_bytes"], list)
    assert without["reserved_bytes"] == [int(v) for v in with_numpy["reserved_bytes"]]


def test_oom_point_as_the_command_line_numbers_it():
    """An out-of-memory is a result: its event index, the request and the explanation match compare's row."""
    path = DATA / "traces" / "one_gib_plus_one.yaml"
    r = allocsim.replay(path, "caching", capacity="1GiB")
    [row] = allocsim.compare(path, "caching", capacity="1GiB")
    assert r.oom is not None
    assert r.oom.event_index == row["oom_event_index"] == 0
    assert r.oom.event == "event 0 (line 5)" or r.oom.event.startswith("event 0")
    assert r.oom.requested_bytes == 1073741825 == row["oom_requested_bytes"]
    assert r.oom.cause == row["oom_cause"] != ""
    assert r.oom.verdict
    assert r.oom.message and "out of memory" in r.oom.message.lower()


def test_a_starting_state_that_does_not_fit_runs_out_before_the_first_event():
    """A trace that starts mid-run on a device below its starting state: an Oom with no event index, the state's bytes, cause 'starting state', no fix; compare goes on past that row."""
    path = DATA / "unseen" / "midrun" / "resnet_train__wrap3000.json"
    r = allocsim.replay(path, "caching", capacity="1200MiB")
    assert r.oom is not None
    assert r.oom.event_index is None
    assert r.oom.event == "before the first event"
    assert r.oom.requested_bytes == 1388314624
    assert r.oom.cause == "starting state"
    assert r.oom.fix is None
    assert "no allocator setting shrinks memory" in r.oom.verdict
    assert r.oom.message.startswith("the starting state of 40 segment(s)")
    assert "before the first event" in repr(r)
    rows = allocsim.compare(path, "caching", capacity=["1200MiB", "80GiB"])
    assert [row["oom_event_index"] for row in rows] == [None, None]
    assert [row["oom_requested_bytes"] for row in rows] == [1388314624, None]
    assert rows[0]["oom_cause"] == "starting state"


def test_snapshot_dict_replays_as_its_file():
    """A snapshot dict in memory replays exactly as the pickle file it was loaded from."""
    from_dict = allocsim.replay(load_snapshot(), name="multistream").to_dict()
    from_file = allocsim.replay(SNAPSHOT).to_dict()
    for d in (from_dict, from_file):
        d.pop("path")
    assert from_dict == from_file
    assert from_dict["events"] == 100


def test_snapshot_dict_applies_recorded_settings_unless_replaced():
    """A snapshot's recorded alloc_conf applies unless alloc_conf= replaces it, and settings says so."""
    snap = load_snapshot()
    snap["allocator_settings"] = dict(snap.get("allocator_settings") or {})
    recorded = allocsim.replay(snap)
    replaced = allocsim.replay(snap, alloc_conf="expandable_segments:True")
    assert replaced.alloc_conf == "expandable_segments:True"
    assert replaced.reserved_bytes_peak != recorded.reserved_bytes_peak or replaced.alloc_conf != recorded.alloc_conf


def test_pickled_bytes_and_named_pairs_are_traces():
    """Pickled snapshot bytes and (name, dict) pairs are traces; names are unique in rows."""
    data = SNAPSHOT.read_bytes()
    rows = allocsim.compare([data, ("mine", load_snapshot()), data], "caching")
    assert [r["trace"] for r in rows] == ["snapshot", "mine", "snapshot#2"]
    assert len({r["reserved_bytes_peak"] for r in rows}) == 1


@pytest.mark.parametrize(
    "snapshot, words",
    [
        ({}, "no 'device_traces'"),
        ({"segments": 5, "device_traces": []}, "'segments' is not a list"),
        ({"segments": [], "device_traces": [[{"action": "alloc"}]]}, "entry 0"),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 16, "size": -5, "stream": 0}]]}, "'size' is -5"),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 5, "stream": 0}]]}, "'addr' is a string"),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 16, "size": 2**70, "stream": 0}]]}, "64 bits"),
        ({"segments": [], "device_traces": [[{"action": "free_completed", "addr": 16, "size": 5, "stream": 0}]]}, "entry 0"),
        ({"segments": [], "device_traces": "nope"}, "device_traces"),
        ({"segments": [{"address": 1}], "device_traces": [[]]}, "segment"),
        ({"x": lambda: 1}, "cannot be pickled"),
    ],
)
def test_broken_snapshot_dicts_raise_trace_error(snapshot, words):
    """A broken snapshot dict raises TraceError naming the snapshot and the record, never a panic."""
    with pytest.raises(allocsim.TraceError) as e:
        allocsim.replay(snapshot, name="mysnap")
    message = str(e.value)
    assert message.startswith("mysnap: "), message
    assert words in message, message
    assert "\n" not in message
    assert isinstance(e.value, ValueError)


def test_a_missing_device_of_a_snapshot_is_a_trace_error():
    """Asking a snapshot for a device it does not hold names the devices it has."""
    with pytest.raises(allocsim.TraceError, match="device 3 is not in the snapshot"):
        allocsim.replay(load_snapshot(), device=3)


def test_a_file_that_does_not_read_names_the_file_and_line(tmp_path):
    """A malformed trace file raises TraceError naming the file and the event."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("events:\n  - {op: alloc, id: 1, bytes: 512}\n  - {op: alloc, id: 2, bytes: -3}\n")
    with pytest.raises(allocsim.TraceError) as e:
        allocsim.replay(bad)
    assert str(e.value).startswith(str(bad)), str(e.value)
    assert ": event 1: " in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda p: allocsim.replay(p, "nosuch"), "unknown policy 'nosuch'"),
        (lambda p: allocsim.replay(p, "caching:nokey=1"), "unknown option 'nokey'"),
        (lambda p: allocsim.replay(p, capacity="lots"), "capacity=\"lots\""),
        (lambda p: allocsim.replay(p, capacity=[1 << 30, 2 << 30]), "one capacity"),
        # Sizes that are no size: serde's words (no name) and a TypeError before.
        (lambda p: allocsim.replay(p, capacity=-1), "capacity=-1: not a size"),
        (lambda p: allocsim.replay(p, capacity=1 << 70), "capacity=1.18"),
        (lambda p: allocsim.replay(p, capacity=1.5), "capacity=1.5: not a size"),
        (lambda p: allocsim.compare(p, "caching", capacity=[1 << 30, -1]), "capacity=-1: not a size"),
        (lambda p: allocsim.replay(p, cap=-2), "cap=-2: not a size"),
        (lambda p: allocsim.replay(p, "caching,buddy"), "one policy"),
        (lambda p: allocsim.replay(p, gpu_profile="no-such-gpu"), "unknown GPU profile"),
        (lambda p: allocsim.replay(p, format="nosuch"), "unknown format"),
        (lambda p: allocsim.fit(p, gpus="no-such-gpu"), "no-such-gpu"),
        (lambda p: allocsim.sweep(SWEEP, shard="4/3"), "shard"),
        (lambda p: allocsim.sweep({"traces": [str(p)], "policies": ["nosuch"]}), "nosuch"),
    ],
)
def test_bad_settings_raise_config_error(call, words):
    """Settings that do not make a run raise ConfigError with a one-line message naming them."""
    with pytest.raises(allocsim.ConfigError) as e:
        call(DATA / "traces" / "two_streams.yaml")
    assert words in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)


def test_fit_is_the_least_memory_that_replays():
    """fit()'s minimum replays without an out-of-memory, and one 2 MiB page less runs out."""
    path = DATA / "traces" / "seed000.yaml"
    [row] = allocsim.fit(path, "caching", gpus=["h100"])
    assert list(row) == ["trace", "policy", "min_capacity_bytes", "requested_bytes_peak", "overhead_bytes", "overhead_pct", "monotonic", "usable_spread_bytes", "min_capacity_with_spread_bytes", "marginal_gpus", "h100"]
    least = row["min_capacity_bytes"]
    assert row["monotonic"] is True and row["h100"] is True
    assert allocsim.replay(path, capacity=least).oom is None
    assert allocsim.replay(path, capacity=least - (2 << 20)).oom is not None


def test_rows_as_pandas_frames():
    """as_frame=True gives a DataFrame of the CSV's columns, empty integer cells as nullable Int64."""
    pd = pytest.importorskip("pandas")
    frame = allocsim.compare(DATA / "traces" / "one_gib_plus_one.yaml", "caching,buddy", capacity=["1GiB", "4GiB"], as_frame=True)
    assert isinstance(frame, pd.DataFrame)
    assert len(frame) == 4
    assert list(frame["total_bytes"]) == [1 << 30, 4 << 30] * 2
    assert str(frame["oom_event_index"].dtype) == "Int64"
    assert frame["oom_event_index"].isna().tolist() == [False, True, False, True]


def test_sweep_shards_merge_to_one_run():
    """A sweep run in shards and merged gives the same CSV, byte for byte, as one run."""
    whole = allocsim.sweep(SWEEP)
    parts = [allocsim.sweep(SWEEP, shard=(k, 3)) for k in (3, 1, 2)]
    assert all(not any(r["rank"] for r in p.rows) for p in parts)
    merged = allocsim.merge(parts)
    assert merged.csv == whole.csv
    assert merged.rows == whole.rows
    assert len(whole.recommended) == 2
    assert set(whole.needs) == {"gpt_train_small", "training_loop"}
    assert all(n and n > 0 for n in whole.needs.values())


def test_sweep_dict_is_a_sweep_file(tmp_path):
    """A sweep given as a dict runs as the same sweep written as a YAML file."""
    trace = DATA / "traces" / "seed000.yaml"
    spec = {
        "traces": [str(trace)],
        "policies": [{"caching": {"expandable_segments": [False, True]}}, "buddy"],
        "capacities": ["1GiB", "80GiB"],
    }
    result = allocsim.sweep(spec)
    assert len(result.rows) == 6
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"traces: [{trace}]\npolicies:\n  - caching:\n      expandable_segments: [false, true]\n"
        "  - buddy\ncapacities: [1GiB, 80GiB]\n"
    )
    assert result.csv == allocsim.sweep(path).csv
    frame = allocsim.sweep(spec, as_frame=True)
    assert list(frame.columns) == result.rows.columns


def test_sweep_on_a_dask_cluster_equals_one_run():
    """A sweep spread over a local Dask cluster (one task per shard) gives the CSV of one run."""
    distributed = pytest.importorskip("distributed")
    whole = allocsim.sweep(SWEEP)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            spread = allocsim.sweep(SWEEP, client=client, shards=5)
    assert spread.csv == whole.csv
    assert spread.rows == whole.rows


def test_merge_refuses_shards_that_do_not_join():
    """Merging a shard twice, or missing one, raises ConfigError naming the problem."""
    a = allocsim.sweep(SWEEP, shard=(1, 2))
    with pytest.raises(allocsim.ConfigError, match="same shard given twice"):
        allocsim.merge([a, a])
    with pytest.raises(allocsim.ConfigError, match="is missing"):
        allocsim.merge([a])
    with pytest.raises(allocsim.ConfigError, match="line 1"):
        allocsim.merge(["not,a,sweep\n1,2,3\n"])


def test_the_stubs_name_what_the_native_module_has():
    """_native.pyi declares exactly the native module's functions and exceptions."""
    stub = ast.parse((Path(allocsim.__file__).parent / "_native.pyi").read_text())
    declared = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.id for n in stub.body if isinstance(n, ast.AnnAssign) for t in [n.target] if isinstance(t, ast.Name)}
    public = {n for n in dir(_native) if not n.startswith("__") or n == "__version__"}
    assert declared == public
    assert (Path(allocsim.__file__).parent / "py.typed").exists()


def test_policies_and_profiles_are_the_registry():
    """policies() and gpu_profiles() list the command line's registered names."""
    assert allocsim.policies()[:2] == ["caching", "immediate"]
    assert "h100" in allocsim.gpu_profiles()


def test_the_python_docs_run(monkeypatch):
    """Every Python block of docs/python.md runs, in order, from the repository's root."""
    pytest.importorskip("distributed")
    text = (ROOT / "docs" / "python.md").read_text()
    blocks = []
    current = None
    for line in text.splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    assert len(blocks) >= 7
    monkeypatch.chdir(ROOT)
    scope = {}
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), scope)
    assert scope["spread"].csv == scope["merged"].csv


def test_ctrl_c_stops_a_long_call():
    """KeyboardInterrupt (Ctrl-C, a notebook's interrupt) stops a running comparison at its next event, and the next call runs."""
    import _thread
    import signal
    import threading
    import time

    snap = DATA / "oracle" / "h100-torch2.11-pickles" / "gpt_train_small.pickle"
    # 50,000 replays: over a minute uninterrupted (a debug build, two cores).
    capacities = [3000 * 2**20 + k * 4096 for k in range(50_000)]
    # A process started in the background (a CI job, `cmd &`) inherits SIGINT ignored,
    # and then interrupt_main does nothing: Python's own handler, as in a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            allocsim.compare(snap, "caching", capacity=capacities)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 10
    assert allocsim.replay(DATA / "traces" / "two_streams.yaml").oom is None


def test_the_oom_gives_the_stack_pytorch_recorded():
    """At an out-of-memory, a snapshot recorded with stacks gives the failing entry's frames, innermost first."""
    snap = load_snapshot()
    for i, entry in enumerate(snap["device_traces"][0]):
        entry["frames"] = [
            {"filename": "train.py", "line": i, "name": "step"},
            {"filename": "main.py", "line": 3, "name": "<module>"},
        ]
    r = allocsim.replay(snap, capacity="64MiB")
    assert r.oom.event == f"event {r.oom.event_index} (entry 14)"
    assert r.oom.stack == ["train.py:14 step", "main.py:3 <module>"]
    assert allocsim.replay(load_snapshot(), capacity="64MiB").oom.stack == []


@pytest.mark.parametrize(
    "path",
    [
        "examples/random_small.csv",
        "examples/rmm_log.csv",
        "examples/training_loop.yaml",
        "tests/data/torch/multistream.json",
        "tests/data/torch/multistream.pickle",
    ],
)
def test_every_trace_format_replays(path):
    """A path in any format the command line reads replays, with compare's numbers."""
    r = allocsim.replay(ROOT / path)
    [row] = allocsim.compare(ROOT / path, "caching")
    assert r.events > 0
    assert {k: r.to_dict()[k] for k in row} == row


def test_a_recorded_run_replays_on_its_own_device():
    """A run recorded on an H200 replays on it unless gpu_profile or capacity names
    another device (as `allocsim replay`)."""
    run = DATA / "unseen" / "moe_train.json"
    r = allocsim.replay(run)
    assert r.total_bytes == 150109880320
    assert r.oom is None
    assert allocsim.replay(run, gpu_profile="h100").total_bytes == 85017493504
