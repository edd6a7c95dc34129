//! The smallest GPU a trace fits on: bisection over the device's memory, to the page.
//!
//! [`fit`] finds, for one trace and one policy, the smallest total memory (what
//! `--capacity` names, in whole driver pages) at which the trace replays without running
//! out of memory. Each try is a full replay on a fresh simulated device of that size,
//! stopped at the first out-of-memory; the trace is borrowed, so many tries share one
//! loaded trace. The answer is checked: it fits, and one page less does not.
//!
//! Fitting need not be monotonic in memory: the caching policy's recovery (freeing its
//! cache and retrying), garbage collection and memory fractions all depend on the size,
//! so a trace may fit at some size and not at a larger one. Bisection assumes
//! monotonicity, so after it [`fit`] tries the pages just above and below the answer;
//! when any try contradicts another (a smaller size fits where a larger one does not),
//! the result says so ([`Fit::monotonic`] false) and gives the smallest size that was
//! seen to fit.

use std::collections::BTreeMap;
use std::sync::Mutex;

use policies::PolicyConfig;
use rayon::prelude::*;
use workloads::{Event, Trace};

use crate::compare::{replay_policy, CompareError};
use crate::device::{AddressHints, SimDeviceOptions};
use crate::replay::ReplayOptions;

/// How to search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitOptions {
    /// The step of the search: capacities are whole multiples of it (the driver's 2 MiB
    /// page).
    pub page_bytes: u64,
    /// Pages checked on each side of the answer after the bisection, to detect a
    /// capacity that does not fit above one that does.
    pub probes: u64,
    /// The largest total tried; above it the trace is reported as not fitting.
    pub max_bytes: u64,
    /// Levels of the bisection replayed ahead, in parallel, where cores would idle
    /// (a batch of fewer bisections than threads: [`speculation_for`]): every size the
    /// next `speculate` halvings may try (2^`speculate` − 1 replays), then the halvings
    /// themselves, which find their answers there. The sizes the bisection did not
    /// reach are not reported, so the result is the same for every value; 0 and 1
    /// replay one size at a time.
    pub speculate: u32,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            page_bytes: 2 << 20,
            probes: 4,
            max_bytes: 1 << 50,
            speculate: 0,
        }
    }
}

/// The levels to replay ahead ([`FitOptions::speculate`]) when `bisections` run
/// side by side on `threads` threads: each gets its share of the threads, and `k`
/// levels take 2^k − 1 of them (0 when there are at least as many bisections as
/// threads).
pub fn speculation_for(bisections: usize, threads: usize) -> u32 {
    let share = threads / bisections.max(1) + 1;
    share.ilog2()
}

/// The smallest device a trace fits on, for one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fit {
    /// The smallest total memory (as `--capacity` takes it) at which the trace replays
    /// without an out-of-memory, in whole pages; `None` when it does not fit even at
    /// [`FitOptions::max_bytes`]. When the search was not monotonic: the smallest size
    /// seen to fit.
    pub min_capacity_bytes: Option<u64>,
    /// Usable bytes of the device at that total (the total less the context and driver
    /// reserve the device keeps back).
    pub min_usable_bytes: Option<u64>,
    /// Peak of the bytes of live requests (from `alloc` to `free`), the trace's own
    /// need whatever the policy.
    pub requested_bytes_peak: u64,
    /// Whether every size tried agreed with a single threshold (no size fit below one
    /// that did not).
    pub monotonic: bool,
    /// Every total tried and whether the trace fit, in increasing size.
    pub tried: Vec<(u64, bool)>,
    /// The device's spread of usable memory between processes
    /// ([`SimDeviceOptions::usable_spread_bytes`]).
    pub usable_spread_bytes: u64,
    /// The smallest total, in whole pages, at which the trace fits with the spread to
    /// spare: it fits at every capacity down to the spread less
    /// ([`crate::boundary::margin`] is clear), so in every process on a card whose
    /// driver holds back up to the spread more. `min_capacity_bytes` plus the spread
    /// rounded up to a page when fitting is monotonic; equal to it without a spread;
    /// `None` when the trace does not fit, or no total up to 64 pages above that is
    /// clear.
    pub min_capacity_with_spread_bytes: Option<u64>,
}

