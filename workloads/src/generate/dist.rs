//! Numbers a generator draws (batch sizes, sequence lengths, token counts, scratch
//! sizes and lifetimes): a constant, or a draw from a `statrs` distribution, clamped to
//! optional bounds, rounded to a whole number.
//!
//! Each draw takes one number from the generator's `ChaCha8Rng` (none for a constant)
//! and turns it into a value by the distribution's inverse CDF (`statrs`' own
//! samplers need its `rand` feature, off in this workspace), so a seed gives the same
//! values on every platform.

use rand::distributions::Open01;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use statrs::distribution::{ContinuousCDF, DiscreteCDF, Geometric, LogNormal, Normal, Poisson};

/// Largest mean a Poisson or geometric draw may have (their inversions search up to
/// the value; a bound keeps a spec's few characters from asking for a long search).
pub const MAX_MEAN: f64 = 1e9;

/// A whole number drawn per use. YAML: a number (`512`, or a size such as `4KiB` where
/// the key is in bytes), or a mapping with one distribution and optional bounds:
/// `{uniform: [MIN, MAX]}`, `{normal: [MEAN, STD_DEV]}`, `{lognormal: [MEDIAN, SIGMA]}`,
/// `{poisson: MEAN}`, `{geometric: MEAN}`, each with optional `min: A`, `max: B`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    /// The distribution.
    pub kind: DistKind,
    /// Draws below are raised to this.
    pub min: u64,
    /// Draws above are lowered to this.
    pub max: u64,
}

/// The distributions a [`Dist`] draws from.
#[derive(Clone, Debug, PartialEq)]
pub enum DistKind {
    /// Always this value.
    Constant(u64),
    /// Every whole number of `min..=max` equally likely.
    Uniform {
        /// Smallest value.
        min: u64,
        /// Largest value.
        max: u64,
    },
    /// `statrs::distribution::Normal`, rounded.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation (> 0).
        std_dev: f64,
    },
    /// `statrs::distribution::LogNormal` with `mu = ln median`, rounded.
    LogNormal {
        /// Median (> 0).
        median: f64,
        /// Standard deviation of the natural logarithm (> 0).
        sigma: f64,
    },
    /// `statrs::distribution::Poisson` (0, 1, 2, ...).
    Poisson {
        /// Mean (> 0).
        mean: f64,
    },
    /// `statrs::distribution::Geometric` on 1, 2, 3, ... with `p = 1 / mean`.
    Geometric {
        /// Mean (>= 1).
        mean: f64,
    },
}

impl Dist {
    /// A constant.
    pub const fn constant(value: u64) -> Dist {
        Dist {
            kind: DistKind::Constant(value),
            min: 0,
            max: u64::MAX,
        }
    }

    /// Checks the parameters: the message says what is wrong.
    ///
    /// # Errors
    /// Parameters the distribution does not take, bounds with `min > max`.
    pub fn check(&self) -> Result<(), String> {
        if self.min > self.max {
            return Err(format!("min {} is more than max {}", self.min, self.max));
        }
        match self.kind {
            DistKind::Constant(_) => Ok(()),
            DistKind::Uniform { min, max } if min > max => Err(format!(
                "uniform: the smallest value {min} is more than the largest {max}"
            )),
            DistKind::Uniform { .. } => Ok(()),
            DistKind::Normal { mean, std_dev } => Normal::new(mean, std_dev)
                .map(drop)
                .map_err(|e| format!("normal [{mean}, {std_dev}]: {e}")),
            DistKind::LogNormal { median, sigma } if median > 0.0 && median.is_finite() => {
                LogNormal::new(median.ln(), sigma)
                    .map(drop)
                    .map_err(|e| format!("lognormal [{median}, {sigma}]: {e}"))
            }
            DistKind::LogNormal { median, .. } => Err(format!(
                "lognormal: the median must be above 0, got {median}"
            )),
            DistKind::Poisson { mean } if mean > 0.0 && mean <= MAX_MEAN => Ok(()),
            DistKind::Poisson { mean } => Err(format!(
                "poisson: the mean must be above 0 and at most {MAX_MEAN}, got {mean}"
            )),
            DistKind::Geometric { mean } if (1.0..=MAX_MEAN).contains(&mean) => Ok(()),
            DistKind::Geometric { mean } => Err(format!(
                "geometric: the mean must be at least 1 and at most {MAX_MEAN}, got {mean}"
            )),
        }
    }

