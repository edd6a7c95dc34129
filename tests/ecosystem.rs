//! Meeting users where they work (issue 11): RMM logs, named ids, pictures, PyTorch's
//! memory viewer, realistic generators, through the command line.

use crate::util::{allocsim, stderr, stdout, TempDir};

/// The one error line of a failed run and its exit code.
fn error_line(o: &std::process::Output) -> (i32, String) {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    (o.status.code().unwrap(), err.trim_end().to_string())
}

/// The bundled RMM log is detected by its header (it is named `.csv`, like a CSV
/// trace), replays, and the failure it recorded reproduces on a GPU as small as the
/// one it ran on.
#[test]
fn rmm_log_replays() {
    let o = allocsim(["replay", "examples/rmm_log.csv", "--policy", "arena"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("131 events, 69 allocations"), "{out}");
    assert!(out.contains("out of memory               none"), "{out}");
    let o = allocsim([
        "replay",
        "examples/rmm_log.csv",
        "--policy",
        "arena",
        "--capacity",
        "40GiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("out of memory       at event 108 (line 110)"),
        "{}",
        stdout(&o)
    );
}

/// A malformed RMM log is one line naming the file and the line, exit 2, whatever
/// its extension; `check` lists every bad line.
#[test]
fn malformed_rmm_log_exits_2() {
    let dir = TempDir::new("rmm-bad");
    let log = dir.file(
        "log.txt",
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,10:00:00.000001,allocate,0x10,512,0x0\n\
         1,10:00:00.000002,allocate,0x20,lots,0x0\n\
         1,10:00:00.000003,free,0x10,512\n",
    );
    let o = allocsim(["replay".as_ref(), log.as_os_str()]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert_eq!(
        line,
        format!(
            "error: {}: line 3: Size 'lots' is not a number of bytes (a decimal integer) \
             (and 1 more problem in this file); `allocsim check {}` lists them all",
            log.display(),
            log.display()
        )
    );
    let o = allocsim(["check".as_ref(), log.as_os_str()]);
    assert_eq!(o.status.code(), Some(2));
    let all = stdout(&o) + &stderr(&o);
    assert!(all.contains("line 3: Size 'lots'"), "{all}");
    assert!(all.contains("line 4: a line has 6 fields"), "{all}");
    // Forcing another format on it reads it as that format.
    let o = allocsim([
        "replay".as_ref(),
        log.as_os_str(),
        "--trace-format".as_ref(),
        "csv".as_ref(),
    ]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert!(
        line.contains("line 1: expected the header 'op,id,bytes,stream'"),
        "{line}"
    );
}

/// Named ids survive conversion both ways: an RMM log's pointers become the ids of
/// the YAML, and YAML -> CSV -> YAML gives back the same bytes.
#[test]
fn named_ids_convert_both_ways() {
    let dir = TempDir::new("named-ids");
    let yaml = dir.path().join("log.yaml");
    let o = allocsim([
        "convert".as_ref(),
        "examples/rmm_log.csv".as_ref(),
        "-o".as_ref(),
        yaml.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&yaml).unwrap();
    assert!(
        text.contains("  - {op: alloc, id: \"0x7f3a00000000\", bytes: 134217728, stream: 0}"),
        "{text}"
    );
    let csv = dir.path().join("log.csv");
    let back = dir.path().join("back.yaml");
    for (from, to) in [(&yaml, &csv), (&csv, &back)] {
        let o = allocsim([
            "convert".as_ref(),
            from.as_os_str(),
            "-o".as_ref(),
            to.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert!(std::fs::read_to_string(&csv)
        .unwrap()
        .contains("\nalloc,0x7f3a00000000,134217728,0\n"));
    // The name line differs (the trace is named after the file it was read from).
    let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&std::fs::read_to_string(&back).unwrap()), body(&text));
}

/// A hand-written trace with named ids replays, and a bad free names the id as
/// written.
#[test]
fn named_ids_in_messages() {
    let dir = TempDir::new("named-msg");
    let t = dir.file(
        "t.yaml",
        "events:\n  - {op: alloc, id: weights, bytes: 1GiB}\n  - {op: alloc, id: kv_cache_3, bytes: 20MiB}\n  - {op: free, id: kv_cache_3}\n  - {op: free, id: kv_cache_4}\n",
    );
    let o = allocsim(["replay".as_ref(), t.as_os_str()]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert_eq!(
        line,
        format!(
            "error: {}: event 3: free of unknown id kv_cache_4; --lenient replays it anyway",
            t.display()
        )
    );
    let o = allocsim(["replay".as_ref(), t.as_os_str(), "--lenient".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("peak requested          1.02 GiB"),
        "{}",
        stdout(&o)
    );
}
