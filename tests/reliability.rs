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

/// Every registered policy but the caching one predicts the same on a recorded run as
/// on its conversion to CSV: recorded PyTorch addresses (here expandable runs', whose
/// range lies at 12 GiB, below which the simulated arena used to run out of address
/// space, among them the U-Net shape of issue 14) steer only the caching policy.
#[test]
fn only_the_caching_policy_follows_recorded_addresses() {
    let dir = TempDir::new("hints-csv");
    let others: Vec<&str> = policies::POLICIES
        .iter()
        .map(|e| e.name)
        .filter(|&n| n != "caching")
        .collect();
    assert!(others.len() >= 3, "{others:?}");
    let specs = parse_policy_list(&others.join(","), &Default::default()).unwrap();
    for name in [
        "tests/data/oracle/h100-torch2.11/random_stress__expandable_segments-True.json",
        "tests/data/oracle/h100-torch2.11/gpt_train_small.json",
        "tests/data/recorded/mlp_train__expandable_segments-True.json",
        "tests/data/unseen/unet_train__expandable_segments-True__cap1642M.json",
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
        assert_eq!(a.len(), 3 * others.len());
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
    let every = policies::testing::every_policy();
    let list = policies::testing::every_policy_list();
    let replays = every
        .iter()
        .map(|s| vec!["replay", "--policy", s.label.as_str()]);
    for args in replays.chain([vec!["compare", "--policies", list.as_str()]]) {
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
        assert_eq!(o.status.code(), Some(4), "a driver failure: {err}");
        assert!(err.contains("cuMemAddressReserve"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

// ---- faults and absurd capacities: every policy ----------------------------------------

use policies::{Allocation, Device, DeviceError, Policy, PolicyConfig, Request, StreamId};
use sim::{FaultKind, FaultOp, FaultPlan, FaultyDevice, SimDevice};

/// Every policy of the tests' one list (`policies::testing::every_policy`): each
/// registered policy with its defaults, and the caching policy with expandable segments
/// (the only user of virtual memory).
fn every_policy() -> Vec<(String, PolicyConfig)> {
    policies::testing::every_policy()
        .into_iter()
        .map(|s| (s.label, s.config))
        .collect()
}

/// One step of a hand-driven workload.
#[derive(Clone, Debug)]
enum Op {
    Alloc(u64, u64),
    /// Frees the live allocation at this index (modulo the live count).
    Free(usize),
    EmptyCache,
}

/// Checks a policy against its device: invariants, and reserved bytes equal.
fn check(policy: &dyn Policy, device: &dyn Device, what: &str) {
    policy.check_invariants();
    let (p, d) = (policy.stats(), device.stats());
    assert_eq!(p.reserved_bytes, d.reserved_bytes, "{what}: reserved bytes");
    assert!(
        p.allocated_bytes <= p.reserved_bytes,
        "{what}: allocated above reserved"
    );
    assert!(
        d.charged_bytes <= d.capacity_bytes,
        "{what}: charged above capacity"
    );
}

/// Runs `ops` on `policy`, checking after each step; stops at the first error other than
/// out of memory and returns it, with the allocations still live.
fn drive(
    policy: &mut dyn Policy,
    device: &mut dyn Device,
    ops: &[Op],
    what: &str,
) -> (Vec<Allocation>, Option<DeviceError>) {
    let mut live = Vec::new();
    for op in ops {
        let result = match *op {
            Op::Alloc(size, stream) => match policy.allocate(
                device,
                Request {
                    size_bytes: size,
                    stream: StreamId(stream),
                },
            ) {
                Ok(a) => {
                    assert!(
                        a.addr.0.checked_add(a.block_bytes).is_some(),
                        "{what}: a block wraps the address space"
                    );
                    live.push(a);
                    Ok(())
                }
                Err(policies::AllocError::Device(e)) => Err(e),
                Err(_) => Ok(()),
            },
            Op::Free(i) if !live.is_empty() => {
                let a = live.swap_remove(i % live.len());
                policy.free(device, &a)
            }
            Op::Free(_) => Ok(()),
            Op::EmptyCache => policy.empty_cache(device),
        };
        check(policy, device, what);
        if let Err(e) = result {
            return (live, Some(e));
        }
    }
    (live, None)
}

/// Frees everything and empties the cache: the device must then hold no memory
/// (expandable segments may keep an address range that was never mapped, as PyTorch
/// does: it costs nothing).
fn free_everything(
    policy: &mut dyn Policy,
    device: &mut dyn Device,
    live: Vec<Allocation>,
    what: &str,
) {
    for a in live {
        policy.free(device, &a).unwrap();
    }
    policy.empty_cache(device).unwrap();
    check(policy, device, what);
    let (p, d) = (policy.stats(), device.stats());
    assert_eq!((p.allocated_bytes, p.reserved_bytes), (0, 0), "{what}");
    assert_eq!((d.reserved_bytes, d.charged_bytes), (0, 0), "{what}");
}

/// A workload of `n` steps from the generator: mixed sizes, two streams, frees and
/// empty_cache calls.
fn workload(seed: u64, n: u64) -> Vec<Op> {
    let trace = workloads::random(&workloads::RandomOptions {
        seed,
        events: n,
        streams: 2,
        ..workloads::RandomOptions::default()
    })
    .unwrap();
    let mut ids = std::collections::HashMap::new();
    let mut ops = Vec::new();
    for (i, e) in trace.events.iter().enumerate() {
        match e {
            workloads::Event::Alloc {
                id,
                size_bytes,
                stream,
            } => {
                ids.insert(*id, ids.len());
                ops.push(Op::Alloc(*size_bytes, *stream));
            }
            workloads::Event::Free { id } => ops.push(Op::Free(ids[id])),
            _ => {}
        }
        if i % 97 == 96 {
            ops.push(Op::EmptyCache);
        }
    }
    ops
}

/// Driver failures (out of memory, invalid value, launch failure) injected at chosen
/// calls of each acquiring operation and at random ones: every policy passes a failure
/// other than out of memory on as an error, keeps its invariants and its stats equal to
/// the device's, and once the driver recovers frees everything; through the engine the
/// failure is a `ReplayError::Device` (exit 4 in the CLI), an injected out-of-memory of
/// cuMemAlloc an OOM result.
#[test]
fn every_policy_survives_driver_faults() {
    let ops = workload(7, 400);
    let mut plans: Vec<FaultPlan> = Vec::new();
    for op in FaultOp::ALL {
        for kind in FaultKind::ALL {
            for nth in [1, 2, 5] {
                plans.push(FaultPlan::At(vec![(op, nth, kind)]));
            }
        }
    }
    for seed in 1..=12 {
        plans.push(FaultPlan::Random { seed, one_in: 4 });
    }
    for (label, config) in every_policy() {
        let mut failures = 0;
        for plan in &plans {
            let what = format!("{label} under {plan:?}");
            let mut policy = config.build().unwrap();
            let sim = SimDevice::new(SimDeviceOptions::default().with_capacity(8 << 30));
            let mut device = FaultyDevice::new(sim, plan.clone());
            let (live, error) = drive(policy.as_mut(), &mut device, &ops, &what);
            if let Some(e) = error {
                failures += 1;
                assert!(
                    matches!(e, DeviceError::Driver { .. }),
                    "{what}: {e:?} is not a driver error"
                );
                assert!(
                    device.injected().iter().any(|(_, _, inj)| *inj == e),
                    "{what}: {e:?} was not injected"
                );
            }
            device.heal();
            free_everything(policy.as_mut(), &mut device, live, &what);
        }
        assert!(failures > 0, "{label}: no fault reached the policy");
    }
    // Through the engine: an error, not a result, with the driver's code.
    let trace = workloads::Trace::new(
        "t",
        vec![workloads::Event::Alloc {
            id: workloads::AllocId(1),
            size_bytes: 1 << 20,
            stream: 0,
        }],
    );
    for (label, config) in every_policy() {
        let mut policy = config.build().unwrap();
        let op = if label.contains("expandable") {
            FaultOp::CreatePhysical
        } else {
            FaultOp::AllocateSegment
        };
        let mut device = FaultyDevice::new(
            SimDevice::new(SimDeviceOptions::default()),
            FaultPlan::At(vec![(op, 1, FaultKind::LaunchFailure)]),
        );
        match sim::replay(
            &trace,
            policy.as_mut(),
            &mut device,
            &ReplayOptions::default(),
        ) {
            Err(sim::ReplayError::Device {
                event_index: 0,
                error: DeviceError::Driver { code: 719, .. },
            }) => {}
            other => panic!("{label}: {other:?}"),
        }
        let mut policy = config.build().unwrap();
        let mut device = FaultyDevice::new(
            SimDevice::new(SimDeviceOptions::default()),
            FaultPlan::At(vec![(op, 1, FaultKind::OutOfMemory)]),
        );
        let r = sim::replay(
            &trace,
            policy.as_mut(),
            &mut device,
            &ReplayOptions::default(),
        );
        // A result, never an error: the policies that retry (caching, buddy, arena)
        // succeed on the second call; immediate, which does not, reports the OOM.
        let r = r.unwrap_or_else(|e| panic!("{label}: {e}"));
        if label == "immediate" {
            assert!(r.oom.is_some(), "{label}: an injected OOM is an OOM result");
        }
    }
}

mod absurd {
    use super::*;
    use proptest::prelude::*;

    /// Sizes from one byte to past the largest request, most of them small.
    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            8 => 1u64..(64 << 20),
            2 => (1u64 << 20)..(1u64 << 36),
            1 => prop::sample::select(vec![
                (1u64 << 40) + 1,
                (1 << 60) - 1,
                1 << 60,
                u64::MAX,
                u64::MAX - 255,
            ]),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (size(), 0u64..3).prop_map(|(s, t)| Op::Alloc(s, t)),
            4 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::EmptyCache),
        ]
    }

    fn capacity() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            0u64..(1 << 30),
            0u64..=(1u64 << 63),
            prop::sample::select(vec![1u64 << 63, (1 << 63) - 1, 1 << 62, 1 << 59, 2 << 20]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Every policy survives any interleaving of requests (1 byte to u64::MAX),
        /// frees and empty_cache on a device of any capacity from 0 to 2^63: no panic,
        /// no wrap (every invariant checked after every step), and everything freed at
        /// the end.
        #[test]
        fn every_policy_on_any_capacity(
            capacity in capacity(),
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            for (label, config) in every_policy() {
                let what = format!("{label} at capacity {capacity}");
                let mut policy = config.build().unwrap();
                let mut device = SimDevice::new(SimDeviceOptions::default().with_capacity(capacity));
                let (live, error) = drive(policy.as_mut(), &mut device, &ops, &what);
                if let Some(e) = error {
                    // Only expandable segments may stop, when the 64-bit address space
                    // cannot hold one more range of 1 1/8 of a total of 2^60 or more
                    // (one per stream and pool), as PyTorch stops when
                    // cuMemAddressReserve fails.
                    let reserve = matches!(
                        &e,
                        DeviceError::Driver { code: 2, message } if message.contains("cuMemAddressReserve")
                    );
                    prop_assert!(
                        label.contains("expandable") && capacity >= 1 << 60 && reserve,
                        "{}: {:?}", what, e
                    );
                }
                free_everything(policy.as_mut(), &mut device, live, &what);
            }
        }
    }
}

/// Inputs the fuzz targets (`fuzz/`, docs/reliability.md) found failing, each checked
/// here with the target's own property.
mod fuzz_findings {
    /// A policy list parses, prints and parses back to the same configurations (the
    /// `policies` target).
    fn round_trips(text: &str) {
        let defaults = Default::default();
        for spec in policies::spec::parse_policy_list(text, &defaults).unwrap() {
            let printed = spec.config.to_string();
            let again = policies::spec::parse_policy(&printed, &defaults)
                .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
            assert_eq!(again.config, spec.config, "{printed:?}");
        }
    }

    /// `cap=0GiB` printed as `cap=0`, which the strict device-memory reader refuses
    /// (a unitless size below 1 MiB): a small cap is printed with its unit.
    #[test]
    fn small_caps_print_with_their_unit() {
        round_trips("caching:roundup_power2_divisions=[256:1,512:2,>:8],cap=0GiB");
        round_trips("caching:cap=512B,immediate");
        round_trips("caching:cap=1048575B");
    }
}

/// Every policy but the caching one decides the same wherever the device places its
/// segments (RMM's arena orders by place inside its own upstream block, so a growing
/// arena orders chunks by when it got them; the buddy policy orders its segments the
/// same way): top-down, bottom-up and scrambled placements give the same reserved peak,
/// OOM event and allocations, near the capacity limit too. Ordering chunks by device
/// address made a U-Net run at 14 GiB run out of memory in simulation and not on the
/// GPU, whose placement differs; the buddy policy took the lowest address of any
/// segment, and so differed between placements too. The caching policy is PyTorch's,
/// which does order by address (recorded addresses steer it, see above).
#[test]
fn decisions_do_not_depend_on_segment_placement() {
    let trace = workloads::random(&workloads::RandomOptions {
        seed: 5,
        events: 3000,
        streams: 2,
        sizes: workloads::SizeDistribution::LogUniform {
            min_bytes: 256,
            max_bytes: 1200 << 20,
        },
        mean_lifetime_events: 40.0,
        ..workloads::RandomOptions::default()
    })
    .unwrap();
    let gib = 1u64 << 30;
    let options = ReplayOptions {
        check_invariants: true,
        continue_after_oom: true,
        ..ReplayOptions::default()
    };
    for entry in policies::POLICIES.iter().filter(|e| e.name != "caching") {
        for capacity in [80 * gib, 12 * gib, 9 * gib, 7 * gib] {
            let mut results = Vec::new();
            for placement in 0..3 {
                let mut device = SimDeviceOptions::default().with_capacity(capacity);
                let hints = match placement {
                    0 => sim::AddressHints::default(),
                    1 => {
                        device.address_model = sim::AddressModel::BottomUp;
                        sim::AddressHints::default()
                    }
                    _ => {
                        // The first segments (1 GiB each) at scrambled addresses.
                        let order = [5u64, 1, 7, 3, 0, 6, 2, 4];
                        sim::AddressHints {
                            segments: order
                                .iter()
                                .map(|&k| (gib, 0x7e00_0000_0000 + k * 4 * gib))
                                .collect(),
                            ranges: Default::default(),
                        }
                    }
                };
                let mut policy = entry.default_config().build().unwrap();
                let mut dev = SimDevice::with_hints(device, hints);
                let r = sim::replay(&trace, policy.as_mut(), &mut dev, &options).unwrap();
                results.push((r.summary, r.oom.map(|o| o.event_index), r.oom_count));
            }
            let name = entry.name;
            assert_eq!(
                results[0], results[1],
                "{name}: top-down vs bottom-up at {capacity}"
            );
            assert_eq!(
                results[0], results[2],
                "{name}: top-down vs scrambled at {capacity}"
            );
        }
    }
}

// ---- the binary on a mock driver ---------------------------------------------------------

/// The mock libcuda of gpu-backend's tests (`gpu-backend/tests/mock/mock_libcuda.c`, a
/// 16 GiB card unless `MOCK_TOTAL_BYTES` says otherwise) compiled into a folder of its
/// own, to put on the binary's loader path; `None` without a C compiler (said on stderr;
/// a failure under `ALLOCSIM_REQUIRE_MOCK=1`, as in gpu-backend).
fn mock_libcuda() -> Option<std::path::PathBuf> {
    static BUILT: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-mock-libcuda");
            std::fs::create_dir_all(&dir).unwrap();
            let source = root().join("gpu-backend/tests/mock/mock_libcuda.c");
            let tmp = dir.join(format!("libcuda.so.{}.tmp", std::process::id()));
            let compilers = match std::env::var_os("CC").filter(|cc| !cc.is_empty()) {
                Some(cc) => vec![cc],
                None => ["cc", "gcc", "clang"].map(Into::into).to_vec(),
            };
            for cc in compilers {
                match std::process::Command::new(&cc)
                    .args(["-shared", "-fPIC", "-O1", "-o"])
                    .arg(&tmp)
                    .arg(&source)
                    .status()
                {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => panic!("running {cc:?}: {e}"),
                    Ok(s) => {
                        assert!(s.success(), "{cc:?} failed to build the mock ({s})");
                        std::fs::rename(&tmp, dir.join("libcuda.so")).unwrap();
                        return Some(dir);
                    }
                }
            }
            assert!(
                std::env::var("ALLOCSIM_REQUIRE_MOCK").as_deref() != Ok("1"),
                "ALLOCSIM_REQUIRE_MOCK=1 but no C compiler builds the mock libcuda"
            );
            eprintln!("skipped: the binary on the mock libcuda: no C compiler");
            None
        })
        .clone()
}

