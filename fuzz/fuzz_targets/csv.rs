//! The CSV trace reader: no input panics or wraps; what reads writes back the same.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = workloads::read_csv_from(data, std::path::Path::new("fuzz.csv")) {
        let mut out = Vec::new();
        workloads::write_csv(&trace, &mut out).unwrap();
        let back = workloads::read_csv_from(&out[..], std::path::Path::new("back.csv")).unwrap();
        assert_eq!(back.events, trace.events);
        let _ = workloads::validate(&trace);
    }
});
