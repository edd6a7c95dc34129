//! The PyTorch snapshot pickle reader: no input panics, overflows the stack or grows
//! memory out of proportion.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.pickle");
    if let Ok(run) = workloads::read_snapshot_pickle_from(data, path, 0) {
        let _ = run.to_trace();
    }
});
