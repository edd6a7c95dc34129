//! A trace that starts mid-run replayed on a device below its starting state: an
//! out-of-memory before the first event, a result in every command, never an error
//! that stops a batch.

use crate::util::{allocsim, stderr, stdout, TempDir};

/// A ring buffer that wrapped: 40 segments of 1.29 GiB (1388314624 bytes) at its
/// first entry.
const WRAPPED: &str = "tests/data/unseen/midrun/resnet_train__wrap3000.json";
/// A late start: 4 segments of 44 MiB at its first entry.
const LATE: &str = "tests/data/unseen/midrun/unet_train__late.json";

/// The value of `column` in CSV `row` of `text` (split on commas: the rows tested
/// have no quoted fields).
fn field(text: &str, row: usize, column: &str) -> String {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header.iter().position(|c| *c == column).unwrap();
    lines
        .nth(row)
        .unwrap()
        .split(',')
        .nth(at)
        .unwrap()
        .to_string()
}

/// `replay` on a device below the starting state: exit 0, the out-of-memory placed
/// before the first event with what did not fit, no event replayed, and why: no
/// setting shrinks a state already held, a larger GPU or an earlier start can.
#[test]
fn replay_reports_an_oom_before_the_first_event() {
    let o = allocsim(["replay", WRAPPED, "--capacity", "1200MiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        "out of memory       before the first event: the starting state of 40 segment(s) / \
         1.29 GiB (1388314624 bytes) does not fit a device with 1.17 GiB (1258291200 bytes) \
         usable: ",
        "events replayed                0  of 1933",
        "why it ran out      starting state: the trace starts mid-run, and the starting state",
        "no allocator setting shrinks memory the program already held when the trace's window \
         began, so none is tried: a larger GPU (`allocsim fit` finds the smallest)",
    ] {
        assert!(out.contains(line), "{line}\n{out}");
    }
    assert!(!out.contains("policy says"), "{out}");
}

/// `compare` over capacities below and above the starting states: the batch goes on
/// (every row there), the short row's CSV leaves `oom_event_index` empty with
/// `oom_requested_bytes` the state's bytes and cause `starting state`, and the table
/// says "before the first event" with the reason below it.
#[test]
fn compare_goes_on_past_a_starting_state_that_does_not_fit() {
    let args = [
        "compare",
        WRAPPED,
        LATE,
        "--policies",
        "caching,buddy",
        "--capacity",
        "1200MiB,80GiB",
    ];
    let o = allocsim(args.iter().chain(&["--format", "csv"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 1 + 8, "{text}");
    // Row 0: the wrapped trace under caching on 1200 MiB.
    assert_eq!(field(&text, 0, "oom_event_index"), "");
    assert_eq!(field(&text, 0, "oom_requested_bytes"), "1388314624");
    assert_eq!(field(&text, 0, "oom_cause"), "starting state");
    assert_eq!(field(&text, 0, "oom_fix"), "");
    assert_eq!(field(&text, 0, "events_replayed"), "0");
    // The rows after it ran: caching on 80 GiB to the end, buddy on 1200 MiB to an
    // out-of-memory at an event.
    assert_eq!(field(&text, 1, "oom_requested_bytes"), "");
    assert_eq!(field(&text, 1, "events_replayed"), "1933");
    assert_eq!(field(&text, 2, "oom_event_index"), "71");
    let o = allocsim(args.iter().chain(&["--format", "table"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains("before the first event: 1.29 GiB (starting state)"),
        "{table}"
    );
    assert!(
        table.contains(
            "before the first event: resnet_train__wrap3000 under caching on 1.17 GiB: \
             starting state: the trace starts mid-run, and the starting state of 40 segment(s)"
        ),
        "{table}"
    );
}

/// `sweep` over a capacity below the starting state: the rows that cannot hold it run
/// out before the first event (unranked, `starting state`), the sweep goes on and
/// recommends a row that fits.
#[test]
fn sweep_goes_on_past_a_starting_state_that_does_not_fit() {
    let dir = TempDir::new("sweep-start-oom");
    let root = crate::util::root();
    let sweep = dir.file(
        "sweep.yaml",
        &format!(
            "traces: [{}]\npolicies: [caching]\ncapacities: [1200MiB, 80GiB]\n",
            root.join(WRAPPED).display()
        ),
    );
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "--format".as_ref(),
        "csv".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert_eq!(field(&text, 0, "device"), "1200MiB");
    assert_eq!(field(&text, 0, "oom_event_index"), "");
    assert_eq!(field(&text, 0, "oom_requested_bytes"), "1388314624");
    assert_eq!(field(&text, 0, "oom_cause"), "starting state");
    assert_eq!(field(&text, 0, "rank"), "");
    assert_eq!(field(&text, 1, "rank"), "1");
    assert_eq!(field(&text, 1, "recommended"), "true");
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "--format".as_ref(),
        "table".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("before the first event (starting state)"),
        "{}",
        stdout(&o)
    );
}

/// `diff` with a side that cannot hold the starting state compares nothing event by
/// event and says why (no CSV rows); `export` has nothing to write and says so in one
/// line (exit 2), leaving no file.
#[test]
fn diff_and_export_say_there_is_nothing_to_compare_or_write() {
    let o = allocsim([
        "diff",
        WRAPPED,
        "--policies",
        "caching,buddy",
        "--capacity",
        "1200MiB",
        "--format",
        "table",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "compared            nothing, event by event: a (caching) runs out of memory before \
             the first event: the starting state of 40 segment(s)"
        ),
        "{}",
        stdout(&o)
    );
    let o = allocsim([
        "diff",
        WRAPPED,
        "--policies",
        "caching,buddy",
        "--capacity",
        "1200MiB",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    let dir = TempDir::new("export-start-oom");
    let out = dir.path().join("x.pickle");
    let o = allocsim([
        "export".as_ref(),
        WRAPPED.as_ref(),
        "--capacity".as_ref(),
        "1200MiB".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "nothing to export: under caching the replay runs out of memory before the first event"
        ),
        "{err}"
    );
    assert!(!out.exists());
}

/// `compare`'s summary across two traces shows each quantity's range, said to be one,
/// not Student's t interval of two values (which reached −4.55 GiB of reserved peak
/// and a utilization of 156.5 % here); from five traces, the interval cut to what the
/// quantity can take (no negative bytes).
#[test]
fn across_few_traces_the_range_is_shown_not_the_interval() {
    let o = allocsim([
        "compare",
        WRAPPED,
        LATE,
        "--policies",
        "caching",
        "--format",
        "table",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "reserved peak    1.79 GiB    1.79 GiB    2.29 GiB      range 1.29 GiB to 2.29 GiB"
        ),
        "{text}"
    );
    assert!(
        text.contains("range: fewer than 5 rows ran to the end"),
        "{text}"
    );
    // No bound below zero.
    let negative = |t: &str| {
        t.as_bytes()
            .windows(2)
            .any(|w| w[0] == b'-' && w[1].is_ascii_digit())
    };
    assert!(!negative(&text), "{text}");
    let mut args = vec!["compare"];
    let all: Vec<String> = std::fs::read_dir(crate::util::root().join("tests/data/unseen/midrun"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".json"))
        .collect();
    args.extend(all.iter().map(String::as_str));
    // One device for all six (recorded on an H100 and an H200, each would run on its own
    // and the table would group them apart).
    args.extend([
        "--policies",
        "caching",
        "--format",
        "table",
        "--capacity",
        "80GiB",
    ]);
    let o = allocsim(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("across the 6 traces"), "{text}");
    assert!(!negative(&text), "{text}");
    assert!(
        text.contains("overhead       680.89 MiB  445.87 MiB  2.20 GiB       0 B to 1.46 GiB"),
        "{text}"
    );
    assert!(!text.contains("range"), "{text}");
}

/// `diff` of a mid-run trace between a policy that takes the starting state over
/// (caching: 44 MiB) and one that allocates its live blocks (buddy: a 1 GiB pool)
/// says the two parted before the first event, and no event is charged with the
/// starting states' difference: the first CSV row is an event where a side called
/// the device, its change what that event did, the gap before it the starting one.
#[test]
fn diff_counts_the_starting_states_difference_before_the_first_event() {
    let o = allocsim([
        "diff",
        LATE,
        "--policies",
        "caching,buddy",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    // Event 0 (no device call on either side) is no row; event 2's 20 MiB segment is.
    assert_eq!(field(&text, 0, "event_index"), "2", "{text}");
    assert_eq!(field(&text, 0, "change_bytes"), "-20971520", "{text}");
    assert_eq!(field(&text, 0, "gap_bytes"), "1006632960", "{text}");
    let o = allocsim([
        "diff",
        LATE,
        "--policies",
        "caching,buddy",
        "--format",
        "table",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains(
            "parted at           before the first event: the starting state takes 44.00 MiB \
             under a, 1.00 GiB under b"
        ),
        "{table}"
    );
    // The events listed add up to the gap at the peak less the starting one.
    assert!(
        table.contains("holds 298.00 MiB more than b: 980.00 MiB less before the first event"),
        "{table}"
    );
}
