//! The RAPIDS RMM log reader: no input panics, wraps, or reads without bound; what it
//! reads validates without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = workloads::rmm::read_rmm_from(data, std::path::Path::new("fuzz.log")) {
        assert_eq!(trace.events.len(), trace.times_us.len());
        let _ = workloads::validate(&trace);
    }
});
