//! The YAML trace reader: no input panics, wraps, or reads without bound.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = workloads::read_yaml_from(data, std::path::Path::new("fuzz.yaml")) {
        // What reads must write and read back to the same events.
        let mut out = Vec::new();
        workloads::write_yaml(&trace, &mut out).unwrap();
        let back = workloads::read_yaml_from(&out[..], std::path::Path::new("back.yaml")).unwrap();
        assert_eq!(back.events, trace.events);
        let _ = workloads::validate(&trace);
    }
});
