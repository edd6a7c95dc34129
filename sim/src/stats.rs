//! Statistics over several runs (traces, seeds, iterations): mean, median, 95th
//! percentile and a 95 % confidence interval of the mean, computed with `statrs`.
//!
//! Definitions (`docs/metrics.md`): the median and the 95th percentile are `statrs`'s
//! order statistics (the median of an even count is the mean of the two middle values;
//! percentiles interpolate between order statistics, Hyndman and Fan's type 8, exact at
//! the data for small counts); the confidence interval is Student's t interval of the
//! mean, `mean ± t(0.975, n−1) · s / √n` with `s` the sample standard deviation. With
//! one value there is no interval.
//!
//! What a table shows of it ([`Spread::shown_interval`]): with fewer than
//! [`MIN_VALUES_FOR_INTERVAL`] values, the lowest and highest value instead (at n = 2,
//! t(0.975, 1) = 12.7: the interval spans ±12.7 standard errors and says nothing a
//! reader can use), and otherwise the interval cut to the values the quantity can take
//! (a mean of bytes is never negative, a utilization never above 100 %), which covers
//! the mean as often as the whole interval does.

use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::{Data, Distribution as _, Max as _, Min as _, OrderStatistics};

/// Fewer values than this show their range rather than a confidence interval of the
/// mean ([`Spread::shown_interval`]): t(0.975, n−1) is 12.7 at n = 2, 4.3 at 3 and 3.2
/// at 4, and 2.8 from 5, where the interval starts to say something.
pub const MIN_VALUES_FOR_INTERVAL: usize = 5;

/// What a table shows of how far the mean of several values may be off
/// ([`Spread::shown_interval`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shown {
    /// One value: nothing.
    Nothing,
    /// Fewer than [`MIN_VALUES_FOR_INTERVAL`] values: the lowest and the highest.
    Range(f64, f64),
    /// The 95 % confidence interval of the mean, cut to what the quantity can take.
    Interval(f64, f64),
}

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
    /// The lowest value.
    pub min: f64,
    /// The highest value.
    pub max: f64,
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
        let (min, max) = (data.min(), data.max());
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
            min,
            max,
            ci95,
        })
    }

    /// What a table shows of how far the mean may be off, for a quantity whose values
    /// lie within `bounds` (`(0.0, f64::INFINITY)` for bytes, `(0.0, 1.0)` for a
    /// utilization): nothing for one value, the range below
    /// [`MIN_VALUES_FOR_INTERVAL`] values, else the 95 % confidence interval of the mean
    /// cut to `bounds`.
    pub fn shown_interval(&self, bounds: (f64, f64)) -> Shown {
        match self.ci95 {
            Some((lo, hi)) if self.n >= MIN_VALUES_FOR_INTERVAL => {
                Shown::Interval(lo.max(bounds.0), hi.min(bounds.1))
            }
            _ if self.n >= 2 => Shown::Range(self.min, self.max),
            _ => Shown::Nothing,
        }
    }

    /// The same spread with every figure passed through `f` (e.g. bytes to GiB).
    pub fn map(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread {
            mean: f(self.mean),
            median: f(self.median),
            p95: f(self.p95),
            min: f(self.min),
            max: f(self.max),
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

    /// Below five values a table shows the range, not the interval (two traces'
    /// reserved peaks of 1.29 and 2.29 GiB have the interval −4.56 to 8.14 GiB); from
    /// five the interval, cut to what the quantity can take (a byte count at 0, a
    /// utilization at 100 %), its untouched side as computed.
    #[test]
    fn what_a_table_shows() {
        const GIB: f64 = (1u64 << 30) as f64;
        let two = Spread::of(&[1.29 * GIB, 2.29 * GIB]).unwrap();
        let (lo, _) = two.ci95.unwrap();
        assert!(lo < 0.0, "{lo}");
        let bytes = (0.0, f64::INFINITY);
        assert_eq!(
            two.shown_interval(bytes),
            Shown::Range(1.29 * GIB, 2.29 * GIB)
        );
        let four = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(four.shown_interval(bytes), Shown::Range(1.0, 4.0));
        let skewed = Spread::of(&[0.0, 0.0, 0.0, 0.0, 5.0]).unwrap();
        let (lo, hi) = skewed.ci95.unwrap();
        assert!(lo < 0.0, "{lo}");
        assert_eq!(skewed.shown_interval(bytes), Shown::Interval(0.0, hi));
        let utilization = Spread::of(&[0.2, 1.0, 1.0, 1.0, 1.0]).unwrap();
        let (lo, hi) = utilization.ci95.unwrap();
        assert!(hi > 1.0, "{hi}");
        assert_eq!(
            utilization.shown_interval((0.0, 1.0)),
            Shown::Interval(lo, 1.0)
        );
        let five = Spread::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let (lo, hi) = five.ci95.unwrap();
        assert_eq!(five.shown_interval(bytes), Shown::Interval(lo, hi));
        assert_eq!(
            Spread::of(&[7.0]).unwrap().shown_interval(bytes),
            Shown::Nothing
        );
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