impl Fit {
    /// `min_usable_bytes − requested_bytes_peak`: what the allocator costs on top of what
    /// the program asks for, at the smallest fitting size.
    pub fn overhead_bytes(&self) -> Option<u64> {
        self.min_usable_bytes
            .map(|m| m.saturating_sub(self.requested_bytes_peak))
    }

    /// The overhead as a percentage of the requested peak (`None` without either).
    pub fn overhead_pct(&self) -> Option<f64> {
        match (self.overhead_bytes(), self.requested_bytes_peak) {
            (Some(o), peak) if peak > 0 => Some(o as f64 * 100.0 / peak as f64),
            _ => None,
        }
    }
}

/// The fixed columns of `allocsim fit`'s CSV, in the order; one column per
/// `--gpus` name follows (`docs/metrics.md`).
#[derive(Debug, Default, serde::Serialize)]
pub struct FitRecord<'a> {
    /// Trace name.
    pub trace: &'a str,
    /// Policy label as given.
    pub policy: &'a str,
    /// Smallest total memory that fits, in whole 2 MiB pages (empty if none).
    pub min_capacity_bytes: Option<u64>,
    /// Peak of live requested bytes.
    pub requested_bytes_peak: u64,
    /// Usable bytes at the minimum − requested peak.
    pub overhead_bytes: Option<u64>,
    /// Overhead as a percentage of the requested peak, two decimals.
    pub overhead_pct: String,
    /// Whether every size tried agreed with one threshold.
    pub monotonic: bool,
    /// The device's spread of usable memory between processes.
    pub usable_spread_bytes: u64,
    /// Smallest total that fits with that spread to spare (empty if none).
    pub min_capacity_with_spread_bytes: Option<u64>,
    /// The `--gpus` on which the run fits or runs out with less than the GPU's spread
    /// to spare, `;`-separated (empty when none): their columns may be wrong in another
    /// process.
    pub marginal_gpus: String,
}

impl<'a> FitRecord<'a> {
    /// The record of `fit`, for `trace` under the policy labelled `policy`.
    pub fn of(trace: &'a str, policy: &'a str, fit: &Fit) -> FitRecord<'a> {
        FitRecord {
            trace,
            policy,
            min_capacity_bytes: fit.min_capacity_bytes,
            requested_bytes_peak: fit.requested_bytes_peak,
            overhead_bytes: fit.overhead_bytes(),
            overhead_pct: fit
                .overhead_pct()
                .map(|p| format!("{p:.2}"))
                .unwrap_or_default(),
            monotonic: fit.monotonic,
            usable_spread_bytes: fit.usable_spread_bytes,
            min_capacity_with_spread_bytes: fit.min_capacity_with_spread_bytes,
            marginal_gpus: String::new(),
        }
    }

    /// The same record, naming the GPUs on which the run is marginal.
    pub fn with_marginal_gpus(mut self, names: &[&str]) -> FitRecord<'a> {
        self.marginal_gpus = names.join(";");
        self
    }
}

/// Peak of the bytes of live requests: each `alloc` counts from its event to its `free`
/// (a `free_requested` keeps the memory in use), and for a trace that starts mid-run
/// each block live at its first entry from there to its `free`.
pub fn requested_bytes_peak(trace: &Trace) -> u64 {
    let mut live = std::collections::HashMap::new();
    for b in trace.start.iter().flat_map(|s| s.blocks()) {
        live.insert(b.id, b.requested_bytes);
    }
    let mut now: u64 = live.values().sum();
    let mut peak = now;
    for e in &trace.events {
        match *e {
            Event::Alloc { id, size_bytes, .. } => {
                if let Some(old) = live.insert(id, size_bytes) {
                    now -= old;
                }
                now += size_bytes;
                peak = peak.max(now);
            }
            Event::Free { id } => {
                if let Some(size) = live.remove(&id) {
                    now -= size;
                }
            }
            _ => {}
        }
    }
    peak
}

