//! Statistics over several runs (traces, seeds, iterations): mean, median, 95th
//! percentile and a 95 % confidence interval of the mean, computed with `statrs`.
//!
//! Definitions (`docs/metrics.md`): the median and the 95th percentile are `statrs`'s
//! order statistics (the median of an even count is the mean of the two middle values;
//! percentiles interpolate between order statistics, Hyndman and Fan's type 8, exact at
//! the data for small counts); the confidence interval is Student's t interval of the
//! mean, `mean ± t(0.975, n−1) · s / √n` with `s` the sample standard deviation. With
//! one value there is no interval.

use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::{Data, Distribution as _, OrderStatistics};

/// A summary of several values of one quantity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// How many values.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// Their median.
    pub median: f64,
    /// Their 95th percentile.
    pub p95: f64,
    /// The 95 % confidence interval of the mean (Student's t); `None` for fewer than two
    /// values.
    pub ci95: Option<(f64, f64)>,
}

impl Spread {
    /// The spread of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let n = values.len();
        let mut data = Data::new(values.to_vec());
        let mean = data.mean().unwrap_or(f64::NAN);
        let median = data.median();
        let p95 = data.quantile(0.95);
        let ci95 = if n >= 2 {
            let sd = data.std_dev().unwrap_or(0.0);
            let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
                .map(|d| d.inverse_cdf(0.975))
                .unwrap_or(f64::NAN);
            let half = t * sd / (n as f64).sqrt();
            Some((mean - half, mean + half))
        } else {
            None
        };
        Some(Spread {
            n,
            mean,
            median,
            p95,
            ci95,
        })
    }

    /// The same spread with every figure passed through `f` (e.g. bytes to GiB).
    pub fn map(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread {
            mean: f(self.mean),
            median: f(self.median),
            p95: f(self.p95),
            ci95: self.ci95.map(|(lo, hi)| (f(lo), f(hi))),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean, median, p95 and the t interval of a known sample (checked by hand: mean 3,
    /// s = √2.5, t(0.975, 4) = 2.776445).
    #[test]
    fn known_sample() {
        let s = Spread::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!((s.n, s.mean, s.median), (5, 3.0, 3.0));
        assert_eq!(s.p95, 5.0);
        let (lo, hi) = s.ci95.unwrap();
        let half = 2.776445 * 2.5f64.sqrt() / 5f64.sqrt();
        assert!((lo - (3.0 - half)).abs() < 1e-5, "{lo}");
        assert!((hi - (3.0 + half)).abs() < 1e-5, "{hi}");
        let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(even.median, 2.5);
    }

    /// One value: no interval; none: no spread; equal values: an interval of width 0.
    #[test]
    fn degenerate_samples() {
        let one = Spread::of(&[7.0]).unwrap();
        assert_eq!(
            (one.mean, one.median, one.p95, one.ci95),
            (7.0, 7.0, 7.0, None)
        );
        assert!(Spread::of(&[]).is_none());
        assert_eq!(Spread::of(&[2.0, 2.0, 2.0]).unwrap().ci95, Some((2.0, 2.0)));
    }
}
