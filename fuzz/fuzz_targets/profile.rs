//! The device profile reader (`--gpu-profile FILE`, `allocsim probe`'s output): no input
//! panics or wraps, and a profile that reads makes a simulated device that replays a
//! small trace without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(profile) = sim::DeviceProfile::parse(text, "fuzz.yaml") {
        let options = profile.to_options();
        let mut device = sim::SimDevice::new(options);
        let mut policy = policies::PolicyConfig::defaults()[0].build().unwrap();
        let trace = workloads::Trace::new(
            "fuzz",
            vec![
                workloads::Event::Alloc {
                    id: workloads::AllocId(0),
                    size_bytes: 3 << 20,
                    stream: 0,
                },
                workloads::Event::Free {
                    id: workloads::AllocId(0),
                },
            ],
        );
        let _ = sim::replay(&trace, policy.as_mut(), &mut device, &Default::default());
    }
});