/// Whether `trace` replays under `config` on `device` without running out of memory
/// (from a mid-run start: and the device holds its starting state).
///
/// # Errors
/// The policy does not build, or the replay stops for a reason other than memory.
pub fn fits(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<bool, CompareError> {
    let options = ReplayOptions {
        continue_after_oom: false,
        ..options.clone()
    };
    let label = config.to_string();
    // A trace that starts mid-run whose starting state the device cannot hold runs out
    // before the first event: it does not fit, as one that runs out later does not.
    let r = replay_policy(trace, hints, config, &label, device, &options, &mut ())?;
    Ok(r.oom.is_none())
}

/// The smallest total memory of a `device`-like GPU on which `trace` replays under
/// `config` without an out-of-memory (see the module docs).
///
/// # Errors
/// As [`fits`].
pub fn fit(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    replay: &ReplayOptions,
    options: &FitOptions,
) -> Result<Fit, CompareError> {
    let page = options.page_bytes.max(1);
    let kept = device.reserved_by_driver_bytes();
    let requested_bytes_peak = requested_bytes_peak(trace);
    // The sizes the search asked for (reported), and the answers replayed ahead.
    let tried: Mutex<BTreeMap<u64, bool>> = Mutex::new(BTreeMap::new());
    let ahead: Mutex<BTreeMap<u64, bool>> = Mutex::new(BTreeMap::new());
    let replay_at = |total: u64| -> Result<bool, CompareError> {
        match device.clone().with_total(total) {
            Some(d) => fits(trace, hints, config, &d, replay),
            None => Ok(false),
        }
    };
    let try_pages = |pages: u64| -> Result<bool, CompareError> {
        let total = pages.saturating_mul(page);
        if let Some(&known) = tried.lock().expect("not poisoned").get(&total) {
            return Ok(known);
        }
        let known = ahead.lock().expect("not poisoned").get(&total).copied();
        let ok = match known {
            Some(ok) => ok,
            None => replay_at(total)?,
        };
        tried.lock().expect("not poisoned").insert(total, ok);
        Ok(ok)
    };
    // Replays ahead every size the next `levels` halvings of (lo, hi) may try. A
    // replay that fails is left for the bisection to meet (and report) if it gets there.
    let replay_ahead = |lo: u64, hi: u64, levels: u32| {
        let mut sizes = Vec::new();
        let mut spans = vec![(lo, hi)];
        for _ in 0..levels {
            let mut next = Vec::new();
            for (l, h) in spans {
                if h - l > 1 {
                    let m = l + (h - l) / 2;
                    sizes.push(m.saturating_mul(page));
                    next.extend([(l, m), (m, h)]);
                }
            }
            spans = next;
        }
        sizes.retain(|t| !tried.lock().expect("not poisoned").contains_key(t));
        sizes.par_iter().for_each(|&total| {
            if let Ok(ok) = replay_at(total) {
                ahead.lock().expect("not poisoned").insert(total, ok);
            }
        });
    };
    // Below the requested peak (plus what the driver keeps) nothing fits: the device
    // charges at least the bytes of every live request.
    let mut lo = (requested_bytes_peak + kept).saturating_sub(1) / page;
    let max_pages = options.max_bytes / page;
    let mut hi = (lo + 1).max((requested_bytes_peak.saturating_mul(2) + kept).div_ceil(page));
    loop {
        if hi > max_pages {
            let tried = tried.into_inner().expect("not poisoned");
            return Ok(Fit {
                min_capacity_bytes: None,
                min_usable_bytes: None,
                requested_bytes_peak,
                monotonic: true,
                tried: tried.into_iter().collect(),
                usable_spread_bytes: device.usable_spread_bytes,
                min_capacity_with_spread_bytes: None,
            });
        }
        if try_pages(hi)? {
            break;
        }
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    while hi - lo > 1 {
        if options.speculate > 1 {
            replay_ahead(lo, hi, options.speculate);
        }
        for _ in 0..options.speculate.max(1) {
            if hi - lo <= 1 {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            if try_pages(mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
    }
    // Check the answer and the pages around it (in parallel: each is a replay).
    let mut around: Vec<u64> = vec![hi, hi - 1];
    for k in 1..=options.probes {
        around.push(hi + k);
        if hi > k + 1 {
            around.push(hi - 1 - k);
        }
    }
    around
        .par_iter()
        .map(|&p| try_pages(p).map(|_| ()))
        .collect::<Result<Vec<()>, CompareError>>()?;
    let tried: Vec<(u64, bool)> = tried
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .collect();
    // Monotonic: no size that does not fit above one that does.
    let first_fit = tried.iter().position(|&(_, ok)| ok);
    let monotonic = first_fit.is_none_or(|i| tried[i..].iter().all(|&(_, ok)| ok));
    let min = first_fit.map(|i| tried[i].0);
    let with_spread = match min {
        Some(m) => with_spread(trace, hints, config, device, replay, m, page)?,
        None => None,
    };
    Ok(Fit {
        min_capacity_bytes: min,
        min_usable_bytes: min.map(|m| m - kept),
        requested_bytes_peak,
        monotonic,
        tried,
        usable_spread_bytes: device.usable_spread_bytes,
        min_capacity_with_spread_bytes: with_spread,
    })
}

/// The smallest total from `min` plus the spread (rounded up to a page) on, at which the
/// trace fits and its margin is clear ([`Fit::min_capacity_with_spread_bytes`]).
fn with_spread(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    replay: &ReplayOptions,
    min: u64,
    page: u64,
) -> Result<Option<u64>, CompareError> {
    let spread = device.usable_spread_bytes;
    if spread == 0 {
        return Ok(Some(min));
    }
    let first = min.saturating_add(spread.div_ceil(page).saturating_mul(page));
    for k in 0..64u64 {
        let total = first.saturating_add(k.saturating_mul(page));
        let Some(d) = device.clone().with_total(total) else {
            continue;
        };
        if fits(trace, hints, config, &d, replay)?
            && !crate::boundary::margin(trace, hints, config, &d, replay, true)?.is_marginal()
        {
            return Ok(Some(total));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::PolicyConfig;
    use workloads::AllocId;

    const MIB: u64 = 1 << 20;

    fn alloc(id: u64, size_bytes: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        }
    }

    fn config(spec: &str) -> PolicyConfig {
        policies::spec::parse_policy_list(spec, &Default::default()).unwrap()[0]
            .config
            .clone()
    }

    /// The answer fits and one page less does not; the requested peak counts live
    /// requests; on a device that keeps a context, the answer grows by exactly that.
    #[test]
    fn finds_the_smallest_page() {
        let t = Trace::new(
            "t",
            vec![
                alloc(0, 100 * MIB),
                alloc(1, 3 * MIB),
                Event::Free { id: AllocId(0) },
                alloc(2, 50 * MIB),
            ],
        );
        let device = SimDeviceOptions::default();
        let f = fit(
            &t,
            &AddressHints::default(),
            &config("immediate"),
            &device,
            &ReplayOptions::default(),
            &FitOptions::default(),
        )
        .unwrap();
        // One cudaMalloc per request: 100 MiB + 4 MiB (3 MiB in whole pages).
        assert_eq!(f.min_capacity_bytes, Some(104 * MIB));
        assert_eq!(f.requested_bytes_peak, 103 * MIB);
        assert_eq!(f.overhead_bytes(), Some(MIB));
        assert!(f.monotonic);
        assert!(f.tried.contains(&(104 * MIB, true)));
        assert!(f.tried.contains(&(102 * MIB, false)));
        let with_context = SimDeviceOptions {
            total_bytes: device.capacity_bytes + 7 * MIB,
            ..device
        };
        let g = fit(
            &t,
            &AddressHints::default(),
            &config("immediate"),
            &with_context,
            &ReplayOptions::default(),
            &FitOptions::default(),
        )
        .unwrap();
        assert_eq!(g.min_capacity_bytes, Some(104 * MIB + 8 * MIB));
        assert_eq!(g.min_usable_bytes, Some(105 * MIB));
    }

    /// A trace that needs more than the largest size tried does not fit, and says so.
    #[test]
    fn too_large_does_not_fit() {
        let t = Trace::new("t", vec![alloc(0, 3 << 30)]);
        let f = fit(
            &t,
            &AddressHints::default(),
            &config("caching"),
            &SimDeviceOptions::default(),
            &ReplayOptions::default(),
            &FitOptions {
                max_bytes: 1 << 30,
                ..FitOptions::default()
            },
        )
        .unwrap();
        assert_eq!(f.min_capacity_bytes, None);
        assert_eq!(f.overhead_bytes(), None);
    }

    /// A caching policy with a memory fraction fits only where the fraction of the
    /// total covers the reserved peak; the search finds that exact page.
    #[test]
    fn memory_fraction_scales_with_the_total() {
        let t = Trace::new("t", vec![alloc(0, 64 * MIB)]);
        let f = fit(
            &t,
            &AddressHints::default(),
            &config("caching:memory_fraction=0.5"),
            &SimDeviceOptions::default(),
            &ReplayOptions::default(),
            &FitOptions::default(),
        )
        .unwrap();
        assert_eq!(f.min_capacity_bytes, Some(128 * MIB));
        assert!(f.monotonic);
    }

    /// On a card whose usable memory varies by 4 MiB between processes, the smallest
    /// total that fits with that to spare is the minimum plus 4 MiB: at it the run is
    /// clear, at the minimum it is marginal; without a spread the two are equal.
    #[test]
    fn capacity_with_the_spread_to_spare() {
        let t = Trace::new("t", (0..10).map(|i| alloc(i, 2 * MIB)).collect());
        let device = SimDeviceOptions {
            usable_spread_bytes: 3 * MIB,
            ..SimDeviceOptions::default()
        };
        let f = fit(
            &t,
            &AddressHints::default(),
            &config("immediate"),
            &device,
            &ReplayOptions::default(),
            &FitOptions::default(),
        )
        .unwrap();
        assert_eq!(f.min_capacity_bytes, Some(20 * MIB));
        assert_eq!(f.usable_spread_bytes, 3 * MIB);
        assert_eq!(f.min_capacity_with_spread_bytes, Some(24 * MIB));
        let at = |total: u64| device.clone().with_total(total).unwrap();
        let margin = |total: u64| {
            crate::boundary::margin(
                &t,
                &AddressHints::default(),
                &config("immediate"),
                &at(total),
                &ReplayOptions::default(),
                true,
            )
            .unwrap()
        };
        assert!(margin(20 * MIB).is_marginal());
        assert!(margin(22 * MIB).is_marginal());
        assert!(!margin(24 * MIB).is_marginal());
        let record = FitRecord::of("t", "immediate", &f).with_marginal_gpus(&["h200", "x"]);
        assert_eq!(record.marginal_gpus, "h200;x");
        assert_eq!(record.min_capacity_with_spread_bytes, Some(24 * MIB));
        let g = fit(
            &t,
            &AddressHints::default(),
            &config("immediate"),
            &SimDeviceOptions::default(),
            &ReplayOptions::default(),
            &FitOptions::default(),
        )
        .unwrap();
        assert_eq!(g.min_capacity_with_spread_bytes, g.min_capacity_bytes);
    }

    /// Replaying ahead changes nothing in the answer: on pseudo-random traces, under
    /// every policy and caching options whose fit depends on the size (memory fraction,
    /// garbage collection), each level of speculation gives the same `Fit` as one size
    /// at a time, the sizes tried included.
    #[test]
    fn speculation_gives_the_same_fit() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3 {
            let mut events = Vec::new();
            let mut live: Vec<u64> = Vec::new();
            for id in 0..200u64 {
                events.push(alloc(id, (next() % (64 * MIB)).max(1)));
                live.push(id);
                if next() % 3 == 0 {
                    let at = (next() % live.len() as u64) as usize;
                    events.push(Event::Free {
                        id: AllocId(live.swap_remove(at)),
                    });
                }
            }
            let t = Trace::new("t", events);
            let mut specs = policies::testing::every_policy();
            specs.push(
                policies::spec::parse_policy(
                    "caching:garbage_collection_threshold=0.6,memory_fraction=0.8",
                    &Default::default(),
                )
                .unwrap(),
            );
            for spec in &specs {
                let at = |speculate| {
                    fit(
                        &t,
                        &AddressHints::default(),
                        &spec.config,
                        &SimDeviceOptions::default(),
                        &ReplayOptions::default(),
                        &FitOptions {
                            speculate,
                            ..FitOptions::default()
                        },
                    )
                    .unwrap()
                };
                let one = at(0);
                for speculate in [1, 2, 3, 5] {
                    assert_eq!(at(speculate), one, "{}, speculate {speculate}", spec.label);
                }
            }
        }
    }

    /// Each bisection's share of the threads decides the levels replayed ahead.
    #[test]
    fn speculation_follows_the_idle_threads() {
        assert_eq!(speculation_for(1, 16), 4);
        assert_eq!(speculation_for(4, 16), 2);
        assert_eq!(speculation_for(16, 16), 1);
        assert_eq!(speculation_for(64, 16), 0);
        assert_eq!(speculation_for(1, 2), 1);
        assert_eq!(speculation_for(0, 1), 1);
    }
}
