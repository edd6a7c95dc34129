//! The driver's variation at the out-of-memory boundary: whether a run's outcome could
//! change from one process to the next on the same card.
//!
//! On some GPUs the driver does not hold back the same free memory in every process
//! (the H200 keeps 3 276 800 bytes in some processes and one or two 2 MiB pages more in
//! others; the H100 the same in every process): the device profile's
//! `usable_spread_bytes` ([`SimDeviceOptions::usable_spread_bytes`]). A profile's
//! usable memory is one process's figure, so another process may have up to the spread
//! less or more. No single capacity predicts every run near the limit; what can be said
//! exactly is whether the outcome is the same at every capacity within the band:
//!
//! - a run that fits is **marginal** when it runs out at some capacity down to the spread
//!   less ("may run out on this card");
//! - a run that runs out is marginal when it fits at some capacity up to the spread more
//!   ("may fit on this card").
//!
//! Each capacity within the band is replayed (one per 2 MiB page of the spread, and the
//! band's edge), so the answer holds even where fitting is not monotonic in memory.
//! [`within_driver_variation`] asks the same of a GPU observation: does a prediction at
//! some capacity within the band reproduce what the GPU did?

use std::fmt;

use policies::PolicyConfig;
use workloads::size::format_size_human;
use workloads::Trace;

use crate::compare::{CompareError, CompareInput};
use crate::device::{AddressHints, SimDeviceOptions};
use crate::fit::fits;
use crate::replay::{Replay, ReplayOptions};

/// Where a run stands against the driver's variation between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Margin {
    /// The outcome (fits or runs out) is the same at every capacity within the band, or
    /// the card has no measured variation.
    Clear,
    /// The outcome changes within the band.
    Marginal {
        /// Whether the run fits at the capacity given (so it may run out in another
        /// process), or runs out (so it may fit).
        fits: bool,
        /// The card's spread of usable memory between processes.
        spread_bytes: u64,
    },
}

impl Margin {
    /// Whether the outcome changes within the band.
    pub fn is_marginal(&self) -> bool {
        matches!(self, Margin::Marginal { .. })
    }

    /// The CSV value: `marginal` or empty.
    pub fn csv(&self) -> &'static str {
        if self.is_marginal() {
            "marginal"
        } else {
            ""
        }
    }
}

impl fmt::Display for Margin {
    /// The sentence for people: "may run out on this card: the driver's hold-back varies
    /// by up to 4.00 MiB between processes" (or "may fit"), nothing when clear.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Margin::Clear => Ok(()),
            Margin::Marginal { fits, spread_bytes } => write!(
                f,
                "may {} on this card: the driver's hold-back varies by up to {} between \
                 processes",
                if fits { "run out" } else { "fit" },
                format_size_human(spread_bytes)
            ),
        }
    }
}

/// The devices within the band on one side of `device`'s capacity: one per 2 MiB page
/// (the device's page) of the spread, the last at exactly the spread; below when
/// `below`, else above. Empty without a spread; a capacity that would reach 0 is left
/// out.
pub fn devices_within_band(device: &SimDeviceOptions, below: bool) -> Vec<SimDeviceOptions> {
    let spread = device.usable_spread_bytes;
    let page = device.page_bytes.max(1);
    let steps = spread.div_ceil(page);
    (1..=steps)
        .map(|k| (k * page).min(spread))
        .filter_map(|delta| {
            let capacity = if below {
                device
                    .capacity_bytes
                    .checked_sub(delta)
                    .filter(|&c| c > 0)?
            } else {
                device.capacity_bytes.checked_add(delta)?
            };
            Some(SimDeviceOptions {
                capacity_bytes: capacity,
                total_bytes: device.total_bytes.max(capacity),
                ..device.clone()
            })
        })
        .collect()
}