/// The mock's report at exit when nothing is left allocated.
const CLEAN_MOCK: &str =
    "mock_libcuda report: used_bytes=0 allocs=0 handles=0 mappings=0 ranges=0 ctx_refs=0";

/// Runs the binary with the mock libcuda first on its loader path and `envs` set (the
/// mock's other variables cleared).
fn allocsim_on_mock(mock: &Path, args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_allocsim"));
    let path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) => {
            let mut p = mock.as_os_str().to_owned();
            p.push(":");
            p.push(old);
            p
        }
        None => mock.as_os_str().to_owned(),
    };
    cmd.args(args)
        .current_dir(root())
        .env("LD_LIBRARY_PATH", path);
    for var in [
        "MOCK_MODE",
        "MOCK_TOTAL_BYTES",
        "MOCK_CONTEXT_BYTES",
        "MOCK_MAX_ALLOC_BYTES",
        "MOCK_ALLOC_OVERHEAD_BYTES",
        "MOCK_FAIL",
        "MOCK_LOG",
        "MOCK_FAULT_EVERY",
        "MOCK_FAULT_SEED",
        "MOCK_FAULT_CODE",
        "MOCK_HOLD_BACK_BYTES",
        "MOCK_HOLD_BACK_COUNTER",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(envs.iter().copied());
    cmd.output().expect("run allocsim")
}