    /// The largest value a draw can give (for bounds on a generated trace's length).
    pub fn upper_bound(&self) -> u64 {
        let top = match self.kind {
            DistKind::Constant(v) => v,
            DistKind::Uniform { max, .. } => max,
            _ => u64::MAX,
        };
        top.min(self.max).max(self.min)
    }

    /// One draw. The distribution must have passed [`Dist::check`] (an unchecked one
    /// gives its lower bound).
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        let value = match self.kind {
            DistKind::Constant(v) => v,
            DistKind::Uniform { min, max } => rng.gen_range(min..=max),
            DistKind::Normal { mean, std_dev } => match Normal::new(mean, std_dev) {
                Ok(d) => whole(d.inverse_cdf(rng.sample(Open01))),
                Err(_) => self.min,
            },
            DistKind::LogNormal { median, sigma } => match LogNormal::new(median.ln(), sigma) {
                Ok(d) => whole(d.inverse_cdf(rng.sample(Open01))),
                Err(_) => self.min,
            },
            DistKind::Poisson { mean } => match Poisson::new(mean) {
                // statrs' inversion (a bisection from 0) fails below the CDF at 0.
                Ok(d) => {
                    let u: f64 = rng.sample(Open01);
                    if u <= d.cdf(0) {
                        0
                    } else {
                        d.inverse_cdf(u)
                    }
                }
                Err(_) => self.min,
            },
            DistKind::Geometric { mean } => match Geometric::new(1.0 / mean) {
                Ok(d) => super::sample_geometric(&d, rng),
                Err(_) => self.min,
            },
        };
        value.clamp(self.min, self.max.max(self.min))
    }
}

/// Rounds to a whole number of `0..=u64::MAX` (`as` saturates; NaN gives 0).
fn whole(x: f64) -> u64 {
    x.round() as u64
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Draws stay within their bounds and distributions have the mean they are given.
    #[test]
    fn draws_within_bounds_and_means() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mean_of = |d: &Dist, rng: &mut ChaCha8Rng| {
            (0..20_000).map(|_| d.sample(rng) as f64).sum::<f64>() / 20_000.0
        };
        let d = |kind| Dist {
            kind,
            min: 0,
            max: u64::MAX,
        };
        let poisson = d(DistKind::Poisson { mean: 3.0 });
        assert!((mean_of(&poisson, &mut rng) - 3.0).abs() < 0.1);
        let geometric = d(DistKind::Geometric { mean: 5.0 });
        assert!((mean_of(&geometric, &mut rng) - 5.0).abs() < 0.2);
        let normal = d(DistKind::Normal {
            mean: 100.0,
            std_dev: 10.0,
        });
        assert!((mean_of(&normal, &mut rng) - 100.0).abs() < 0.5);
        let uniform = Dist {
            kind: DistKind::Uniform { min: 10, max: 20 },
            min: 12,
            max: 15,
        };
        for _ in 0..1000 {
            assert!((12..=15).contains(&uniform.sample(&mut rng)));
        }
        assert_eq!(uniform.upper_bound(), 15);
        let lognormal = d(DistKind::LogNormal {
            median: 1000.0,
            sigma: 1.0,
        });
        let mut draws: Vec<u64> = (0..20_001).map(|_| lognormal.sample(&mut rng)).collect();
        draws.sort_unstable();
        assert!((900..1100).contains(&draws[10_000]), "{}", draws[10_000]);
    }

    /// Parameters a distribution does not take are refused with what is wrong.
    #[test]
    fn bad_parameters_refused() {
        let d = |kind| Dist {
            kind,
            min: 0,
            max: u64::MAX,
        };
        for (kind, what) in [
            (
                DistKind::Uniform { min: 5, max: 4 },
                "more than the largest",
            ),
            (
                DistKind::Normal {
                    mean: 1.0,
                    std_dev: -1.0,
                },
                "normal",
            ),
            (
                DistKind::LogNormal {
                    median: 0.0,
                    sigma: 1.0,
                },
                "median",
            ),
            (DistKind::Poisson { mean: 0.0 }, "poisson"),
            (DistKind::Geometric { mean: 0.5 }, "at least 1"),
        ] {
            let e = d(kind).check().unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        let bounds = Dist {
            kind: DistKind::Constant(1),
            min: 3,
            max: 2,
        };
        assert!(bounds
            .check()
            .unwrap_err()
            .contains("min 3 is more than max 2"));
    }
}
