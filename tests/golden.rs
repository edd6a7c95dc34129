//! Golden tests: `tests/data/traces/NAME.yaml` replayed under every policy, compared
//! with `tests/data/expected/NAME.csv` (rewrite with `UPDATE_EXPECT=1`), plus the
//! hand-checked facts each trace is there for, asserted independently of the CSVs.

use policies::caching::CachingDefaults;
use policies::spec::parse_policy_list;
use sim::{CompareInput, ReplayOptions, Row, SimDeviceOptions};

use crate::util::root;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn rows(name: &str) -> Vec<Row> {
    let path = root()
        .join("tests/data/traces")
        .join(format!("{name}.yaml"));
    let trace = workloads::read(&path, None).unwrap();
    // Every registered policy with its defaults: a new one fails here until its rows
    // are in the expected CSVs (UPDATE_EXPECT=1).
    let specs = parse_policy_list(
        &policies::registry::known_names(","),
        &CachingDefaults::default(),
    )
    .unwrap();
    let options = ReplayOptions {
        check_invariants: true,
        ..ReplayOptions::default()
    };
    let input = CompareInput {
        trace,
        hints: Default::default(),
    };
    let device = SimDeviceOptions::default();
    sim::compare(&[input], &specs, &[device], &options).unwrap()
}

/// Compares the CSV of `name` with its expected file (or rewrites it).
fn check(name: &str) -> Vec<Row> {
    let rows = rows(name);
    let mut csv = Vec::new();
    sim::report::write_compare_csv(&rows, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    let expected_path = root()
        .join("tests/data/expected")
        .join(format!("{name}.csv"));
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&expected_path, &csv).unwrap();
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_EXPECT=1 to create it)",
            expected_path.display()
        )
    });
    assert_eq!(
        csv,
        expected,
        "{name}: output differs from {} (UPDATE_EXPECT=1 rewrites it)",
        expected_path.display()
    );
    rows
}

fn row<'a>(rows: &'a [Row], policy: &str) -> &'a Row {
    rows.iter().find(|r| r.policy == policy).unwrap()
}

/// Every trace in tests/data/traces has an expected CSV and matches it.
#[test]
fn every_golden_trace_matches() {
    let mut names: Vec<String> = std::fs::read_dir(root().join("tests/data/traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        check(&name);
    }
}

/// a = 1 GiB; b = 1 GiB; free b; c = 1 GiB; c' = 1 GiB then free c; d; free d; e:
/// the caching allocator peaks at 3 GiB reserved (c' needs a third segment).
#[test]
fn seed000_caching_peaks_at_three_gib() {
    let r = rows("seed000");
    assert_eq!(row(&r, "caching").summary.reserved_bytes_peak, 3 * GIB);
    assert_eq!(row(&r, "immediate").summary.reserved_bytes_peak, 3 * GIB);
}

/// 1000 requests of 512 B fit one 2 MiB small-pool segment; the immediate policy is
/// charged two pages by the driver for its 1000 tiny cudaMallocs (packing model).
#[test]
fn thousand_small_requests() {
    let r = rows("small_1000x512");
    let caching = row(&r, "caching");
    assert_eq!(caching.summary.reserved_bytes_peak, 2 * MIB);
    assert_eq!(caching.summary.allocated_bytes_peak, 512_000);
    let immediate = row(&r, "immediate");
    assert_eq!(immediate.summary.reserved_bytes_peak, 512_000);
    assert_eq!(
        immediate.summary.charged_bytes_peak,
        2 * MIB,
        "512 000 B packed at 512 B in 2 MiB pages: one page"
    );
}

/// A 1 GiB + 1 B request gives the buddy policy a 2 GiB block (its own segment).
#[test]
fn buddy_rounds_to_a_power_of_two() {
    let r = rows("one_gib_plus_one");
    let buddy = row(&r, "buddy");
    assert_eq!(buddy.summary.allocated_bytes_peak, 2 * GIB);
    assert_eq!(buddy.summary.reserved_bytes_peak, 2 * GIB);
    let caching = row(&r, "caching");
    assert_eq!(
        caching.summary.allocated_bytes_peak,
        GIB + 512,
        "rounded to 512 B"
    );
    assert_eq!(
        caching.summary.reserved_bytes_peak,
        GIB + 2 * MIB,
        "segment rounded to 2 MiB"
    );
}

/// Pool boundaries: 1 MiB is small (2 MiB segment); 1 MiB + 1 B is large (20 MiB
/// segment); a remainder of at most 1 MiB is never split off a large block; 10 MiB gets
/// a segment of exactly 10 MiB.
#[test]
fn pool_boundaries() {
    let r = rows("pool_boundaries");
    let caching = row(&r, "caching");
    // 2 (small) + 20 (1 MiB + 512 and the 18 MiB request) + 20 (19 MiB) + 10.
    assert_eq!(caching.summary.reserved_bytes_peak, 52 * MIB);
    // 1 + 20 (1 MiB + 512, and the rest of the segment whole) + 20 (19 MiB unsplit) + 10.
    assert_eq!(caching.summary.allocated_bytes_peak, 51 * MIB);
}

/// A block freed on one stream is not reused by another: two streams each hold a segment.
#[test]
fn streams_do_not_share_cache() {
    let r = rows("two_streams");
    assert_eq!(row(&r, "caching").summary.reserved_bytes_peak, 2 * 64 * MIB);
}

/// empty_cache gives back only wholly free segments.
#[test]
fn empty_cache_keeps_split_segments() {
    let r = rows("empty_cache");
    let caching = row(&r, "caching");
    assert_eq!(caching.summary.reserved_bytes_peak, 40 * MIB);
    assert_eq!(
        caching.summary.device_free_count, 1,
        "only the wholly free 20 MiB segment"
    );
}