/// `validate --capacity` is the free memory the ballast leaves, so a capacity below a
/// profile's context and driver reserve is a run, not an error (`--gpu-profile h200
/// --capacity 512MiB` was refused as "not above the 529.94 MiB the CUDA context and the
/// driver keep"); each capacity gives a row, and nothing is left allocated.
#[test]
fn validate_runs_any_capacity_with_a_profile() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("validate-mock");
    let csv = dir.path().join("v.csv");
    let o = allocsim_on_mock(
        &mock,
        &[
            "validate",
            "examples/training_loop.yaml",
            "--policies",
            "caching,immediate",
            "--gpu-profile",
            "h200",
            "--capacity",
            "512MiB,4GiB",
            "-o",
            csv.to_str().unwrap(),
        ],
        &[],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains(CLEAN_MOCK), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{text}");
    assert!(rows[0].starts_with("training_loop,caching,5"), "{text}");
}

/// `probe --processes 3` fills the device in three processes and writes the spread of
/// what the driver held back between them (the mock holds back 0, 1 and 2 pages more in
/// successive processes: 4 MiB), with each process's figure as a comment; one process
/// measures no spread and says so; nothing is left allocated in any process; with
/// stderr not a terminal no spinner is drawn.
#[test]
fn probe_measures_the_spread_between_processes() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("probe-processes");
    let counter = dir.path().join("count");
    let counter = counter.to_str().unwrap();
    let out = dir.path().join("p.yaml");
    let o = allocsim_on_mock(
        &mock,
        &["probe", "--processes", "3", "-o", out.to_str().unwrap()],
        &[("MOCK_HOLD_BACK_COUNTER", counter)],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains(CLEAN_MOCK), "{err}");
    // Its spinner is for terminals only: stderr is a pipe here.
    assert!(
        !err.contains(['\u{1b}', '\r']) && !err.contains("probing GPU"),
        "{err:?}"
    );
    let count = std::fs::read_to_string(counter).unwrap();
    assert!(count.starts_with("3 "), "{count}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("\nusable_spread_bytes: 4194304\n"), "{text}");
    assert!(
        text.contains("in 3 processes, this one first: 0, 2097152, 4194304\n"),
        "{text}"
    );
    let profile = sim::DeviceProfile::read(&out).unwrap();
    assert_eq!(profile.usable_spread_bytes, 4 << 20);
    let o = allocsim_on_mock(&mock, &["probe"], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!text.contains("\nusable_spread_bytes:"), "{text}");
    assert!(
        text.contains("# usable_spread_bytes: not measured (one process"),
        "{text}"
    );
}

