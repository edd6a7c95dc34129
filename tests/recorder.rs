//! The JSON of the project's recorder, `tools/record_torch.py`, is a recorded run.
//! `tests/data/recorder/fake_pools.json` is its output on the fake `torch` of
//! `tools/tests` (regenerated there with `UPDATE_EXPECT=1`): two graph captures, a
//! MemPool phase, pool releases, with the format's newer fields.

use workloads::Event;

use crate::util::{allocsim, root, stderr};

/// The reader takes the recorder's JSON (pool windows, request pools and the other
/// newer fields are extra keys it ignores): the same entries, checkpoints and
/// requests as the file holds, and `allocsim check` accepts it.
#[test]
fn recorder_json_reads_as_a_recorded_run() {
    let path = root().join("tests/data/recorder/fake_pools.json");
    let run = workloads::read_recorded_json(&path).unwrap();
    assert_eq!(run.meta.workload.as_deref(), Some("fake_pools"));
    assert_eq!(run.entries.len(), 61);
    let labels: Vec<_> = run.checkpoints.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        ["setup", "captured1", "captured4", "mempool", "end", "final"]
    );
    assert_eq!(run.segments.len(), 1);
    let trace = run.to_trace().unwrap();
    let allocs = trace
        .events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let empty_caches = trace
        .events
        .iter()
        .filter(|e| matches!(e, Event::EmptyCache))
        .count();
    assert_eq!((allocs, empty_caches), (9, 3));
    let o = allocsim(["check".as_ref(), path.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
