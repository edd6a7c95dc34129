//! Temporary profiling harness: replay a generated trace in memory.
use policies::caching::CachingDefaults;
use policies::spec::parse_policy_list;
use sim::{ReplayOptions, SimDevice, SimDeviceOptions};
use workloads::generate::{random, RandomOptions};
#[path = "../../benches/common/baseline.rs"]
mod baseline;

/// CPU time of this thread in seconds (Linux), steadier than the wall clock on a
/// loaded machine.
fn cpu() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let policy = args.get(1).map(String::as_str).unwrap_or("caching");
    let events: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let lifetime: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(50.0);
    let trace = random(&RandomOptions {
        seed: 3,
        events,
        streams: 2,
        mean_lifetime_events: lifetime,
        ..RandomOptions::default()
    })
    .unwrap();
    if policy == "baseline" {
        let mut times = Vec::new();
        for _ in 0..runs {
            let t = cpu();
            let r = baseline::replay_baseline(&trace);
            times.push(cpu() - t);
            std::hint::black_box(r);
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "baseline {:>10} events  median {:>8.2} ms  {:>6.2} M events/s",
            trace.events.len(),
            med * 1e3,
            trace.events.len() as f64 / med / 1e6
        );
        return;
    }
    let specs = parse_policy_list(policy, &CachingDefaults::default()).unwrap();
    for spec in &specs {
        let mut times = Vec::new();
        for _ in 0..runs {
            let mut p = spec.config.build().unwrap();
            let mut d = SimDevice::new(SimDeviceOptions::default());
            let t = cpu();
            let r = sim::replay(&trace, p.as_mut(), &mut d, &ReplayOptions::default()).unwrap();
            times.push(cpu() - t);
            std::hint::black_box(r);
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "{:<40} {:>10} events  median {:>8.2} ms  {:>6.2} M events/s  (min {:.2} max {:.2} ms)",
            spec.label,
            trace.events.len(),
            med * 1e3,
            trace.events.len() as f64 / med / 1e6,
            times[0] * 1e3,
            times[times.len() - 1] * 1e3
        );
    }
}
