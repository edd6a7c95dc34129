//! A CSV trace replayed under every registered policy and its tested variants
//! (`policies::testing::every_policy`) on a device whose capacity comes from the input,
//! with every invariant checked after every event: no trace panics or wraps a policy.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The last byte picks the capacity, so a CSV trace (ending in a line break) is a seed.
    let Some((&cap, rest)) = data.split_last() else {
        return;
    };
    let Ok(trace) = workloads::read_csv_from(rest, std::path::Path::new("fuzz.csv")) else {
        return;
    };
    if trace.events.len() > 2000 {
        return;
    }
    // Capacities from 0 to 2^63, powers of two and their neighbours.
    let capacity = match cap % 3 {
        0 => 1u64 << (cap / 3 % 64),
        1 => (1u64 << (cap / 3 % 64)) - 1,
        _ => (1u64 << (cap / 3 % 64)) + 4096,
    }
    .min(1 << 63);
    let options = sim::ReplayOptions {
        check_invariants: true,
        continue_after_oom: true,
        ..sim::ReplayOptions::default()
    };
    // Every registered policy and its tested variants: one list for the tests and here.
    for spec in policies::testing::every_policy() {
        let mut policy = spec.config.build().unwrap();
        let mut device =
            sim::SimDevice::new(sim::SimDeviceOptions::default().with_capacity(capacity));
        let _ = sim::replay(&trace, policy.as_mut(), &mut device, &options);
    }
});
