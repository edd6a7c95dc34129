//! Seeded trace generators, for model tests and for exploring policies on
//! workloads nobody recorded: [`random`] here, the structured `training` and
//! `inference` generators ([`TrainingSpec`], [`InferenceSpec`]), and the specs that
//! name and configure any of them ([`spec`], [`Generator`]; `docs/generators.md`).
//!
//! [`random`] draws allocations with random sizes and random lifetimes:
//!
//! 1. At each step, if some live allocation's scheduled death time has come, it is
//!    freed (the earliest death first, ties by id); otherwise a new allocation is made
//!    with the next fresh id (0, 1, 2, ...; ids are never reused), and its death is
//!    scheduled `lifetime` steps later. Each step emits exactly one `alloc` or `free`,
//!    so the step number is the count of such events so far.
//! 2. Generation stops after [`RandomOptions::events`] alloc and free events. Then, if
//!    [`RandomOptions::free_at_end`], the allocations still live are freed in id order.
//! 3. With [`RandomOptions::mark_every`] = `Some(k)`, a `mark` labelled `after N
//!    events` follows every k-th alloc/free event. Marks do not count as events.
//!
//! Each allocation draws, in this order: its size (see [`SizeDistribution`]), its
//! lifetime in steps (geometric on 1, 2, 3, ... with mean
//! [`RandomOptions::mean_lifetime_events`], i.e. [`statrs::distribution::Geometric`]
//! with `p = 1 / mean`), and, when there are several streams, its stream (uniform on
//! `0..streams`).
//!
//! Determinism: the random source is `ChaCha8Rng::seed_from_u64(seed)`, which gives
//! the same numbers on every platform and Rust version, so the same options give the
//! same trace, byte for byte once written. (Sizes and lifetimes go through `ln`/`exp`,
//! which all mainstream platforms compute identically for these inputs; the committed
//! `examples/random_small.csv` is checked against a regeneration by a test.)

use std::collections::BTreeSet;

use rand::distributions::{Open01, OpenClosed01};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use statrs::distribution::{ContinuousCDF, Geometric, Normal};

use crate::trace::{AllocId, Event, Trace};

mod dist;
mod emit;
mod inference;
pub mod spec;
mod training;

pub use dist::{Dist, DistKind};
pub use emit::Scratch;
pub use inference::{Growth, InferenceEvents, InferenceSpec};
pub use spec::Generator;
pub use training::{Layer, Optimizer, TrainingEvents, TrainingSpec};

/// Generated sizes are clamped to at most this many bytes (1 TiB).
pub const MAX_GENERATED_BYTES: u64 = 1 << 40;

/// How allocation sizes are drawn. Every draw is rounded to whole bytes and clamped
/// to `1..=`[`MAX_GENERATED_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeDistribution {
    /// `exp(uniform(ln min, ln max))`: every order of magnitude equally likely, like
    /// the mix of tiny bookkeeping tensors and large activations of real programs.
    LogUniform {
        /// Smallest size (at least 1).
        min_bytes: u64,
        /// Largest size (at least `min_bytes`).
        max_bytes: u64,
    },
    /// `exp(normal(ln median, sigma))`: sizes clustered around a median.
    LogNormal {
        /// The median size (at least 1).
        median_bytes: u64,
        /// Standard deviation of the size's natural logarithm (0 = always the median).
        sigma: f64,
    },
}

/// Options of [`random`]. [`RandomOptions::default`] gives: seed 0, 1000 events,
/// log-uniform sizes from 512 B to 256 MiB, mean lifetime 50 events, 1 stream, no
/// marks, free at end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomOptions {
    /// Seed of the random source; the trace is named `random-seed<seed>`.
    pub seed: u64,
    /// Number of alloc and free events to generate (before the frees at the end).
    pub events: u64,
    /// Allocation sizes.
    pub sizes: SizeDistribution,
    /// Mean lifetime of an allocation, in steps (at least 1).
    pub mean_lifetime_events: f64,
    /// Number of streams (at least 1); allocations pick one of `0..streams` uniformly.
    pub streams: u64,
    /// A `mark` after every this many alloc/free events (`None`: no marks; not 0).
    pub mark_every: Option<u64>,
    /// Free the allocations still live at the end, in id order.
    pub free_at_end: bool,
}

impl Default for RandomOptions {
    fn default() -> Self {
        RandomOptions {
            seed: 0,
            events: 1000,
            sizes: SizeDistribution::LogUniform {
                min_bytes: 512,
                max_bytes: 256 << 20,
            },
            mean_lifetime_events: 50.0,
            streams: 1,
            mark_every: None,
            free_at_end: true,
        }
    }
}

/// Options that [`random`] cannot use; the message says which and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOptions(pub String);