/// Whether `trace` under `config`, which on `device` fits (`fits_here`) or runs out, has
/// the other outcome at some capacity within the driver's variation (see the module
/// docs).
///
/// # Errors
/// As [`fits`].
pub fn margin(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
    fits_here: bool,
) -> Result<Margin, CompareError> {
    for d in devices_within_band(device, fits_here) {
        if fits(trace, hints, config, &d, options)? != fits_here {
            return Ok(Margin::Marginal {
                fits: fits_here,
                spread_bytes: device.usable_spread_bytes,
            });
        }
    }
    Ok(Margin::Clear)
}

/// Whether a prediction and an observation of one trace and policy agree: reserved
/// peaks equal, the out-of-memory at the same event, charged peaks within one 2 MiB page
/// per live segment ([`crate::validation::CHARGED_TOLERANCE_PAGE_BYTES`]).
pub fn replays_agree(predicted: &Replay, observed: &Replay) -> bool {
    let (p, o) = (&predicted.summary, &observed.summary);
    p.reserved_bytes_peak == o.reserved_bytes_peak
        && predicted.oom.as_ref().map(|x| x.event_index)
            == observed.oom.as_ref().map(|x| x.event_index)
        && crate::validation::charged_peaks_agree(p, o)
}

/// Whether a GPU's `observed` replay, which the prediction on `model` did not match, is
/// what the model predicts at some capacity within the driver's variation (the band
/// below and above `model`'s capacity): the prediction and the observation differ, but
/// the boundary lies within the band. False without a spread. Each capacity is
/// predicted as `validate` predicts ([`crate::validation::predict`]: a mid-run trace's
/// state adopted where the model places it).
///
/// # Errors
/// The policy does not build, or a predicted replay stops for a reason other than
/// memory.
pub fn within_driver_variation(
    input: &CompareInput,
    config: &PolicyConfig,
    model: &SimDeviceOptions,
    options: &ReplayOptions,
    observed: &Replay,
) -> Result<bool, CompareError> {
    let label = config.to_string();
    for below in [true, false] {
        for d in devices_within_band(model, below) {
            let mut policy = config.build().map_err(|source| CompareError::Build {
                trace: input.trace.name.clone(),
                policy: label.clone(),
                source,
            })?;
            let predicted = crate::validation::predict(input, policy.as_mut(), config, &d, options)
                .map_err(|source| CompareError::Replay {
                    trace: input.trace.name.clone(),
                    policy: label.clone(),
                    source,
                })?;
            if replays_agree(&predicted, observed) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimDevice;
    use crate::replay::replay;
    use workloads::{AllocId, Event};

    const MIB: u64 = 1 << 20;

    fn alloc(id: u64, size_bytes: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        }
    }

    fn immediate() -> PolicyConfig {
        policies::spec::parse_policy_list("immediate", &Default::default()).unwrap()[0]
            .config
            .clone()
    }

    fn device(capacity_mib: u64, spread_mib: u64) -> SimDeviceOptions {
        SimDeviceOptions {
            capacity_bytes: capacity_mib * MIB,
            total_bytes: 1 << 30,
            usable_spread_bytes: spread_mib * MIB,
            ..SimDeviceOptions::default()
        }
    }

    /// Ten 2 MiB requests live at once: 20 MiB charged, one cuMemAlloc each.
    fn ten_pages() -> Trace {
        Trace::new("t", (0..10).map(|i| alloc(i, 2 * MIB)).collect())
    }

    fn margin_at(capacity_mib: u64, spread_mib: u64) -> Margin {
        let d = device(capacity_mib, spread_mib);
        let t = ten_pages();
        let ok = fits(
            &t,
            &AddressHints::default(),
            &immediate(),
            &d,
            &ReplayOptions::default(),
        )
        .unwrap();
        margin(
            &t,
            &AddressHints::default(),
            &immediate(),
            &d,
            &ReplayOptions::default(),
            ok,
        )
        .unwrap()
    }

    /// The band's devices step one page at a time to exactly the spread, on the side
    /// asked, keep the total at least the capacity, and are none without a spread.
    #[test]
    fn band_devices() {
        let d = device(100, 5);
        let below: Vec<u64> = devices_within_band(&d, true)
            .iter()
            .map(|x| x.capacity_bytes)
            .collect();
        assert_eq!(below, [98 * MIB, 96 * MIB, 95 * MIB]);
        let above: Vec<u64> = devices_within_band(&d, false)
            .iter()
            .map(|x| x.capacity_bytes)
            .collect();
        assert_eq!(above, [102 * MIB, 104 * MIB, 105 * MIB]);
        assert!(devices_within_band(&device(100, 0), true).is_empty());
        let small = devices_within_band(&device(2, 4), true);
        assert!(small.is_empty(), "a capacity of 0 is left out");
        let big = SimDeviceOptions {
            total_bytes: 100 * MIB,
            ..device(100, 4)
        };
        assert!(devices_within_band(&big, false)
            .iter()
            .all(|x| x.total_bytes == x.capacity_bytes));
    }

    /// A run that fits with less than the spread to spare, or runs out by less than it,
    /// is marginal, with the sentence the tables print; one with the spread to spare, or
    /// short by more, is clear, and no run is marginal on a card without a spread.
    #[test]
    fn marginal_within_the_band_only() {
        // 20 MiB needed; spread 4 MiB.
        assert_eq!(
            margin_at(20, 4),
            Margin::Marginal {
                fits: true,
                spread_bytes: 4 * MIB
            }
        );
        assert_eq!(
            margin_at(22, 4),
            Margin::Marginal {
                fits: true,
                spread_bytes: 4 * MIB
            }
        );
        assert_eq!(margin_at(24, 4), Margin::Clear);
        assert_eq!(
            margin_at(18, 4),
            Margin::Marginal {
                fits: false,
                spread_bytes: 4 * MIB
            }
        );
        assert_eq!(
            margin_at(16, 4),
            Margin::Marginal {
                fits: false,
                spread_bytes: 4 * MIB
            }
        );
        assert_eq!(margin_at(15, 4), Margin::Clear);
        assert_eq!(margin_at(20, 0), Margin::Clear);
        assert_eq!(margin_at(18, 0), Margin::Clear);
        assert_eq!(
            margin_at(20, 4).to_string(),
            "may run out on this card: the driver's hold-back varies by up to 4.00 MiB \
             between processes"
        );
        assert_eq!(
            margin_at(18, 4).to_string(),
            "may fit on this card: the driver's hold-back varies by up to 4.00 MiB between \
             processes"
        );
        assert_eq!(margin_at(24, 4).to_string(), "");
        assert_eq!(margin_at(20, 4).csv(), "marginal");
        assert_eq!(margin_at(24, 4).csv(), "");
    }

    /// An observation that ran out where the model fits is within the driver's variation
    /// when a capacity within the band reproduces it exactly, and not when it lies
    /// further away or the card has no spread.
    #[test]
    fn observation_within_the_band() {
        let t = ten_pages();
        let observe = |capacity_mib: u64| {
            let mut p = immediate().build().unwrap();
            let mut dev = SimDevice::new(device(capacity_mib, 0));
            replay(&t, p.as_mut(), &mut dev, &ReplayOptions::default()).unwrap()
        };
        let within = |model: SimDeviceOptions, observed: &Replay| {
            within_driver_variation(
                &CompareInput {
                    trace: t.clone(),
                    hints: AddressHints::default(),
                },
                &immediate(),
                &model,
                &ReplayOptions::default(),
                observed,
            )
            .unwrap()
        };
        // The GPU had 2 MiB less than the model: it ran out at the last request.
        let short = observe(18);
        assert!(short.oom.is_some());
        assert!(!replays_agree(&observe(20), &short));
        assert!(within(device(20, 4), &short));
        assert!(!within(device(20, 0), &short));
        // 6 MiB less: outside a 4 MiB band.
        assert!(!within(device(20, 4), &observe(14)));
        // The GPU had more than the model: the model ran out, the GPU did not.
        assert!(within(device(18, 4), &observe(20)));
        assert!(replays_agree(&observe(20), &observe(24)));
    }
}