/// `validate` near the limit on a driver that holds back more than the model: one page
/// more (within the H200 profile's 4 MiB spread) is "within the driver's variation",
/// three pages more is a disagreement, the model's own hold-back agrees; the summary
/// counts the three and the CSV's `verdict` column says which each run is.
#[test]
fn validate_tells_the_driver_variation_from_disagreement() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("validate-band");
    // 30 pages of 2 MiB, all live: the H200 model at 64 MiB free has
    // 64 MiB - 3 276 800 usable, 30 whole pages.
    let trace = dir.path().join("pages.yaml");
    let mut yaml = String::from("events:\n");
    for i in 0..30 {
        yaml += &format!("  - {{op: alloc, id: {i}, bytes: 2097152}}\n");
    }
    std::fs::write(&trace, yaml).unwrap();
    let run = |hold_back: u64| {
        let csv = dir.path().join(format!("v{hold_back}.csv"));
        let o = allocsim_on_mock(
            &mock,
            &[
                "validate",
                trace.to_str().unwrap(),
                "--policies",
                "immediate",
                "--gpu-profile",
                "h200",
                "--capacity",
                "64MiB",
                "-o",
                csv.to_str().unwrap(),
            ],
            &[("MOCK_HOLD_BACK_BYTES", &hold_back.to_string())],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert!(err.contains(CLEAN_MOCK), "{err}");
        let text = std::fs::read_to_string(&csv).unwrap();
        (err, text.lines().nth(1).unwrap().to_string())
    };
    let page = 2u64 << 20;
    let (err, row) = run(3_276_800);
    assert!(row.ends_with(",4194304,agree"), "{row}");
    assert!(
        err.contains("1 of 1 runs agree, 0 within the driver's variation, 0 disagree"),
        "{err}"
    );
    let (err, row) = run(3_276_800 + page);
    assert!(row.ends_with(",false,,,4194304,within_variation"), "{row}");
    assert!(
        err.contains("<- differs within the driver's variation (4.00 MiB between processes)"),
        "{err}"
    );
    assert!(
        err.contains("0 of 1 runs agree, 1 within the driver's variation, 0 disagree"),
        "{err}"
    );
    let (err, row) = run(3_276_800 + 3 * page);
    assert!(row.ends_with(",4194304,disagree"), "{row}");
    assert!(
        err.contains("0 of 1 runs agree, 0 within the driver's variation, 1 disagree"),
        "{err}"
    );
}

