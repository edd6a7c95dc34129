//! `CudaDevice` against a mock libcuda (tests/mock/mock_libcuda.c).
//!
//! libcuda is dlopen()ed by name, so the mock's folder must be on LD_LIBRARY_PATH before
//! the process starts. Each test therefore runs twice: as the parent, it compiles the
//! mock with gcc and re-executes this test binary, filtered to itself, with
//! LD_LIBRARY_PATH and `GPU_BACKEND_MOCK_SCENARIO` set; as that child, it sees the
//! variable and runs its scenario. The parent checks that the child passed, ran exactly
//! one test, and that the mock's exit report shows nothing left allocated.
//!
//! The mock is compiled with `$CC`, else the first of `cc`, `gcc`, `clang` found. With no
//! C compiler the tests skip, saying so on stderr (past the test harness's capture), and
//! pass; with `ALLOCSIM_REQUIRE_MOCK=1` they fail instead.

use std::collections::HashMap;
use std::ffi::OsString;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpu_backend::{
    drop_cleanup_errors, install_interrupt_flag, probe, CudaDevice, OpenError, ProbeError,
    BALLAST_GRANULE_BYTES, PROBE_SIZES,
};
use policies::{
    AddressRange, Device, DeviceError, PhysicalChunk, Policy, Request, StreamId, VirtualMemory,
};

const SCENARIO_VAR: &str = "GPU_BACKEND_MOCK_SCENARIO";
/// Set to 1, a missing C compiler fails the tests instead of skipping them.
const REQUIRE_VAR: &str = "ALLOCSIM_REQUIRE_MOCK";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The mock's defaults: a 16 GiB card whose context takes 512 MiB.
const MOCK_TOTAL: u64 = 16 * GIB;
const MOCK_CONTEXT: u64 = 512 * MIB;
const MOCK_FREE: u64 = MOCK_TOTAL - MOCK_CONTEXT;
/// The mock's exit report when everything was released.
const CLEAN_REPORT: &str =
    "mock_libcuda report: used_bytes=0 allocs=0 handles=0 mappings=0 ranges=0 ctx_refs=0";

// ---- harness ---------------------------------------------------------------------------

/// Which mock library a test loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mock {
    /// Every symbol.
    Full,
    /// Without cuDevicePrimaryCtxRetain.
    OmitCore,
    /// Without cuMemCreate.
    OmitVmm,
}

impl Mock {
    fn defines(self) -> &'static [&'static str] {
        match self {
            Mock::Full => &[],
            Mock::OmitCore => &["-DMOCK_OMIT_CORE"],
            Mock::OmitVmm => &["-DMOCK_OMIT_VMM"],
        }
    }
}

fn in_child() -> bool {
    std::env::var_os(SCENARIO_VAR).is_some()
}

/// The C compilers tried, in order: `$CC` if set, else `cc`, `gcc`, `clang`.
fn compilers() -> Vec<OsString> {
    match std::env::var_os("CC").filter(|cc| !cc.is_empty()) {
        Some(cc) => vec![cc],
        None => ["cc", "gcc", "clang"].map(OsString::from).to_vec(),
    }
}

/// Compiles the mock (once per variant and process) into target/tmp; `None` without a C
/// compiler.
fn build_mock(variant: Mock) -> Option<PathBuf> {
    static BUILT: OnceLock<Mutex<HashMap<Mock, Option<PathBuf>>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    built
        .entry(variant)
        .or_insert_with(|| {
            let dir =
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mock-libcuda-{variant:?}"));
            std::fs::create_dir_all(&dir).expect("create the mock's folder");
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mock/mock_libcuda.c");
            let tmp = dir.join(format!("libcuda.so.{}.tmp", std::process::id()));
            for compiler in compilers() {
                let status = Command::new(&compiler)
                    .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
                    .arg(&tmp)
                    .args(variant.defines())
                    .arg(&source)
                    .status();
                match status {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => panic!("running {}: {e}", compiler.to_string_lossy()),
                    Ok(s) => {
                        assert!(
                            s.success(),
                            "{} failed to build the mock ({s})",
                            compiler.to_string_lossy()
                        );
                        // Atomic, so concurrent test runs never load a half-written file.
                        std::fs::rename(&tmp, dir.join("libcuda.so")).expect("install the mock");
                        return Some(dir);
                    }
                }
            }
            None
        })
        .clone()
}

/// Without a C compiler: fails under `ALLOCSIM_REQUIRE_MOCK=1`, else says on stderr that
/// `test` is skipped. Written to stderr directly, so that it shows without
/// `--nocapture`.
fn skip_without_compiler(test: &str) {
    let tried: Vec<String> = compilers()
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let why = format!(
        "no C compiler to build the mock libcuda (tried {})",
        tried.join(", ")
    );
    assert!(
        std::env::var(REQUIRE_VAR).as_deref() != Ok("1"),
        "{REQUIRE_VAR}=1 but {why}"
    );
    let line = format!("skipped: {test}: {why}; set {REQUIRE_VAR}=1 to fail instead\n");
    // A failed write to stderr leaves nothing better to do.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// In the child: runs `scenario` and returns `None`. In the parent: builds the mock,
/// runs this test again in a child process with the mock on the loader path and `envs`
/// set, checks it passed, and returns its output (`None` when skipped: no C compiler).
fn run(test: &str, mock: Option<Mock>, envs: &[(&str, &str)], scenario: fn()) -> Option<Output> {
    if in_child() {
        scenario();
        return None;
    }
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(SCENARIO_VAR, test);
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
    ] {
        cmd.env_remove(var);
    }
    if let Some(mock) = mock {
        let Some(dir) = build_mock(mock) else {
            skip_without_compiler(test);
            return None;
        };
        let mut path = OsString::from(dir.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", path);
    }
    cmd.envs(envs.iter().copied());
    let out = cmd.output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {test} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "child ran no test named {test}:\n{stdout}"
    );
    Some(out)
}