/// Generates a random trace (see the module docs for the algorithm). Events are
/// located by their position (`event N`).
///
/// # Errors
/// Options out of range: sizes of 0 or min > max, a negative or non-finite sigma, a
/// mean lifetime below 1 or not finite, 0 streams, `mark_every` of 0.
pub fn random(options: &RandomOptions) -> Result<Trace, InvalidOptions> {
    let events = RandomEvents::new(options)?.collect();
    Ok(Trace::new(format!("random-seed{}", options.seed), events))
}

/// [`random`]'s events one at a time, made as they are asked for: memory follows the
/// allocations live at once (their scheduled deaths), not the trace's length, so a
/// trace of any length can be written as it is made.
pub struct RandomEvents {
    rng: ChaCha8Rng,
    sizes: SizeSampler,
    lifetime: Geometric,
    options: RandomOptions,
    /// The next step (alloc/free events made so far).
    step: u64,
    /// (death step, id), so the first element is the next to die, ties by id.
    deaths: BTreeSet<(u64, u64)>,
    next_id: u64,
    /// The mark that follows the event just made.
    mark: Option<Event>,
    /// The frees at the end, in id order, once the steps are done.
    end: Option<std::vec::IntoIter<u64>>,
}

impl RandomEvents {
    /// The generator of `options`' trace.
    ///
    /// # Errors
    /// As [`random`].
    pub fn new(options: &RandomOptions) -> Result<RandomEvents, InvalidOptions> {
        let sizes = SizeSampler::new(options.sizes)?;
        let mean = options.mean_lifetime_events;
        if !(mean.is_finite() && mean >= 1.0) {
            return Err(InvalidOptions(format!(
                "mean lifetime must be a number of events of at least 1, got {mean}"
            )));
        }
        let lifetime = Geometric::new(1.0 / mean)
            .map_err(|e| InvalidOptions(format!("mean lifetime {mean}: {e}")))?;
        if options.streams == 0 {
            return Err(InvalidOptions("streams must be at least 1".into()));
        }
        if options.mark_every == Some(0) {
            return Err(InvalidOptions("mark_every must be at least 1".into()));
        }
        Ok(RandomEvents {
            rng: ChaCha8Rng::seed_from_u64(options.seed),
            sizes,
            lifetime,
            options: *options,
            step: 0,
            deaths: BTreeSet::new(),
            next_id: 0,
            mark: None,
            end: None,
        })
    }

    /// The alloc or free of step `step`.
    fn step_event(&mut self, step: u64) -> Event {
        match self.deaths.first().copied() {
            Some((death, id)) if death <= step => {
                self.deaths.remove(&(death, id));
                Event::Free { id: AllocId(id) }
            }
            _ => {
                let size_bytes = self.sizes.sample(&mut self.rng);
                let life = sample_geometric(&self.lifetime, &mut self.rng);
                let stream = if self.options.streams > 1 {
                    self.rng.gen_range(0..self.options.streams)
                } else {
                    0
                };
                let id = self.next_id;
                self.next_id += 1;
                self.deaths.insert((step.saturating_add(life), id));
                Event::Alloc {
                    id: AllocId(id),
                    size_bytes,
                    stream,
                }
            }
        }
    }
}

impl Iterator for RandomEvents {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if let Some(mark) = self.mark.take() {
            return Some(mark);
        }
        if self.step < self.options.events {
            let step = self.step;
            self.step += 1;
            let event = self.step_event(step);
            if let Some(k) = self.options.mark_every {
                if (step + 1) % k == 0 {
                    self.mark = Some(Event::Mark {
                        label: format!("after {} events", step + 1),
                    });
                }
            }
            return Some(event);
        }
        if !self.options.free_at_end {
            return None;
        }
        let end = self.end.get_or_insert_with(|| {
            let mut ids: Vec<u64> = std::mem::take(&mut self.deaths)
                .into_iter()
                .map(|(_, id)| id)
                .collect();
            ids.sort_unstable();
            ids.into_iter()
        });
        end.next().map(|id| Event::Free { id: AllocId(id) })
    }
}

/// A draw from `g` on 1, 2, 3, ... by inversion, `ceil(ln u / ln(1 - p))` with `u` in
/// (0, 1]: the formula of statrs' own sampler, which needs statrs' `rand` feature
/// (off in this workspace).
fn sample_geometric(g: &Geometric, rng: &mut ChaCha8Rng) -> u64 {
    let p = g.p();
    if p >= 1.0 {
        return 1;
    }
    let u: f64 = rng.sample(OpenClosed01);
    // `as` saturates; the largest finite value here is about 2^63 for p near 0.
    ((u.ln() / (-p).ln_1p()).ceil() as u64).max(1)
}

enum SizeSampler {
    Constant(u64),
    LogUniform {
        ln_min: f64,
        ln_max: f64,
        min: u64,
        max: u64,
    },
    LogNormal(Normal),
}