/// A driver error injected into the mock libcuda (invalid value, launch failure; in
/// cuMemAlloc, cuMemCreate, cuMemMap) reaches the user as an error on one line, exit 4,
/// and writes no CSV; an out-of-memory error of cuMemAlloc is a result (exit 0, the OOM
/// in the observed column); nothing is left allocated either way.
#[test]
fn injected_driver_errors_exit_4() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("faults-mock");
    let csv = dir.path().join("v.csv");
    let run = |policy: &str, fail: &str| {
        allocsim_on_mock(
            &mock,
            &[
                "validate",
                "examples/training_loop.yaml",
                "--policies",
                policy,
                "-o",
                csv.to_str().unwrap(),
            ],
            &[("MOCK_FAIL", fail)],
        )
    };
    for (policy, fail, call) in [
        ("caching", "cuMemAlloc_v2:3:1", "cuMemAlloc"),
        ("immediate", "cuMemAlloc_v2:5:719", "cuMemAlloc"),
        ("arena", "cuMemAlloc_v2:1:719", "cuMemAlloc"),
        (
            "caching:expandable_segments=True",
            "cuMemCreate:4:719",
            "cuMemCreate",
        ),
        (
            "caching:expandable_segments=True",
            "cuMemMap:2:1",
            "cuMemMap",
        ),
    ] {
        let o = run(policy, fail);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(4), "{policy} {fail}: {err}");
        // One error line; besides it only the note on the model and the mock's report
        // that nothing is left allocated.
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{policy} {fail}: {err}");
        assert!(errors[0].contains(call), "{policy} {fail}: {err}");
        for line in err.lines() {
            assert!(
                line.starts_with("error: ")
                    || line.starts_with("note: predicting with")
                    || line == CLEAN_MOCK,
                "{policy} {fail}: {line}"
            );
        }
        assert!(err.contains(CLEAN_MOCK), "{policy} {fail}: {err}");
        assert!(!csv.exists(), "{policy} {fail}: a CSV was written");
    }
    let o = run("immediate", "cuMemAlloc_v2:5:2");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&csv).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = text.lines().nth(1).unwrap().split(',').collect();
    let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("oom_event_predicted"), "", "{text}");
    assert!(col("oom_event_observed").parse::<u64>().is_ok(), "{text}");
    assert_eq!(col("agrees"), "false", "{text}");
}