/// The child's mock reported nothing left allocated and no context retained at exit.
fn assert_clean(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(CLEAN_REPORT),
        "mock left something allocated:\n{stderr}"
    );
}

fn open() -> CudaDevice {
    CudaDevice::open(0).unwrap_or_else(|e| panic!("open: {e}"))
}

fn free_bytes(dev: &CudaDevice) -> u64 {
    dev.observed_free_bytes().expect("cuMemGetInfo")
}

/// A second handle on a range, to keep using it after a call that consumed one.
fn same_range(r: &AddressRange) -> AddressRange {
    AddressRange {
        id: r.id,
        addr: r.addr,
        size_bytes: r.size_bytes,
    }
}

fn expect_panic(what: &str, f: impl FnOnce()) {
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    assert!(r.is_err(), "{what} should panic");
}

// ---- segments --------------------------------------------------------------------------

/// Allocating and freeing segments keeps stats (reserved, charged in whole 2 MiB pages,
/// counts) in step with the mock driver; stats match the device info.
#[test]
fn mock_segments() {
    if let Some(out) = run("mock_segments", Some(Mock::Full), &[], scenario_segments) {
        assert_clean(&out);
    }
}

fn scenario_segments() {
    let mut dev = open();
    let info = dev.info().clone();
    assert_eq!(info.name, "Mock GPU");
    assert_eq!(
        (info.index, info.driver_version, info.compute_capability),
        (0, 12080, (9, 0))
    );
    assert_eq!(
        (info.total_bytes, info.free_at_open_bytes),
        (MOCK_TOTAL, MOCK_FREE)
    );
    assert_eq!(info.vmm_granularity_min_bytes, Some(2 * MIB));
    assert_eq!(info.vmm_granularity_recommended_bytes, Some(2 * MIB));

    let s = dev.stats();
    assert_eq!(
        (
            s.capacity_bytes,
            s.total_bytes,
            s.reserved_bytes,
            s.charged_bytes
        ),
        (MOCK_FREE, MOCK_TOTAL, 0, 0)
    );
    assert_eq!((s.segment_count, s.allocate_count, s.free_count), (0, 0, 0));
    assert_eq!(dev.alloc_ns_mean(), None);

    let a = dev.allocate_segment(1).expect("allocate 1 byte");
    let s = dev.stats();
    assert_eq!(
        (
            s.reserved_bytes,
            s.charged_bytes,
            s.segment_count,
            s.allocate_count
        ),
        (1, 2 * MIB, 1, 1)
    );
    let b = dev
        .allocate_segment(20 * MIB + 1)
        .expect("allocate 20 MiB + 1");
    assert_ne!(a.id, b.id);
    assert_ne!(a.addr, b.addr);
    let s = dev.stats();
    assert_eq!(
        (s.reserved_bytes, s.charged_bytes, s.segment_count),
        (20 * MIB + 2, 24 * MIB, 2)
    );
    assert_eq!(dev.observed_used_bytes(), Some(MOCK_CONTEXT + 24 * MIB));
    assert_eq!(free_bytes(&dev), MOCK_FREE - 24 * MIB);

    dev.free_segment(a).expect("free a");
    let s = dev.stats();
    assert_eq!(
        (
            s.reserved_bytes,
            s.charged_bytes,
            s.segment_count,
            s.free_count
        ),
        (20 * MIB + 1, 22 * MIB, 1, 1)
    );
    dev.free_segment(b).expect("free b");
    let s = dev.stats();
    assert_eq!(
        (s.reserved_bytes, s.charged_bytes, s.segment_count),
        (0, 0, 0)
    );
    assert_eq!((s.allocate_count, s.free_count), (2, 2));
    assert_eq!(dev.charged_bytes_peak(), 24 * MIB);
    assert!(dev.alloc_ns_mean().is_some() && dev.free_ns_mean().is_some());

    // Freeing a segment twice cannot compile; a forged one panics before the driver.
    let c = dev.allocate_segment(MIB).expect("allocate");
    let forged = policies::Segment {
        id: c.id,
        addr: c.addr,
        size_bytes: 2 * MIB,
    };
    expect_panic("freeing a mismatched segment", || {
        drop(dev.free_segment(forged))
    });
    dev.free_segment(c).expect("free c");

    // A device index the driver does not have.
    match CudaDevice::open(1) {
        Err(OpenError::NoDriver(msg)) => assert!(msg.contains("no CUDA device 1"), "{msg}"),
        other => panic!("open(1): {other:?}"),
    }
    drop(dev);
    assert_eq!(drop_cleanup_errors(), 0);
}

/// CUDA_ERROR_OUT_OF_MEMORY maps to DeviceError::OutOfMemory with the refused size and
/// leaves the accounting unchanged.
#[test]
fn mock_out_of_memory() {
    if let Some(out) = run(
        "mock_out_of_memory",
        Some(Mock::Full),
        &[],
        scenario_out_of_memory,
    ) {
        assert_clean(&out);
    }
}

fn scenario_out_of_memory() {
    let mut dev = open();
    assert_eq!(
        dev.allocate_segment(MOCK_TOTAL).unwrap_err(),
        DeviceError::OutOfMemory {
            requested_bytes: MOCK_TOTAL
        }
    );
    assert_eq!(dev.stats().allocate_count, 0);
    let all = dev
        .allocate_segment(MOCK_FREE)
        .expect("everything that is free");
    assert_eq!(dev.stats().charged_bytes, MOCK_FREE);
    assert_eq!(
        dev.allocate_segment(1).unwrap_err(),
        DeviceError::OutOfMemory { requested_bytes: 1 }
    );
    let s = dev.stats();
    assert_eq!(
        (
            s.reserved_bytes,
            s.charged_bytes,
            s.segment_count,
            s.allocate_count
        ),
        (MOCK_FREE, MOCK_FREE, 1, 1)
    );
    assert_eq!(s.free_bytes(), 0);
    dev.free_segment(all).expect("free");
}