impl SizeSampler {
    fn new(sizes: SizeDistribution) -> Result<SizeSampler, InvalidOptions> {
        match sizes {
            SizeDistribution::LogUniform {
                min_bytes,
                max_bytes,
            } => {
                if min_bytes == 0 || min_bytes > max_bytes {
                    return Err(InvalidOptions(format!(
                        "log-uniform sizes need 1 <= min <= max, got min {min_bytes} and max {max_bytes}"
                    )));
                }
                let (min, max) = (clamp(min_bytes as f64), clamp(max_bytes as f64));
                if min == max {
                    return Ok(SizeSampler::Constant(min));
                }
                Ok(SizeSampler::LogUniform {
                    ln_min: (min as f64).ln(),
                    ln_max: (max as f64).ln(),
                    min,
                    max,
                })
            }
            SizeDistribution::LogNormal {
                median_bytes,
                sigma,
            } => {
                if median_bytes == 0 || !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(InvalidOptions(format!(
                        "log-normal sizes need a median of at least 1 byte and a finite sigma >= 0, got median {median_bytes} and sigma {sigma}"
                    )));
                }
                if sigma == 0.0 {
                    return Ok(SizeSampler::Constant(clamp(median_bytes as f64)));
                }
                let normal = Normal::new((median_bytes as f64).ln(), sigma)
                    .map_err(|e| InvalidOptions(format!("log-normal sizes: {e}")))?;
                Ok(SizeSampler::LogNormal(normal))
            }
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        match *self {
            SizeSampler::Constant(bytes) => bytes,
            SizeSampler::LogUniform {
                ln_min,
                ln_max,
                min,
                max,
            } => {
                let u: f64 = rng.gen();
                clamp((ln_min + u * (ln_max - ln_min)).exp()).clamp(min, max)
            }
            SizeSampler::LogNormal(normal) => {
                let u: f64 = rng.sample(Open01);
                clamp(normal.inverse_cdf(u).exp())
            }
        }
    }
}