/// A driver that writes no NUL after the device name: `probe` writes a profile with the
/// name cut at the buffer's end instead of panicking inside cudarc (exit 101).
#[test]
fn probe_survives_a_device_name_without_nul() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("probe-nonul");
    let out = dir.path().join("p.yaml");
    let o = allocsim_on_mock(
        &mock,
        &["probe", "-o", out.to_str().unwrap()],
        &[("MOCK_MODE", "nonul"), ("MOCK_TOTAL_BYTES", "4294967296")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let name = sim::DeviceProfile::read(&out)
        .expect("the profile reads back")
        .name;
    assert!(name.starts_with("Mock GPU with a long name"), "{name}");
    assert_eq!(name.len(), 255, "{name}");
}

/// `validate` replays traces with private pools (CUDA graph captures, a MemPool that
/// runs out of memory inside its window, expandable segments in a graph's pool) on the
/// (mock) GPU under the caching policy: the pool calls reach the policy there as in the
/// simulation, so the two agree, and nothing is left allocated.
#[test]
fn validate_replays_private_pools() {
    let Some(mock) = mock_libcuda() else { return };
    let dir = TempDir::new("validate-pools");
    let csv = dir.path().join("v.csv");
    let o = allocsim_on_mock(
        &mock,
        &[
            "validate",
            "tests/data/pools/graph_capture.json",
            "tests/data/pools/graph_capture__expandable_segments-True.json",
            "tests/data/pools/mempool_phases__use_on_oom-1__cap1265M.json",
            "--policies",
            "caching,caching:expandable_segments=True",
            "-o",
            csv.to_str().unwrap(),
        ],
        &[],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains(CLEAN_MOCK), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let agrees = header.iter().position(|&c| c == "agrees").unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 6, "{text}");
    for row in &rows {
        assert_eq!(row[agrees], "true", "{text}");
    }
}

// ---- endless input -------------------------------------------------------------------

/// Runs the binary with `args`, killing it after `secs` seconds (a reader that never
/// stops must fail the test, not hang it); the output and whether it finished.
fn allocsim_within(args: &[&str], secs: u64) -> (std::process::Output, bool) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let finished = wait_or_kill(&mut child, secs);
    (child.wait_with_output().unwrap(), finished)
}

