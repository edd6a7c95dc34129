//! Real CUDA memory. Without a driver these tests print why they skip and pass, unless
//! `ALLOCSIM_REQUIRE_GPU=1`, in which case a missing driver fails them.

use std::sync::{Mutex, MutexGuard};

use gpu_backend::{CudaDevice, OpenError};
use policies::caching::CachingDefaults;
use policies::spec::parse_policy_list;
use sim::{CompareInput, DeviceProfile};

use crate::util::root;

/// Whether a CUDA driver and device can be opened.
pub fn driver_present() -> bool {
    CudaDevice::open(0).is_ok()
}

/// One test on the GPU at a time: each checks the GPU's free memory before and after,
/// which another test's allocations (or ballast) in between would move.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Opens GPU 0, or explains why not (and fails if a GPU is required), with the lock
/// that keeps the other GPU tests off it until the test ends (declared before the
/// device, so dropped after it).
fn gpu() -> Option<(MutexGuard<'static, ()>, CudaDevice)> {
    let lock = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match CudaDevice::open(0) {
        Ok(d) => Some((lock, d)),
        Err(OpenError::NoDriver(msg)) => {
            assert!(
                std::env::var("ALLOCSIM_REQUIRE_GPU").as_deref() != Ok("1"),
                "ALLOCSIM_REQUIRE_GPU=1 but no GPU: {msg}"
            );
            eprintln!("skipped: no CUDA driver ({msg})");
            None
        }
        Err(e) => panic!("a CUDA driver is present but the device does not open: {e}"),
    }
}

fn input(name: &str) -> CompareInput {
    let trace = workloads::read(
        &root()
            .join("tests/data/traces")
            .join(format!("{name}.yaml")),
        None,
    )
    .unwrap();
    CompareInput {
        trace,
        hints: Default::default(),
    }
}

/// The golden traces replay on the GPU with the same reserved peak as predicted, under
/// every policy, and nothing is left allocated afterwards.
#[test]
fn golden_traces_on_the_gpu() {
    let Some((_one_at_a_time, mut gpu)) = gpu() else {
        return;
    };
    let free_before = gpu.observed_free_bytes().unwrap();
    let specs = policies::testing::every_policy();
    let model = DeviceProfile::builtin("h100").unwrap().to_options();
    for name in [
        "seed000",
        "small_1000x512",
        "pool_boundaries",
        "two_streams",
        "empty_cache",
        "one_gib_plus_one",
    ] {
        let input = input(name);
        for spec in &specs {
            let v = gpu_backend::validate_one(&mut gpu, &input, spec, None, &model, None).unwrap();
            assert_eq!(
                v.predicted.summary.reserved_bytes_peak,
                v.observed.summary.reserved_bytes_peak,
                "{}",
                sim::validation::summary_line(&v)
            );
            assert!(
                v.charged_within_tolerance(),
                "{}",
                sim::validation::summary_line(&v)
            );
        }
    }
    assert_eq!(
        gpu.observed_free_bytes().unwrap(),
        free_before,
        "everything was freed"
    );
}

/// With a capacity, the GPU runs out at the event the simulation predicts.
#[test]
fn capacity_oom_matches_on_the_gpu() {
    let Some((_one_at_a_time, mut gpu)) = gpu() else {
        return;
    };
    let specs = parse_policy_list("caching,immediate", &CachingDefaults::default()).unwrap();
    let model = DeviceProfile::builtin("h100").unwrap().to_options();
    let input = input("seed000");
    for spec in &specs {
        let v =
            gpu_backend::validate_one(&mut gpu, &input, spec, Some(2 << 30), &model, None).unwrap();
        assert!(
            v.observed.oom.is_some(),
            "{}",
            sim::validation::summary_line(&v)
        );
        assert_eq!(
            v.predicted.oom.as_ref().map(|o| o.event_index),
            v.observed.oom.as_ref().map(|o| o.event_index),
            "{}",
            sim::validation::summary_line(&v)
        );
    }
}

/// A mid-run trace whose starting state (4.38 GiB) the GPU's 1 GiB cannot hold runs out
/// before its first event on the GPU as in the prediction, under every policy (the
/// caching policy taking the state over, the others allocating its live blocks), and
/// everything taken is given back.
#[test]
fn midrun_start_larger_than_the_gpu_runs_out_before_the_first_event() {
    let Some((_one_at_a_time, mut gpu)) = gpu() else {
        return;
    };
    let free_before = gpu.observed_free_bytes().unwrap();
    let path = root().join("tests/data/unseen/midrun/gpt_train__wrap2000.json");
    let trace = workloads::read(&path, None).unwrap();
    assert!(trace.start.is_some(), "the recording starts mid-run");
    let input = CompareInput {
        trace,
        hints: Default::default(),
    };
    let model = DeviceProfile::builtin("h100").unwrap().to_options();
    for spec in &policies::testing::every_policy() {
        let v =
            gpu_backend::validate_one(&mut gpu, &input, spec, Some(1 << 30), &model, None).unwrap();
        let line = sim::validation::summary_line(&v);
        let predicted = v.predicted.oom.as_ref().expect("predicted out of memory");
        let observed = v.observed.oom.as_ref().expect("observed out of memory");
        assert_eq!(predicted.event_index, None, "{line}");
        assert_eq!(observed.event_index, None, "{line}");
        assert_eq!(v.observed.summary.event_count, 0, "{line}");
        assert!(v.agrees(), "{line}");
    }
    assert_eq!(
        gpu.observed_free_bytes().unwrap(),
        free_before,
        "everything was freed"
    );
}
