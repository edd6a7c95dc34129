//! The recorded-run JSON reader, the trace and the setup derived from a run (address
//! hints, device, configuration): no input panics or wraps.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.json");
    if let Ok(run) = workloads::read_recorded_json_from(data, path) {
        let _ = run.to_trace();
        let _ = sim::recorded::run_config(&run);
        let device = sim::recorded::run_device(&run, &sim::SimDeviceOptions::default());
        if let Ok(hints) = sim::recorded::address_hints(&run, device.total_bytes) {
            // The hints must never steer the device out of its address space.
            let _ = sim::SimDevice::with_hints(device, hints);
        }
    }
});