/// `/dev/zero` as every kind of input the CLI reads (a trace detected or forced to each
/// format, a device profile, a sweep file) is refused on one line naming it, exit 2,
/// after reading a bounded prefix: the RMM log, profile and sweep readers read it until
/// memory ran out.
#[test]
fn dev_zero_is_refused_by_every_reader() {
    if !Path::new("/dev/zero").exists() {
        eprintln!("skipped: no /dev/zero");
        return;
    }
    let t = "examples/training_loop.yaml";
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["check", "/dev/zero"],
        vec!["replay", t, "--gpu-profile", "/dev/zero"],
        vec!["sweep", "/dev/zero"],
    ];
    for format in ["yaml", "csv", "json", "pickle", "rmm"] {
        cases.push(vec!["check", "/dev/zero", "--trace-format", format]);
    }
    for args in cases {
        let (o, finished) = allocsim_within(&args, 60);
        assert!(finished, "{args:?} still reading /dev/zero after 60 s");
        // `check` reports on stdout (the problem, then its verdict line); the others
        // print one error line on stderr.
        let report = if args[0] == "check" {
            stdout(&o)
        } else {
            stderr(&o)
        };
        assert_eq!(o.status.code(), Some(2), "{args:?}: {report}");
        let first = report.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("/dev/zero: ") || first.starts_with("error: /dev/zero: "),
            "{args:?}: {report}"
        );
        assert_eq!(first.matches("/dev/zero").count(), 1, "{args:?}: {report}");
        let lines = report.lines().count();
        assert_eq!(
            lines,
            if args[0] == "check" { 2 } else { 1 },
            "{args:?}: {report}"
        );
    }
}

// ---- audit of 2026-11-27 ----------------------------------------------------------------