/// Rounds to whole bytes within `1..=MAX_GENERATED_BYTES` (NaN gives 1).
fn clamp(bytes: f64) -> u64 {
    (bytes.round() as u64).clamp(1, MAX_GENERATED_BYTES)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use super::*;
    use crate::validate::validate;

    fn csv_bytes(t: &Trace) -> Vec<u8> {
        let mut out = Vec::new();
        crate::csv::write_csv(t, &mut out).unwrap();
        out
    }

    /// The options `examples/random_small.csv` was generated with.
    fn random_small_options() -> RandomOptions {
        RandomOptions {
            seed: 1,
            events: 2000,
            mark_every: Some(500),
            ..RandomOptions::default()
        }
    }

    /// The same options give byte-identical traces; another seed gives another trace.
    #[test]
    fn same_options_same_bytes() {
        let o = RandomOptions::default();
        let a = random(&o).unwrap();
        assert_eq!(csv_bytes(&a), csv_bytes(&random(&o).unwrap()));
        let b = random(&RandomOptions { seed: 1, ..o }).unwrap();
        assert_ne!(a.events, b.events);
        assert_eq!(a.name, "random-seed0");
    }

    /// The committed example `examples/random_small.csv` is exactly what the generator
    /// gives for its options (set UPDATE_EXPECT=1 to rewrite it after a deliberate
    /// change of the generator).
    #[test]
    fn random_small_example_does_not_drift() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/random_small.csv");
        let fresh = csv_bytes(&random(&random_small_options()).unwrap());
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, &fresh).unwrap();
        }
        let committed = std::fs::read(&path).unwrap();
        assert!(
            committed == fresh,
            "{} differs from the generator's output",
            path.display()
        );
    }

    /// A generated trace is valid: no errors, no leaks with free_at_end, the requested
    /// number of alloc/free events, marks where asked, sizes and streams in range.
    #[test]
    fn generated_trace_is_valid_and_shaped_as_asked() {
        let o = RandomOptions {
            seed: 7,
            events: 3000,
            streams: 3,
            mark_every: Some(1000),
            ..RandomOptions::default()
        };
        let t = random(&o).unwrap();
        assert!(validate(&t).is_empty(), "{:?}", validate(&t));
        let allocs = t.alloc_count();
        let frees = t
            .events
            .iter()
            .filter(|e| matches!(e, Event::Free { .. }))
            .count();
        assert_eq!(allocs, frees);
        let marks: Vec<&Event> = t
            .events
            .iter()
            .filter(|e| matches!(e, Event::Mark { .. }))
            .collect();
        assert_eq!(marks.len(), 3);
        assert_eq!(
            marks[0],
            &Event::Mark {
                label: "after 1000 events".into()
            }
        );
        // Everything before the frees at the end: exactly `events` alloc/free events.
        let last_mark = t
            .events
            .iter()
            .rposition(|e| matches!(e, Event::Mark { .. }))
            .unwrap();
        assert_eq!(last_mark + 1 - marks.len(), 3000);
        let mut seen_streams = [false; 3];
        for e in &t.events {
            if let Event::Alloc {
                size_bytes, stream, ..
            } = *e
            {
                assert!((512..=256 << 20).contains(&size_bytes));
                seen_streams[stream as usize] = true;
            }
        }
        assert_eq!(seen_streams, [true; 3]);
        let kept = random(&RandomOptions {
            free_at_end: false,
            ..o
        })
        .unwrap();
        assert!(kept.events.len() < t.events.len());
        assert!(!crate::validate::has_errors(&validate(&kept)));
    }

    /// Lifetimes average about the asked mean and log-normal sizes center on the
    /// median (loose bounds; the seed is fixed, so this is not flaky).
    #[test]
    fn distributions_have_the_asked_centers() {
        let o = RandomOptions {
            seed: 3,
            events: 100_000,
            sizes: SizeDistribution::LogNormal {
                median_bytes: 1 << 20,
                sigma: 1.0,
            },
            mean_lifetime_events: 20.0,
            ..RandomOptions::default()
        };
        let t = random(&o).unwrap();
        let mut born = HashMap::new();
        let mut lifetimes = Vec::new();
        let mut sizes = Vec::new();
        for (i, e) in t.events.iter().enumerate().take(100_000) {
            match *e {
                Event::Alloc { id, size_bytes, .. } => {
                    born.insert(id, i);
                    sizes.push(size_bytes);
                }
                Event::Free { id } => lifetimes.push((i - born[&id]) as f64),
                _ => {}
            }
        }
        let mean = lifetimes.iter().sum::<f64>() / lifetimes.len() as f64;
        assert!((18.0..26.0).contains(&mean), "mean lifetime {mean}");
        sizes.sort_unstable();
        let median = sizes[sizes.len() / 2] as f64;
        assert!(
            (0.9..1.1).contains(&(median / (1 << 20) as f64)),
            "median {median}"
        );
    }

    /// Options out of range are refused with a message, never a panic.
    #[test]
    fn bad_options_are_refused() {
        let d = RandomOptions::default();
        let bad = [
            RandomOptions {
                sizes: SizeDistribution::LogUniform {
                    min_bytes: 0,
                    max_bytes: 5,
                },
                ..d
            },
            RandomOptions {
                sizes: SizeDistribution::LogUniform {
                    min_bytes: 9,
                    max_bytes: 5,
                },
                ..d
            },
            RandomOptions {
                sizes: SizeDistribution::LogNormal {
                    median_bytes: 5,
                    sigma: -1.0,
                },
                ..d
            },
            RandomOptions {
                sizes: SizeDistribution::LogNormal {
                    median_bytes: 5,
                    sigma: f64::NAN,
                },
                ..d
            },
            RandomOptions {
                mean_lifetime_events: 0.5,
                ..d
            },
            RandomOptions {
                mean_lifetime_events: f64::INFINITY,
                ..d
            },
            RandomOptions { streams: 0, ..d },
            RandomOptions {
                mark_every: Some(0),
                ..d
            },
        ];
        for o in bad {
            assert!(random(&o).is_err(), "{o:?}");
        }
    }

    /// Degenerate but valid options work: constant sizes, lifetime 1, huge sizes
    /// clamped to 1 TiB, zero events.
    #[test]
    fn degenerate_options_work() {
        let d = RandomOptions::default();
        let t = random(&RandomOptions {
            sizes: SizeDistribution::LogNormal {
                median_bytes: u64::MAX,
                sigma: 0.0,
            },
            mean_lifetime_events: 1.0,
            events: 10,
            ..d
        })
        .unwrap();
        assert_eq!(
            &t.events[..4],
            &[
                Event::Alloc {
                    id: AllocId(0),
                    size_bytes: MAX_GENERATED_BYTES,
                    stream: 0
                },
                Event::Free { id: AllocId(0) },
                Event::Alloc {
                    id: AllocId(1),
                    size_bytes: MAX_GENERATED_BYTES,
                    stream: 0
                },
                Event::Free { id: AllocId(1) },
            ]
        );
        assert!(random(&RandomOptions { events: 0, ..d })
            .unwrap()
            .events
            .is_empty());
        let same = random(&RandomOptions {
            sizes: SizeDistribution::LogUniform {
                min_bytes: 4096,
                max_bytes: 4096,
            },
            ..d
        })
        .unwrap();
        assert!(same
            .events
            .iter()
            .all(|e| !matches!(e, Event::Alloc { size_bytes, .. } if *size_bytes != 4096)));
    }
}
