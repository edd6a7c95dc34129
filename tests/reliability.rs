//! Hostile and absurd inputs: recorded addresses that steer nothing but the caching
//! policy, devices of absurd size, injected driver faults. `docs/reliability.md` lists
//! what each guards against.

use std::path::Path;

use policies::spec::parse_policy_list;
use sim::{compare, CompareInput, ReplayOptions, SimDeviceOptions};

use crate::util::{allocsim, root, stderr, stdout, TempDir};

/// The recorded run read with its address hints, as the CLI loads it.
fn recorded_input(path: &Path) -> CompareInput {
    let (trace, run) = workloads::read_source(path, None, 0).unwrap();
    let run = run.expect("a recorded run");
    let hints = sim::recorded::address_hints(&run, 80 << 30).unwrap();
    CompareInput { trace, hints }
}

/// The same requests converted to CSV: no addresses at all.
fn csv_input(input: &CompareInput, dir: &TempDir) -> CompareInput {
    let path = dir.path().join(format!("{}.csv", input.trace.name));
    let mut out = Vec::new();
    workloads::write_csv(&input.trace, &mut out).unwrap();
    std::fs::write(&path, out).unwrap();
    CompareInput {
        trace: workloads::read(&path, None).unwrap(),
        hints: sim::AddressHints::default(),
    }
}

/// Immediate, buddy and arena predict the same on a recorded run as on its conversion
/// to CSV: recorded PyTorch addresses (here an expandable run's, whose range lies at
/// 12 GiB, below which the simulated arena used to run out of address space) steer only
/// the caching policy.
#[test]
fn only_the_caching_policy_follows_recorded_addresses() {
    let dir = TempDir::new("hints-csv");
    let specs = parse_policy_list("immediate,buddy,arena", &Default::default()).unwrap();
    for name in [
        "tests/data/oracle/h100-torch2.11/random_stress__expandable_segments-True.json",
        "tests/data/oracle/h100-torch2.11/gpt_train_small.json",
        "tests/data/recorded/mlp_train__expandable_segments-True.json",
    ] {
        let recorded = recorded_input(&root().join(name));
        let converted = csv_input(&recorded, &dir);
        let devices: Vec<SimDeviceOptions> = [80u64 << 30, 6 << 30, 3 << 30]
            .into_iter()
            .map(|c| SimDeviceOptions::default().with_total(c).unwrap())
            .collect();
        let options = ReplayOptions {
            check_invariants: true,
            ..ReplayOptions::default()
        };
        let a = compare(&[recorded], &specs, &devices, &options).unwrap();
        let b = compare(&[converted], &specs, &devices, &options).unwrap();
        assert_eq!(a.len(), 9);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (&x.policy, x.capacity_bytes, &x.summary, &x.oom),
                (&y.policy, y.capacity_bytes, &y.summary, &y.oom),
                "{name}"
            );
        }
    }
}

/// The caching policy still follows them: the recorded run replays exactly as recorded
/// (the oracle suite holds every run to this; one here ties the two together).
#[test]
fn the_caching_policy_follows_recorded_addresses() {
    let path = root().join("tests/data/oracle/h100-torch2.11/gpt_train_small.json");
    let input = recorded_input(&path);
    let spec = parse_policy_list("caching", &Default::default()).unwrap();
    let hinted = input.hints.for_policy(&spec[0].config);
    assert_eq!(hinted, input.hints);
    assert!(!hinted.segments.is_empty());
}

/// A recorded segment address near 0 (one `segment_alloc` set to 1 in a real recording)
/// is refused on one line naming the file and the entry, exit 2, in `replay` and
/// `compare`, under every policy, never a panic.
#[test]
fn damaged_recorded_addresses_exit_2() {
    let dir = TempDir::new("hints-damaged");
    let src = root().join("tests/data/oracle/h100-torch2.11/gpt_train_small.json");
    let text = std::fs::read_to_string(src).unwrap();
    let first = text
        .find("[\"segment_alloc\", ")
        .expect("a segment_alloc entry");
    let addr_start = first + "[\"segment_alloc\", ".len();
    let addr_end = addr_start + text[addr_start..].find(',').unwrap();
    let damaged = format!("{}1{}", &text[..addr_start], &text[addr_end..]);
    let path = dir.file("damaged.json", &damaged);
    for args in [
        vec!["replay", "--policy", "arena"],
        vec!["replay", "--policy", "buddy"],
        vec!["compare", "--policies", "caching,immediate"],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        args.push(path.as_os_str());
        let o = allocsim(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("damaged.json: entry ") && err.contains("address 0x1 of"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// Expandable segments on absurd devices: a total of 2^53 (with every invariant
/// checked after every event) and a capacity of 2^59 replay as on an 80 GiB device; a
/// total of 2^63 (two pools' ranges of 1 1/8 of it each cannot both be addressed) or of
/// u64::MAX stops with the driver's error on one line instead of wrapping, as PyTorch
/// stops when cuMemAddressReserve fails.
#[test]
fn expandable_segments_on_absurd_devices() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "compare",
            "examples/training_loop.yaml",
            "--policies",
            "caching:expandable_segments=True",
            "--check-invariants",
        ];
        args.extend_from_slice(extra);
        allocsim(&args)
    };
    let peak = |o: &std::process::Output| -> String {
        let out = stdout(o);
        let row = out.lines().nth(1).expect("a row").to_string();
        // Everything but the capacity and total columns (`capacity_bytes`, 3rd, and
        // `total_bytes`, 21st).
        let cols: Vec<&str> = row.split(',').collect();
        format!(
            "{}|{}|{}",
            cols[..2].join(","),
            cols[3..20].join(","),
            cols[21..].join(",")
        )
    };
    let base = run(&[]);
    assert!(base.status.success(), "{}", stderr(&base));
    for extra in [
        &["--total-bytes", "9007199254740992"][..],
        &["--capacity", "576460752303423488"][..],
    ] {
        let o = run(extra);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        assert_eq!(peak(&o), peak(&base), "{extra:?}");
    }
    for total in ["9223372036854775808", "18446744073709551615"] {
        let o = run(&["--total-bytes", total]);
        let err = stderr(&o);
        assert_ne!(o.status.code(), Some(101), "{err}");
        assert!(!o.status.success());
        assert!(err.contains("cuMemAddressReserve"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