/// A replay that fails (here PyTorch refuses a trace's `set_allocator_settings`) is one
/// line that says it once, in every command that replays: `compare`, `fit` and `diff`
/// repeated the whole message (the error's text, then its cause, which it already held).
#[test]
fn a_failed_replay_is_said_once() {
    let dir = TempDir::new("said-once");
    let trace = dir.file(
        "t.csv",
        "op,id,bytes,stream\nalloc,1,100,0\nset_allocator_settings,\"foo:1\",,\nfree,1,,\n",
    );
    let t = trace.to_str().unwrap();
    let cases: [&[&str]; 5] = [
        &["replay", t],
        &["compare", t, "--policies", "caching"],
        &["fit", t, "--policies", "caching", "--gpus", "none"],
        &[
            "diff",
            t,
            "--policies",
            "caching,caching:expandable_segments=True",
        ],
        &["bench", t, "--policies", "caching", "--runs", "1"],
    ];
    for args in cases {
        let o = allocsim(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert_eq!(
            err.matches("Unrecognized key 'foo'").count(),
            1,
            "{args:?}: {err}"
        );
    }
}

/// Waits for `child` to exit, killing it after `secs` seconds; whether it exited by itself.
fn wait_or_kill(child: &mut std::process::Child, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// Runs the binary with `args` and `input` on its stdin (a pipe), killing it after
/// `secs` seconds; the output and whether it finished.
fn allocsim_fed(args: &[&str], input: Vec<u8>, secs: u64) -> (std::process::Output, bool) {
    let (mut child, writer) = crate::util::spawn_fed(&root(), args, input);
    let finished = wait_or_kill(&mut child, secs);
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (output, finished)
}

/// The lines of a `replay` summary from `peak requested` on (the first lines name the
/// trace, which a pipe names otherwise).
fn summary_numbers(text: &str) -> String {
    text.lines()
        .skip_while(|l| !l.starts_with("peak requested"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where no temporary file can be made for a piped trace (`$TMPDIR` missing), the pipe
/// is read whole as before: the replay still runs and says what the file's says.
#[test]
fn a_piped_trace_without_a_temporary_directory_is_read_whole() {
    use std::process::Stdio;
    let csv = "examples/random_small.csv";
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["replay", "-", "--capacity", "1GiB"])
        .current_dir(root())
        .env("TMPDIR", "/nonexistent/allocsim-no-tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writer = crate::util::feed(&mut child, std::fs::read(root().join(csv)).unwrap());
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        summary_numbers(&stdout(&o)),
        summary_numbers(&stdout(&allocsim(["replay", csv, "--capacity", "1GiB"]))),
    );
}

/// A trace read from a pipe (`/dev/stdin`, `<(zcat t.csv.gz)`, a named pipe) is read
/// once and replays as the file does (standard input from a pipe and a process
/// substitution through a temporary file, `src/spool.rs`; a named pipe whole): `replay` read its first bytes to tell the format,
/// then opened it again (a pipe: "cannot tell the trace format" of a valid CSV or
/// snapshot; a named pipe whose writer had gone: waiting for ever), and `export` read a
/// snapshot's first bytes, then failed on the rest.
#[test]
fn a_trace_from_a_pipe_is_read_once() {
    let csv = "examples/random_small.csv";
    let pickle = "tests/data/oracle/h100-torch2.11-pickles/gpt_train_small.pickle";
    let dir = TempDir::new("from-a-pipe");
    let exported = dir.path().join("e.pickle");
    let exported = exported.to_str().unwrap();
    let cases: [(&str, &[&str]); 4] = [
        (csv, &["replay", "/dev/stdin"]),
        (csv, &["replay", "/dev/stdin", "--capacity", "1GiB"]),
        // Runs out: the explanation and the stack frames.
        (pickle, &["replay", "/dev/stdin", "--capacity", "1950MiB"]),
        (pickle, &["export", "/dev/stdin", "-o", exported]),
    ];
    for (trace, args) in cases {
        let bytes = std::fs::read(root().join(trace)).unwrap();
        let (o, finished) = allocsim_fed(args, bytes, 60);
        assert!(finished, "{args:?} on {trace} still running after 60 s");
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?} on {trace}: {}",
            stderr(&o)
        );
        if args[0] == "replay" {
            let mut from_file = args.to_vec();
            from_file[1] = trace;
            let expected = allocsim(&from_file);
            assert_eq!(
                summary_numbers(&stdout(&o)),
                summary_numbers(&stdout(&expected)),
                "{args:?} on {trace}"
            );
        }
    }
    // A named pipe: its writer is gone once the content is read.
    if !crate::util::has_mkfifo() {
        return;
    }
    let fifo = dir.path().join("t.csv");
    crate::util::mkfifo(&fifo);
    // Not waited for: a writer whose pipe is never opened waits for ever.
    {
        let fifo = fifo.clone();
        let bytes = std::fs::read(root().join(csv)).unwrap();
        std::thread::spawn(move || {
            let mut pipe = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
            let _ = std::io::Write::write_all(&mut pipe, &bytes);
        });
    }
    let (o, finished) = allocsim_within(&["replay", fifo.to_str().unwrap()], 60);
    assert!(finished, "replay of a named pipe still running after 60 s");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        summary_numbers(&stdout(&o)),
        summary_numbers(&stdout(&allocsim(["replay", csv]))),
    );
}

/// An out-of-memory is a result even when a setting tried as its remedy cannot run:
/// with `large_segment_size_mb` past the address space, `replay` and `compare` ran out
/// (a result), then tried `expandable_segments=True`, whose address reservation the
/// device refused, and exited 4 with that driver error instead of reporting the run.
#[test]
fn a_remedy_that_cannot_run_is_no_remedy() {
    let conf = "large_segment_size_mb:99999999999999";
    let t = "examples/random_small.csv";
    let o = allocsim(["replay", t, "--alloc-conf", conf]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("out of memory       at event 1 (line 3)"),
        "{out}"
    );
    assert!(!out.contains("expandable_segments=True"), "{out}");
    let o = allocsim(["compare", t, "--policies", "caching", "--alloc-conf", conf]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let mut lines = text.lines().map(|l| l.split(',').collect::<Vec<_>>());
    let (header, row) = (lines.next().unwrap(), lines.next().unwrap());
    let oom = header.iter().position(|c| *c == "oom_event_index").unwrap();
    assert_eq!(row[oom], "1", "{text}");
}

/// `fit` of a trace that starts mid-run (a ring buffer that wrapped) answers: at a
/// capacity below its starting state the replay cannot take that state over, which is
/// not fitting, as running out later is; the bisection stopped there with that error.
#[test]
fn fit_of_a_mid_run_trace_answers() {
    let t = "tests/data/unseen/midrun/gpt_train__wrap2000.json";
    let o = allocsim(["fit", t, "--policies", "caching", "--gpus", "none"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let mut lines = text.lines().map(|l| l.split(',').collect::<Vec<_>>());
    let (header, row) = (lines.next().unwrap(), lines.next().unwrap());
    let min = header
        .iter()
        .position(|c| *c == "min_capacity_bytes")
        .unwrap();
    let min: u64 = row[min].parse().unwrap();
    // At least the 4.38 GiB the first entry finds reserved; and it runs there.
    assert!(min >= 4_703_911_936, "{text}");
    let o = allocsim(["replay", t, "--capacity", &format!("{min}B")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("out of memory               none"),
        "{}",
        stdout(&o)
    );
}