/// Any other driver error maps to DeviceError::Driver with its code and a one-line
/// `NAME (code): description (in call)` message.
#[test]
fn mock_driver_error() {
    if let Some(out) = run(
        "mock_driver_error",
        Some(Mock::Full),
        &[("MOCK_FAIL", "cuMemAlloc_v2:2")],
        scenario_driver_error,
    ) {
        assert_clean(&out);
    }
}

fn scenario_driver_error() {
    let mut dev = open();
    let a = dev.allocate_segment(MIB).expect("first allocation");
    match dev.allocate_segment(MIB) {
        Err(DeviceError::Driver { code, message }) => {
            assert_eq!(code, 700);
            assert_eq!(
                message,
                "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered (in cuMemAlloc_v2)"
            );
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    assert_eq!(dev.stats().segment_count, 1);
    dev.free_segment(a).expect("free");
}

// ---- virtual memory ----------------------------------------------------------------------

/// Chunks of `bytes` each, created one by one.
fn create(dev: &mut CudaDevice, bytes: u64, count: usize) -> Vec<PhysicalChunk> {
    let vm = dev.virtual_memory().expect("vmm");
    (0..count)
        .map(|_| vm.create_physical(bytes).expect("create a chunk"))
        .collect()
}

/// Reserve, create, map, unmap, release: stats follow (physical memory is charged from
/// creation to release), mappings are tracked per offset, misuse panics before reaching
/// the driver, releasing a range with mappings is refused.
#[test]
fn mock_vmm() {
    if let Some(out) = run("mock_vmm", Some(Mock::Full), &[], scenario_vmm) {
        assert_clean(&out);
    }
}

fn scenario_vmm() {
    let mut dev = open();
    let vm = dev.virtual_memory().expect("the mock has VMM");
    let r = vm.reserve_range(100 * MIB + 1).expect("reserve");
    assert_eq!(
        r.size_bytes,
        100 * MIB + 1,
        "the range reports the size asked for"
    );
    let small = create(&mut dev, 2 * MIB, 3);
    let large = create(&mut dev, 20 * MIB, 2);
    let s = dev.stats();
    assert_eq!(
        (s.reserved_bytes, s.charged_bytes, s.allocate_count),
        (46 * MIB, 46 * MIB, 0),
        "created chunks are charged before they are mapped"
    );
    let vm = dev.virtual_memory().expect("vmm");
    vm.map(&r, 0, &small).expect("map 3 small chunks");
    vm.map(&r, 20 * MIB, &large).expect("map 2 large chunks");
    let spare = vm.create_physical(2 * MIB).expect("one more chunk");
    let one = std::slice::from_ref(&spare);
    expect_panic("mapping over a mapped chunk", || {
        drop(vm.map(&r, 4 * MIB, one))
    });
    expect_panic("mapping into a large chunk", || {
        drop(vm.map(&r, 30 * MIB, one))
    });
    expect_panic("mapping past the range", || {
        drop(vm.map(&r, 100 * MIB, one))
    });
    expect_panic("unmapping an unmapped chunk", || {
        drop(vm.unmap(&r, 6 * MIB, one))
    });
    expect_panic("unmapping another chunk than the one mapped there", || {
        drop(vm.unmap(&r, 0, one))
    });
    expect_panic("releasing a mapped chunk", || {
        let forged = PhysicalChunk {
            id: small[0].id,
            size_bytes: small[0].size_bytes,
        };
        drop(vm.release_physical(forged))
    });
    vm.release_physical(spare).expect("release the spare chunk");

    let s = dev.stats();
    assert_eq!(
        (
            s.reserved_bytes,
            s.charged_bytes,
            s.segment_count,
            s.allocate_count
        ),
        (46 * MIB, 46 * MIB, 1, 2)
    );
    assert_eq!(free_bytes(&dev), MOCK_FREE - 46 * MIB);

    let vm = dev.virtual_memory().expect("vmm");
    vm.unmap(&r, 2 * MIB, &small[1..2])
        .expect("unmap the middle chunk");
    assert_eq!(
        dev.stats().charged_bytes,
        46 * MIB,
        "an unmapped chunk is still charged"
    );
    assert_eq!(dev.stats().free_count, 1);

    let vm = dev.virtual_memory().expect("vmm");
    match vm.release_range(same_range(&r)) {
        Err(DeviceError::Driver { code: 1, message }) => {
            assert!(message.contains("still has 4 mapped page(s)"), "{message}")
        }
        other => panic!("releasing a range with mappings: {other:?}"),
    }
    vm.unmap(&r, 0, &small[..1]).expect("unmap");
    vm.unmap(&r, 4 * MIB, &small[2..]).expect("unmap");
    vm.unmap(&r, 20 * MIB, &large)
        .expect("unmap both large chunks");
    for chunk in small.into_iter().chain(large) {
        vm.release_physical(chunk).expect("release");
    }
    vm.release_range(r).expect("release");
    let s = dev.stats();
    assert_eq!(
        (s.reserved_bytes, s.charged_bytes, s.segment_count),
        (0, 0, 0)
    );
    assert_eq!((s.allocate_count, s.free_count), (2, 4));
    for mean in [
        dev.create_ns_mean(),
        dev.release_ns_mean(),
        dev.map_ns_mean(),
        dev.unmap_ns_mean(),
    ] {
        assert!(mean.is_some());
    }
    assert_eq!(free_bytes(&dev), MOCK_FREE);
}

/// An out-of-memory cuMemCreate is DeviceError::OutOfMemory and changes nothing; a map
/// whose cuMemMap or cuMemSetAccess fails is all or nothing: what it mapped is unmapped
/// again, its chunks stay created and can be mapped later.
#[test]
fn mock_map_rollback() {
    // 10 MiB free: five 2 MiB chunks fit. The 1st cuMemSetAccess fails, and the 7th
    // cuMemMap.
    let envs = [
        ("MOCK_TOTAL_BYTES", "1073741824"),
        ("MOCK_CONTEXT_BYTES", "1063256064"),
        ("MOCK_FAIL", "cuMemSetAccess:1,cuMemMap:7"),
    ];
    if let Some(out) = run(
        "mock_map_rollback",
        Some(Mock::Full),
        &envs,
        scenario_map_rollback,
    ) {
        assert_clean(&out);
    }
}

fn scenario_map_rollback() {
    let mut dev = open();
    assert_eq!(free_bytes(&dev), 10 * MIB);
    let chunks = create(&mut dev, 2 * MIB, 5);
    assert_eq!(free_bytes(&dev), 0);
    let vm = dev.virtual_memory().expect("vmm");
    assert_eq!(
        vm.create_physical(2 * MIB).unwrap_err(),
        DeviceError::OutOfMemory {
            requested_bytes: 2 * MIB
        }
    );
    assert_eq!(
        dev.stats().reserved_bytes,
        10 * MIB,
        "the refused chunk left no trace"
    );
    let vm = dev.virtual_memory().expect("vmm");
    let r = vm.reserve_range(64 * MIB).expect("reserve");

    // Three cuMemMap calls succeed, the access call fails: all three are unmapped.
    match vm.map(&r, 0, &chunks[..3]) {
        Err(DeviceError::Driver { code: 700, message }) => {
            assert!(message.ends_with("(in cuMemSetAccess)"), "{message}")
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    assert_eq!(dev.stats().allocate_count, 0);
    // The span is free again (a mapping left behind would make the mock refuse this).
    let vm = dev.virtual_memory().expect("vmm");
    vm.map(&r, 0, &chunks[..2]).expect("the same span maps now");
    // The 7th cuMemMap of the process (this call's second) fails: the first chunk of
    // this call is unmapped again.
    match vm.map(&r, 8 * MIB, &chunks[2..4]) {
        Err(DeviceError::Driver { code: 700, message }) => {
            assert!(message.ends_with("(in cuMemMap)"), "{message}")
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    let vm = dev.virtual_memory().expect("vmm");
    vm.map(&r, 8 * MIB, &chunks[2..])
        .expect("three chunks map now");
    assert_eq!(dev.stats().allocate_count, 2);
    assert_eq!(dev.stats().charged_bytes, 10 * MIB);
    assert_eq!(dev.cleanup_errors(), 0);
    // Left mapped on purpose: drop unmaps and releases everything.
}

/// Stitching is expressible on the CUDA device: one chunk mapped at two places, the
/// chunks of a released range mapped again back to back elsewhere, and free memory as
/// the driver reports it moves only with creation and release.
#[test]
fn mock_stitching() {
    if let Some(out) = run("mock_stitching", Some(Mock::Full), &[], || {
        let mut dev = open();
        policies::testing::check_stitching(&mut dev);
        assert_eq!(free_bytes(&dev), MOCK_FREE);
        assert_eq!(dev.cleanup_errors(), 0);
    }) {
        assert_clean(&out);
    }
}

/// The caching policy's expandable segments make PyTorch's driver calls: pages created
/// one by one; when one is out of memory, the pages created by that attempt are
/// released (and the retry after the cache release does the same); otherwise the new
/// pages are mapped, then made accessible in one call; `empty_cache` unmaps and
/// releases them and frees the address range.
#[test]
fn mock_expandable_segments_calls() {
    // 50 MiB free: two 20 MiB pages fit, a third does not.
    let envs = [("MOCK_TOTAL_BYTES", "589299712"), ("MOCK_LOG", "1")];
    let Some(out) = run(
        "mock_expandable_segments_calls",
        Some(Mock::Full),
        &envs,
        scenario_expandable_calls,
    ) else {
        return;
    };
    assert_clean(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let calls: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("mock_libcuda call: "))
        .filter(|l| !l.starts_with("cuMemAddressReserve"))
        .collect();
    let page = 20 * MIB;
    let attempt_oom = [
        format!("cuMemCreate {page} -> 0"),
        format!("cuMemCreate {page} -> 0"),
        format!("cuMemCreate {page} -> 2"),
        format!("cuMemRelease {page} -> 0"),
        format!("cuMemRelease {page} -> 0"),
    ];
    let mut expected: Vec<String> = Vec::new();
    expected.extend(attempt_oom.iter().cloned()); // first attempt
    expected.extend(attempt_oom.iter().cloned()); // retry after the cache release
    expected.extend([
        format!("cuMemCreate {page} -> 0"),
        format!("cuMemCreate {page} -> 0"),
        format!("cuMemMap {page} -> 0"),
        format!("cuMemMap {page} -> 0"),
        format!("cuMemSetAccess {} -> 0", 2 * page),
        format!("cuMemUnmap {page} -> 0"),
        format!("cuMemUnmap {page} -> 0"),
        format!("cuMemRelease {page} -> 0"),
        format!("cuMemRelease {page} -> 0"),
    ]);
    let reserve = stderr
        .lines()
        .filter(|l| l.starts_with("mock_libcuda call: cuMemAddressReserve"))
        .count();
    assert_eq!(reserve, 1, "one expandable segment:\n{stderr}");
    assert_eq!(
        calls[..expected.len()],
        expected.iter().map(String::as_str).collect::<Vec<_>>()[..],
        "\n{stderr}"
    );
    assert!(
        calls[expected.len()].starts_with("cuMemAddressFree"),
        "\n{stderr}"
    );
}

fn scenario_expandable_calls() {
    let mut dev = open();
    let config = policies::caching::CachingConfig::from_alloc_conf("expandable_segments:True")
        .expect("config");
    let mut policy = policies::caching::CachingPolicy::new(config);
    let request = |size_bytes| Request {
        size_bytes,
        stream: StreamId(0),
    };
    assert!(matches!(
        policy.allocate(&mut dev, request(60 * MIB)),
        Err(policies::AllocError::OutOfMemory { .. })
    ));
    assert_eq!(
        free_bytes(&dev),
        50 * MIB,
        "nothing kept from the failed attempts"
    );
    let a = policy
        .allocate(&mut dev, request(30 * MIB))
        .expect("two pages");
    assert_eq!(free_bytes(&dev), 10 * MIB);
    policy.check_invariants();
    assert_eq!(policy.stats().reserved_bytes, dev.stats().reserved_bytes);
    policy.free(&mut dev, &a).expect("free");
    policy.empty_cache(&mut dev).expect("empty_cache");
    assert_eq!(free_bytes(&dev), 50 * MIB);
    assert_eq!(dev.stats().segment_count, 0, "the range is freed too");
}

// ---- validation ---------------------------------------------------------------------------

/// validate_one replays on the simulated device and on the (mock) GPU: the same reserved
/// peak and OOM point, operation counts per run (not cumulative), and nothing left
/// allocated after each run, with or without a capacity.
#[test]
fn mock_validate() {
    if let Some(out) = run("mock_validate", Some(Mock::Full), &[], scenario_validate) {
        assert_clean(&out);
    }
}

fn scenario_validate() {
    use workloads::{AllocId, Event, Trace};
    let mut dev = open();
    let alloc = |id, size_bytes| Event::Alloc {
        id: AllocId(id),
        size_bytes,
        stream: 0,
    };
    let free = |id| Event::Free { id: AllocId(id) };
    let trace = Trace::new(
        "reassign",
        vec![
            alloc(1, GIB),
            alloc(2, GIB),
            free(2),
            alloc(3, GIB),
            alloc(4, GIB),
            free(3),
            alloc(5, 3 * MIB),
        ],
    );
    let input = sim::CompareInput {
        trace,
        hints: Default::default(),
    };
    let spec = policies::spec::parse_policy("caching", &Default::default()).unwrap();
    let model = sim::SimDeviceOptions::default();
    let first =
        gpu_backend::validate_one(&mut dev, &input, &spec, None, &model, None).expect("validate");
    let second =
        gpu_backend::validate_one(&mut dev, &input, &spec, None, &model, None).expect("validate");
    for v in [&first, &second] {
        assert!(v.agrees(), "{}", sim::validation::summary_line(v));
        // The 3 MiB request is carved from the cached 1 GiB block: three segments.
        assert_eq!(v.observed.summary.reserved_bytes_peak, 3 * GIB);
        assert_eq!(v.segment_ops, 3, "three 1 GiB segments, counted per run");
        assert!(v.device_alloc_ns_mean.is_some());
    }
    assert_eq!(
        free_bytes(&dev),
        MOCK_FREE,
        "everything freed after each run"
    );
    let capped = gpu_backend::validate_one(&mut dev, &input, &spec, Some(2 * GIB), &model, None)
        .expect("validate");
    assert_eq!(capped.capacity_bytes, Some(2 * GIB));
    assert!(
        capped.agrees(),
        "{}",
        sim::validation::summary_line(&capped)
    );
    assert_eq!(
        capped.observed.oom.as_ref().and_then(|o| o.event_index),
        Some(4)
    );
    assert_eq!(free_bytes(&dev), MOCK_FREE, "ballast freed too");
}

// ---- ballast -----------------------------------------------------------------------------

/// The ballast leaves the requested free memory (to within 2 MiB, never below), becomes
/// the capacity, is refused while segments are live, and is freed by release_all.
#[test]
fn mock_ballast() {
    if let Some(out) = run("mock_ballast", Some(Mock::Full), &[], scenario_ballast) {
        assert_clean(&out);
    }
}

fn scenario_ballast() {
    let mut dev = open();
    let target = 4 * GIB + 3 * MIB;
    let left = dev.set_ballast_for_free_bytes(target).expect("ballast");
    assert_eq!(left, 4 * GIB + 4 * MIB);
    assert_eq!(free_bytes(&dev), left);
    assert_eq!(dev.ballast_bytes(), MOCK_FREE - left);
    let s = dev.stats();
    assert_eq!((s.capacity_bytes, s.charged_bytes), (left, 0));

    let all = dev
        .allocate_segment(left)
        .expect("exactly what is left fits");
    assert_eq!(dev.stats().charged_bytes, left);
    assert!(matches!(
        dev.allocate_segment(1),
        Err(DeviceError::OutOfMemory { .. })
    ));
    assert!(matches!(
        dev.set_ballast_for_free_bytes(GIB),
        Err(DeviceError::Unsupported { .. })
    ));
    dev.free_segment(all).expect("free");

    // Asking for more than is free takes no ballast (the old one is given back first).
    assert_eq!(
        dev.set_ballast_for_free_bytes(100 * GIB)
            .expect("no ballast"),
        MOCK_FREE
    );
    assert_eq!(dev.ballast_bytes(), 0);
    assert_eq!(dev.stats().capacity_bytes, MOCK_FREE);

    dev.set_ballast_for_free_bytes(GIB).expect("ballast again");
    assert_eq!(free_bytes(&dev), GIB);
    dev.release_all().expect("release_all");
    assert_eq!(free_bytes(&dev), MOCK_FREE);
    assert_eq!(dev.stats().capacity_bytes, MOCK_FREE);
}

/// With allocations capped at 1 GiB and 2 MiB of overhead charged per allocation, the
/// ballast still lands at or above the target, within one granule plus the overhead.
#[test]
fn mock_ballast_chunked() {
    let envs = [
        ("MOCK_MAX_ALLOC_BYTES", "1073741824"),
        ("MOCK_ALLOC_OVERHEAD_BYTES", "2097152"),
    ];
    if let Some(out) = run(
        "mock_ballast_chunked",
        Some(Mock::Full),
        &envs,
        scenario_ballast_chunked,
    ) {
        assert_clean(&out);
    }
}

fn scenario_ballast_chunked() {
    let mut dev = open();
    let target = 3 * GIB + 5 * MIB;
    let left = dev.set_ballast_for_free_bytes(target).expect("ballast");
    assert_eq!(left, free_bytes(&dev));
    assert!(left >= target, "{left} below the target {target}");
    assert!(
        left < target + BALLAST_GRANULE_BYTES + 2 * MIB,
        "{left} too far above {target}"
    );
    assert!(
        dev.ballast_bytes() >= 11 * GIB,
        "several chunks of at most 1 GiB"
    );
}

// ---- cleanup -----------------------------------------------------------------------------

/// Dropping a device with live segments, mapped and unmapped chunks, ranges and ballast
/// releases everything and the context (the mock reports zero used bytes at exit).
#[test]
fn mock_drop_releases_everything() {
    if let Some(out) = run(
        "mock_drop_releases_everything",
        Some(Mock::Full),
        &[],
        scenario_drop,
    ) {
        assert_clean(&out);
    }
}

fn scenario_drop() {
    let mut dev = open();
    dev.set_ballast_for_free_bytes(8 * GIB).expect("ballast");
    let _kept: Vec<_> = [1, 3 * MIB, GIB]
        .iter()
        .map(|&s| dev.allocate_segment(s).expect("allocate"))
        .collect();
    let small = create(&mut dev, 2 * MIB, 4);
    let large = create(&mut dev, 20 * MIB, 2);
    let _unmapped = create(&mut dev, 2 * MIB, 1);
    let vm = dev.virtual_memory().expect("vmm");
    let r1 = vm.reserve_range(GIB).expect("reserve");
    let r2 = vm.reserve_range(GIB).expect("reserve");
    vm.map(&r1, 0, &small).expect("map");
    vm.map(&r2, 40 * MIB, &large).expect("map");
    // One chunk mapped twice: cleanup unmaps both places before releasing it.
    vm.map(&r2, 0, &small[..1]).expect("map again");
    let _unused = vm.reserve_range(GIB).expect("reserve");
    assert_eq!(dev.stats().segment_count, 6);
    drop(dev);
    assert_eq!(drop_cleanup_errors(), 0);

    // A fresh device sees all memory back.
    let dev = open();
    assert_eq!(free_bytes(&dev), MOCK_FREE);
}

/// release_all frees everything with error reporting and leaves the device usable.
#[test]
fn mock_release_all() {
    if let Some(out) = run(
        "mock_release_all",
        Some(Mock::Full),
        &[],
        scenario_release_all,
    ) {
        assert_clean(&out);
    }
}

fn scenario_release_all() {
    let mut dev = open();
    let _a = dev.allocate_segment(5 * MIB).expect("allocate");
    let chunks = create(&mut dev, 2 * MIB, 2);
    let vm = dev.virtual_memory().expect("vmm");
    let r = vm.reserve_range(GIB).expect("reserve");
    vm.map(&r, 0, &chunks).expect("map");
    dev.release_all().expect("release_all");
    let s = dev.stats();
    assert_eq!(
        (s.reserved_bytes, s.charged_bytes, s.segment_count),
        (0, 0, 0)
    );
    assert_eq!(free_bytes(&dev), MOCK_FREE);
    let b = dev.allocate_segment(MIB).expect("still usable");
    dev.free_segment(b).expect("free");
    assert_eq!(dev.cleanup_errors(), 0);
}

// ---- opening ------------------------------------------------------------------------------

/// cuInit failing with CUDA_ERROR_NO_DEVICE gives OpenError::NoDriver with a one-line
/// message naming the error and the call.
#[test]
fn mock_no_device() {
    run(
        "mock_no_device",
        Some(Mock::Full),
        &[("MOCK_MODE", "nodevice")],
        || {
            match CudaDevice::open(0) {
                Err(OpenError::NoDriver(msg)) => {
                    assert!(!msg.contains('\n'), "{msg}");
                    assert_eq!(msg, "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected (in cuInit)");
                }
                other => panic!("expected NoDriver, got {other:?}"),
            }
            assert!(matches!(
                probe(0),
                Err(ProbeError::Open(OpenError::NoDriver(_)))
            ));
        },
    );
}

/// A driver that reports zero devices gives OpenError::NoDriver.
#[test]
fn mock_zero_devices() {
    run(
        "mock_zero_devices",
        Some(Mock::Full),
        &[("MOCK_MODE", "zerodevices")],
        || match CudaDevice::open(0) {
            Err(OpenError::NoDriver(msg)) => assert_eq!(msg, "the CUDA driver reports no device"),
            other => panic!("expected NoDriver, got {other:?}"),
        },
    );
}

/// A libcuda lacking a required symbol gives OpenError::NoDriver naming it, no panic.
#[test]
fn mock_missing_symbol() {
    run(
        "mock_missing_symbol",
        Some(Mock::OmitCore),
        &[],
        || match CudaDevice::open(0) {
            Err(OpenError::NoDriver(msg)) => {
                assert!(msg.contains("lacks cuDevicePrimaryCtxRetain"), "{msg}");
                assert!(!msg.contains('\n'));
            }
            other => panic!("expected NoDriver, got {other:?}"),
        },
    );
}

/// A libcuda without the VMM symbols still opens; virtual memory is then unavailable.
#[test]
fn mock_without_vmm_symbols() {
    if let Some(out) = run(
        "mock_without_vmm_symbols",
        Some(Mock::OmitVmm),
        &[],
        scenario_without_vmm,
    ) {
        assert_clean(&out);
    }
}

/// A device whose VMM attribute is 0 opens without virtual memory.
#[test]
fn mock_without_vmm_attribute() {
    if let Some(out) = run(
        "mock_without_vmm_attribute",
        Some(Mock::Full),
        &[("MOCK_MODE", "novmm")],
        scenario_without_vmm,
    ) {
        assert_clean(&out);
    }
}

fn scenario_without_vmm() {
    let mut dev = open();
    assert_eq!(dev.info().vmm_granularity_min_bytes, None);
    assert!(dev.virtual_memory().is_none());
    assert!(matches!(
        VirtualMemory::reserve_range(&mut dev, GIB),
        Err(DeviceError::Unsupported { .. })
    ));
    let a = dev.allocate_segment(MIB).expect("segments still work");
    dev.free_segment(a).expect("free");
}

// ---- probe and Ctrl-C --------------------------------------------------------------------------

/// probe() on a 4 GiB mock: page rounding per size, what fits eight at a time, the usable
/// capacity, and free memory back at its start value.
#[test]
fn mock_probe() {
    if let Some(out) = run(
        "mock_probe",
        Some(Mock::Full),
        &[("MOCK_TOTAL_BYTES", "4294967296")],
        scenario_probe,
    ) {
        assert_clean(&out);
    }
}

fn scenario_probe() {
    let free = 4 * GIB - MOCK_CONTEXT;
    let report = probe(0).expect("probe");
    assert_eq!(report.device_name, "Mock GPU");
    assert_eq!(
        (
            report.total_bytes,
            report.free_at_start_bytes,
            report.context_bytes
        ),
        (4 * GIB, free, MOCK_CONTEXT)
    );
    assert_eq!(report.vmm_granularity_min_bytes, Some(2 * MIB));
    assert_eq!(report.sizes.len(), PROBE_SIZES.len());
    for (row, &size) in report.sizes.iter().zip(&PROBE_SIZES) {
        let page = size.div_ceil(2 * MIB) * 2 * MIB;
        assert_eq!(row.size_bytes, size);
        assert_eq!(row.single_free_drop_bytes, Some(page as i64), "size {size}");
        assert_eq!(row.single_residual_bytes, Some(0));
        assert!(row.alloc_ns.is_some() && row.free_ns.is_some());
        let fit = (free / page).min(8);
        assert_eq!(u64::from(row.x8_live), fit, "size {size}");
        assert_eq!(row.x8_free_drop_bytes, (fit * page) as i64);
    }
    assert_eq!(
        (
            report.fill.big_chunks,
            report.fill.tail_chunks,
            report.fill.tail_bytes
        ),
        (3, 1, 512 * MIB)
    );
    assert_eq!(
        (report.fill.usable_bytes, report.fill.free_at_full_bytes),
        (free, 0)
    );
    assert_eq!(report.free_after_release_bytes, free);
    assert!(report.returned_to_start);
    check_placement_records(&report.placement);
}

/// The placement probe recorded every call of its script with the addresses the mock
/// handed out (bumped upward, never reused: allocations one after the other, ranges
/// with a page between them), then a free for everything, newest first.
fn check_placement_records(p: &gpu_backend::PlacementProbe) {
    use gpu_backend::{PlacementCall, PlacementStep, PLACEMENT_SCRIPT};
    assert!(!p.out_of_memory);
    let mut made = 0;
    let mut prev_alloc: Option<(u64, u64)> = None;
    let mut prev_range: Option<(u64, u64)> = None;
    for (step, rec) in PLACEMENT_SCRIPT.iter().zip(&p.records) {
        match *step {
            PlacementStep::Alloc(size) => {
                assert_eq!((rec.call, rec.size_bytes), (PlacementCall::Alloc, size));
                if let Some((a, s)) = prev_alloc {
                    assert_eq!(rec.addr, a + s.div_ceil(2 * MIB) * 2 * MIB);
                }
                prev_alloc = Some((rec.addr, size));
                made += 1;
            }
            PlacementStep::Reserve(size) => {
                assert_eq!((rec.call, rec.size_bytes), (PlacementCall::Reserve, size));
                if let Some((a, s)) = prev_range {
                    assert_eq!(rec.addr, a + s + 2 * MIB);
                }
                prev_range = Some((rec.addr, size));
                made += 1;
            }
            PlacementStep::Free(i) | PlacementStep::Release(i) => {
                let call = if matches!(step, PlacementStep::Free(_)) {
                    PlacementCall::Free
                } else {
                    PlacementCall::Release
                };
                let of = p.records[..]
                    .iter()
                    .filter(|r| matches!(r.call, PlacementCall::Alloc | PlacementCall::Reserve))
                    .nth(
                        PLACEMENT_SCRIPT[..i]
                            .iter()
                            .filter(|s| {
                                matches!(s, PlacementStep::Alloc(_) | PlacementStep::Reserve(_))
                            })
                            .count(),
                    )
                    .expect("freed record");
                assert_eq!(
                    (rec.call, rec.addr, rec.size_bytes),
                    (call, of.addr, of.size_bytes)
                );
            }
        }
    }
    // Then the final frees: one for each thing still held, newest first.
    let frees = PLACEMENT_SCRIPT
        .iter()
        .filter(|s| matches!(s, PlacementStep::Free(_) | PlacementStep::Release(_)))
        .count();
    assert_eq!(p.records.len(), PLACEMENT_SCRIPT.len() + made - frees);
    let mut live: Vec<u64> = Vec::new();
    for r in &p.records {
        match r.call {
            PlacementCall::Alloc | PlacementCall::Reserve => live.push(r.addr),
            PlacementCall::Free | PlacementCall::Release => {
                let k = live
                    .iter()
                    .position(|&a| a == r.addr)
                    .expect("frees a live one");
                live.remove(k);
            }
        }
    }
    assert!(live.is_empty(), "everything freed");
    assert_eq!(
        p.chunk_bytes,
        Some(20 * MIB),
        "the mock puts them back to back"
    );
}

/// install_interrupt_flag is idempotent and a SIGINT sets the flag instead of killing
/// the process.
#[test]
fn interrupt_sets_flag() {
    run("interrupt_sets_flag", None, &[], || {
        let flag = install_interrupt_flag();
        assert!(std::ptr::eq(flag, install_interrupt_flag()));
        assert!(!flag.load(Ordering::SeqCst));
        let pid = std::process::id().to_string();
        match Command::new("kill").args(["-INT", &pid]).status() {
            Err(_) => {
                println!("skipped: kill not found");
                return;
            }
            Ok(s) => assert!(s.success()),
        }
        let started = Instant::now();
        while !flag.load(Ordering::SeqCst) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "SIGINT did not set the flag"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// Without a C compiler a mock test is skipped with a line on stderr (shown without
/// `--nocapture`) and passes; with `ALLOCSIM_REQUIRE_MOCK=1` it fails, naming why.
#[test]
fn missing_compiler_is_a_visible_skip_or_a_failure() {
    if in_child() {
        return;
    }
    let child = |require: bool| {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
        cmd.args(["--exact", "mock_zero_devices", "--test-threads=1"])
            .env("CC", "/nonexistent/allocsim-test-cc")
            .env_remove(SCENARIO_VAR)
            .env_remove(REQUIRE_VAR);
        if require {
            cmd.env(REQUIRE_VAR, "1");
        }
        cmd.output().expect("run the test binary again")
    };
    let skipped = child(false);
    let stderr = String::from_utf8_lossy(&skipped.stderr);
    assert!(skipped.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "skipped: mock_zero_devices: no C compiler to build the mock libcuda \
             (tried /nonexistent/allocsim-test-cc)"
        ),
        "{stderr}"
    );
    let required = child(true);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&required.stdout),
        String::from_utf8_lossy(&required.stderr)
    );
    assert!(!required.status.success(), "{out}");
    assert!(
        out.contains("ALLOCSIM_REQUIRE_MOCK=1 but no C compiler"),
        "{out}"
    );
}

// ---- hostile drivers ---------------------------------------------------------------------

/// A driver that fills the name buffer and writes no terminating NUL: open and probe read
/// the name cut at the buffer's end instead of panicking inside cudarc.
#[test]
fn mock_name_without_nul() {
    if let Some(out) = run(
        "mock_name_without_nul",
        Some(Mock::Full),
        &[("MOCK_MODE", "nonul"), ("MOCK_TOTAL_BYTES", "4294967296")],
        scenario_name_without_nul,
    ) {
        assert_clean(&out);
    }
}

fn scenario_name_without_nul() {
    let name = open().info().name.clone();
    assert_eq!(name.len(), 255, "{name}");
    assert!(
        name.starts_with("Mock GPU with a long name Mock GPU"),
        "{name}"
    );
    assert_eq!(probe(0).expect("probe").device_name, name);
}

/// Replays `trace` under every policy on the (faulty) mock GPU. Each replay either runs
/// or stops with a driver error (never an out-of-memory error, which would be a
/// result); after a failure the policy's invariants hold and its reserved bytes equal
/// the device's, and once the policy is dropped and the device released, the GPU is back
/// to all free. Returns the driver error codes met.
fn replay_every_policy_with_faults(trace: &workloads::Trace) -> Vec<u32> {
    let mut dev = open();
    let mut codes = Vec::new();
    for spec in policies::testing::every_policy() {
        for _ in 0..4 {
            let mut policy = spec.config.build().unwrap();
            let options = sim::ReplayOptions {
                check_invariants: true,
                ..sim::ReplayOptions::default()
            };
            match sim::replay(trace, policy.as_mut(), &mut dev, &options) {
                Ok(_) => {}
                Err(sim::ReplayError::Device {
                    error: DeviceError::Driver { code, message },
                    ..
                }) => {
                    assert!(message.contains("(in cu"), "{message}");
                    policy.check_invariants();
                    assert_eq!(
                        policy.stats().reserved_bytes,
                        dev.stats().reserved_bytes,
                        "{}: reserved bytes after driver error {code}",
                        spec.label
                    );
                    codes.push(code);
                }
                Err(other) => panic!("{}: {other}", spec.label),
            }
            drop(policy);
            dev.release_all().expect("release all");
            assert_eq!(
                free_bytes(&dev),
                MOCK_FREE,
                "{}: everything freed",
                spec.label
            );
        }
    }
    codes
}

fn fault_trace() -> workloads::Trace {
    workloads::random(&workloads::RandomOptions {
        seed: 3,
        events: 200,
        sizes: workloads::SizeDistribution::LogUniform {
            min_bytes: 512,
            max_bytes: 64 << 20,
        },
        ..workloads::RandomOptions::default()
    })
    .unwrap()
}

/// Random driver faults (launch failures, one allocating call in three) under every
/// policy: each reaches the caller as a driver error, and nothing is left allocated.
#[test]
fn mock_random_faults() {
    if let Some(out) = run(
        "mock_random_faults",
        Some(Mock::Full),
        &[
            ("MOCK_FAULT_EVERY", "3"),
            ("MOCK_FAULT_SEED", "11"),
            ("MOCK_FAULT_CODE", "719"),
        ],
        scenario_random_faults,
    ) {
        assert_clean(&out);
    }
}

fn scenario_random_faults() {
    let codes = replay_every_policy_with_faults(&fault_trace());
    assert!(codes.len() >= 10, "{codes:?}");
    assert!(codes.iter().all(|&c| c == 719), "{codes:?}");
}

/// Chosen driver faults: invalid value in a cuMemAlloc, out of memory in a cuMemMap (a
/// driver error there, not a policy-visible OOM), a launch failure in a cuMemCreate and
/// in a cuMemAddressReserve: each reaches the caller with its code.
#[test]
fn mock_chosen_faults() {
    if let Some(out) = run(
        "mock_chosen_faults",
        Some(Mock::Full),
        &[(
            "MOCK_FAIL",
            "cuMemAlloc_v2:3:1,cuMemMap:2:2,cuMemCreate:9:719,cuMemAddressReserve:3:719",
        )],
        scenario_chosen_faults,
    ) {
        assert_clean(&out);
    }
}

fn scenario_chosen_faults() {
    let mut codes = replay_every_policy_with_faults(&fault_trace());
    codes.sort_unstable();
    assert_eq!(codes, vec![1, 2, 719, 719]);
}
