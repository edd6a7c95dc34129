//! Predicted against observed: the same trace and policy replayed by the same engine on
//! the simulated device and on a real GPU. The GPU run is `gpu_backend::validate_one`;
//! what does not touch CUDA is here: when the two agree, the one-line summary and the
//! CSV record of `allocsim validate` (`docs/validation.md`).

use std::io;

use serde::Serialize;

use policies::{Policy, PolicyConfig};

use crate::replay::{Replay, ReplayError, ReplayOptions};
use crate::report::write_records;
use crate::{CompareInput, Placed, Relocated, SimDevice, SimDeviceOptions};

/// The predicted side of a validation: `input` replayed under `policy` on the simulated
/// device `model` (with the capacity already in it). A trace that starts mid-run is
/// predicted as the GPU runs it: a GPU cannot place the starting state's segments where
/// the recording says they were and allocates them where its driver puts them
/// (`gpu_backend::CudaDevice::adopt_segment`), so the prediction adopts them through the
/// model's placements too ([`Relocated`], no recorded addresses), and those steer the
/// caching policy's choices by address on both sides ([`Placed`] translating a
/// checkpoint restore's recorded addresses, as on the GPU). Any other trace follows its
/// recorded addresses ([`crate::AddressHints::for_policy`]).
///
/// # Errors
/// As [`crate::replay()`].
pub fn predict(
    input: &CompareInput,
    policy: &mut dyn Policy,
    config: &PolicyConfig,
    model: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<Replay, ReplayError> {
    if input.trace.start.is_some() {
        let mut device = Relocated(SimDevice::new(model.clone()));
        let mut device = Placed::new(&mut device, input.hints.for_policy(config));
        crate::replay(&input.trace, policy, &mut device, options)
    } else {
        let mut device = SimDevice::with_hints(model.clone(), input.hints.for_policy(config));
        crate::replay(&input.trace, policy, &mut device, options)
    }
}

/// One validation: the same trace and policy, predicted and observed.
#[derive(Clone, Debug)]
pub struct Validation {
    /// Trace name.
    pub trace: String,
    /// Policy label.
    pub policy: String,
    /// Free bytes the GPU had for the replay (after the ballast, with `--capacity`), also
    /// the capacity of the predicted device; `None` without a capacity.
    pub capacity_bytes: Option<u64>,
    /// The replay on the simulated device.
    pub predicted: Replay,
    /// The replay on the GPU.
    pub observed: Replay,
    /// Segment operations on the GPU in the observed replay: allocations, frees, page
    /// mappings and unmappings.
    pub segment_ops: u64,
    /// Mean `cuMemAlloc_v2` time in the observed replay.
    pub device_alloc_ns_mean: Option<f64>,
    /// Mean `cuMemFree_v2` time in the observed replay.
    pub device_free_ns_mean: Option<f64>,
    /// Mean page-mapping call time (expandable segments) in the observed replay.
    pub device_map_ns_mean: Option<f64>,
    /// Mean page-unmapping call time in the observed replay.
    pub device_unmap_ns_mean: Option<f64>,
    /// Device name.
    pub device: String,
    /// Driver version (`cuDriverGetVersion`).
    pub driver_version: i32,
    /// The model's spread of usable memory between processes
    /// ([`crate::SimDeviceOptions::usable_spread_bytes`]).
    pub usable_spread_bytes: u64,
    /// When prediction and observation differ: whether a prediction at some capacity
    /// within the spread reproduces the observation ([`crate::boundary::within_driver_variation`]).
    pub within_driver_variation: bool,
}

/// How a prediction compares with its observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Reserved peaks equal, the OOM at the same event, charged peaks within tolerance.
    Agree,
    /// They differ, but the boundary lies within the driver's variation between
    /// processes: a prediction at some capacity within the spread agrees.
    WithinDriverVariation,
    /// They differ, and no capacity within the spread explains it.
    Disagree,
}

impl Verdict {
    /// The CSV value: `agree`, `within_variation` or `disagree`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Agree => "agree",
            Verdict::WithinDriverVariation => "within_variation",
            Verdict::Disagree => "disagree",
        }
    }
}

/// Charged peaks agree when they differ by at most one driver page per live segment.
pub const CHARGED_TOLERANCE_PAGE_BYTES: u64 = 2 << 20;

/// Whether two runs' charged peaks agree within one [`CHARGED_TOLERANCE_PAGE_BYTES`] per
/// live segment at the peak (the more of the two runs').
pub(crate) fn charged_peaks_agree(
    predicted: &crate::metrics::Summary,
    observed: &crate::metrics::Summary,
) -> bool {
    let segments = predicted
        .segment_count_peak
        .max(observed.segment_count_peak)
        .max(1);
    predicted
        .charged_bytes_peak
        .abs_diff(observed.charged_bytes_peak)
        <= segments * CHARGED_TOLERANCE_PAGE_BYTES
}

impl Validation {
    /// |charged predicted − charged observed| at the peaks.
    pub fn charged_difference_bytes(&self) -> u64 {
        self.predicted
            .summary
            .charged_bytes_peak
            .abs_diff(self.observed.summary.charged_bytes_peak)
    }

    /// Whether the charged peaks agree within one 2 MiB page per live segment at the peak.
    pub fn charged_within_tolerance(&self) -> bool {
        charged_peaks_agree(&self.predicted.summary, &self.observed.summary)
    }

    /// Reserved peaks equal, OOM at the same event, charged peaks within tolerance.
    pub fn agrees(&self) -> bool {
        crate::boundary::replays_agree(&self.predicted, &self.observed)
    }

    /// Agree, within the driver's variation, or disagree. A run within the variation
    /// does not agree.
    pub fn verdict(&self) -> Verdict {
        if self.agrees() {
            Verdict::Agree
        } else if self.within_driver_variation {
            Verdict::WithinDriverVariation
        } else {
            Verdict::Disagree
        }
    }
}

/// Runs per verdict, for a summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerdictCounts {
    /// Runs that agree.
    pub agree: usize,
    /// Runs that differ within the driver's variation.
    pub within_variation: usize,
    /// Runs that disagree.
    pub disagree: usize,
}

impl VerdictCounts {
    /// The counts of `rows`.
    pub fn of(rows: &[Validation]) -> VerdictCounts {
        let mut c = VerdictCounts::default();
        for v in rows {
            match v.verdict() {
                Verdict::Agree => c.agree += 1,
                Verdict::WithinDriverVariation => c.within_variation += 1,
                Verdict::Disagree => c.disagree += 1,
            }
        }
        c
    }
}

impl std::fmt::Display for VerdictCounts {
    /// "N of M runs agree, W within the driver's variation, D disagree".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} runs agree, {} within the driver's variation, {} disagree",
            self.agree,
            self.agree + self.within_variation + self.disagree,
            self.within_variation,
            self.disagree
        )
    }
}

/// One row of `allocsim validate`; the fields are the columns, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ValidationRecord<'a> {
    /// Trace name.
    pub trace: &'a str,
    /// Policy label.
    pub policy: &'a str,
    /// Free bytes the GPU had for the replay, empty without a capacity.
    pub capacity_bytes: Option<u64>,
    /// Predicted reserved peak.
    pub reserved_bytes_peak_predicted: u64,
    /// Observed reserved peak.
    pub reserved_bytes_peak_observed: u64,
    /// Predicted charged peak.
    pub charged_bytes_peak_predicted: u64,
    /// Observed charged peak.
    pub charged_bytes_peak_observed: u64,
    /// Predicted OOM event, empty if none (or before the first event: `agrees` and
    /// `verdict` still tell that from none).
    pub oom_event_predicted: Option<u64>,
    /// Observed OOM event, empty if none (or before the first event).
    pub oom_event_observed: Option<u64>,
    /// Segment operations on the GPU.
    pub segment_ops: u64,
    /// Mean `cuMemAlloc_v2` time, whole nanoseconds.
    pub device_alloc_ns_mean: String,
    /// Mean `cuMemFree_v2` time, whole nanoseconds.
    pub device_free_ns_mean: String,
    /// Device name.
    pub device: &'a str,
    /// Driver version.
    pub driver: i32,
    /// Predicted allocated peak.
    pub allocated_bytes_peak_predicted: u64,
    /// Observed allocated peak.
    pub allocated_bytes_peak_observed: u64,
    /// Observed peak number of live segments.
    pub segment_count_peak_observed: u64,
    /// |charged predicted − charged observed|.
    pub charged_difference_bytes: u64,
    /// Whether that is within one page per live segment.
    pub charged_within_tolerance: bool,
    /// Whether prediction and observation agree.
    pub agrees: bool,
    /// Mean page-mapping call time, whole nanoseconds.
    pub device_map_ns_mean: String,
    /// Mean page-unmapping call time, whole nanoseconds.
    pub device_unmap_ns_mean: String,
    /// The model's spread of usable memory between processes.
    pub usable_spread_bytes: u64,
    /// `agree`, `within_variation` (they differ, but a prediction within the spread
    /// agrees) or `disagree`.
    pub verdict: &'static str,
}

/// Nanoseconds rounded to whole ones; empty when nothing was timed.
fn ns(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.0}")).unwrap_or_default()
}

impl<'a> From<&'a Validation> for ValidationRecord<'a> {
    fn from(v: &'a Validation) -> ValidationRecord<'a> {
        let (p, o) = (&v.predicted.summary, &v.observed.summary);
        let oom = |r: &Replay| r.oom.as_ref().and_then(|x| x.event_index);
        ValidationRecord {
            trace: &v.trace,
            policy: &v.policy,
            capacity_bytes: v.capacity_bytes,
            reserved_bytes_peak_predicted: p.reserved_bytes_peak,
            reserved_bytes_peak_observed: o.reserved_bytes_peak,
            charged_bytes_peak_predicted: p.charged_bytes_peak,
            charged_bytes_peak_observed: o.charged_bytes_peak,
            oom_event_predicted: oom(&v.predicted),
            oom_event_observed: oom(&v.observed),
            segment_ops: v.segment_ops,
            device_alloc_ns_mean: ns(v.device_alloc_ns_mean),
            device_free_ns_mean: ns(v.device_free_ns_mean),
            device: &v.device,
            driver: v.driver_version,
            allocated_bytes_peak_predicted: p.allocated_bytes_peak,
            allocated_bytes_peak_observed: o.allocated_bytes_peak,
            segment_count_peak_observed: o.segment_count_peak,
            charged_difference_bytes: v.charged_difference_bytes(),
            charged_within_tolerance: v.charged_within_tolerance(),
            agrees: v.agrees(),
            device_map_ns_mean: ns(v.device_map_ns_mean),
            device_unmap_ns_mean: ns(v.device_unmap_ns_mean),
            usable_spread_bytes: v.usable_spread_bytes,
            verdict: v.verdict().as_str(),
        }
    }
}

/// Writes validations as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_validation_csv<W: io::Write>(rows: &[Validation], writer: W) -> csv::Result<()> {
    write_records(rows.iter().map(ValidationRecord::from), writer)
}

/// One line per validation saying where prediction and observation part, and by how much.
pub fn summary_line(v: &Validation) -> String {
    let (p, o) = (&v.predicted.summary, &v.observed.summary);
    let mut parts = Vec::new();
    if p.reserved_bytes_peak == o.reserved_bytes_peak {
        parts.push(format!(
            "reserved peak {} = observed",
            p.reserved_bytes_peak
        ));
    } else {
        parts.push(format!(
            "reserved peak predicted {} observed {} (off by {})",
            p.reserved_bytes_peak,
            o.reserved_bytes_peak,
            p.reserved_bytes_peak as i128 - o.reserved_bytes_peak as i128
        ));
    }
    parts.push(format!(
        "charged peak predicted {} observed {} (off by {}, {})",
        p.charged_bytes_peak,
        o.charged_bytes_peak,
        p.charged_bytes_peak as i128 - o.charged_bytes_peak as i128,
        if v.charged_within_tolerance() {
            "within a page per segment"
        } else {
            "outside a page per segment"
        }
    ));
    let ev = |r: &Replay| {
        r.oom
            .as_ref()
            .map_or("none".to_string(), |x| match x.event_index {
                Some(i) => format!("event {i}"),
                None => "before the first event".to_string(),
            })
    };
    if v.predicted.oom == v.observed.oom || ev(&v.predicted) == ev(&v.observed) {
        parts.push(format!("OOM {} on both", ev(&v.predicted)));
    } else {
        parts.push(format!(
            "OOM predicted {} observed {}",
            ev(&v.predicted),
            ev(&v.observed)
        ));
    }
    let mark = match v.verdict() {
        Verdict::Agree => String::new(),
        Verdict::WithinDriverVariation => format!(
            "  <- differs within the driver's variation ({} between processes)",
            workloads::size::format_size_human(v.usable_spread_bytes)
        ),
        Verdict::Disagree => "  <- differs".to_string(),
    };
    format!("{} / {}: {}{mark}", v.trace, v.policy, parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Oom, Summary};
    use crate::report::columns;
    use policies::{DeviceStats, PolicyStats};

    fn replay(reserved: u64, charged: u64, segments: u64, oom_at: Option<u64>) -> Replay {
        Replay {
            summary: Summary {
                reserved_bytes_peak: reserved,
                charged_bytes_peak: charged,
                segment_count_peak: segments,
                ..Summary::default()
            },
            oom: oom_at.map(|event_index| Oom {
                event_index: Some(event_index),
                requested_bytes: 1,
                tried_bytes: 1,
                policy: PolicyStats::default(),
                device: DeviceStats::default(),
                message: None,
            }),
            oom_count: u64::from(oom_at.is_some()),
            skipped_event_count: 0,
            live_allocation_count: 0,
            started_by_allocating: 0,
            ignored_call_count: 0,
            missed_restore_count: 0,
            final_policy: PolicyStats::default(),
            final_device: DeviceStats::default(),
        }
    }

    fn validation(predicted: Replay, observed: Replay) -> Validation {
        Validation {
            trace: "t".into(),
            policy: "caching".into(),
            capacity_bytes: Some(1 << 30),
            predicted,
            observed,
            segment_ops: 4,
            device_alloc_ns_mean: Some(1234.4),
            device_free_ns_mean: None,
            device_map_ns_mean: None,
            device_unmap_ns_mean: Some(0.5),
            device: "NVIDIA H100".into(),
            driver_version: 13000,
            usable_spread_bytes: 0,
            within_driver_variation: false,
        }
    }

    /// The validate CSV's columns are ValidationRecord's fields, in the documented order.
    #[test]
    fn validation_columns() {
        assert_eq!(
            columns::<ValidationRecord<'_>>().join(","),
            "trace,policy,capacity_bytes,reserved_bytes_peak_predicted,\
             reserved_bytes_peak_observed,charged_bytes_peak_predicted,\
             charged_bytes_peak_observed,oom_event_predicted,oom_event_observed,segment_ops,\
             device_alloc_ns_mean,device_free_ns_mean,device,driver,\
             allocated_bytes_peak_predicted,allocated_bytes_peak_observed,\
             segment_count_peak_observed,charged_difference_bytes,charged_within_tolerance,\
             agrees,device_map_ns_mean,device_unmap_ns_mean,usable_spread_bytes,verdict"
        );
    }

    /// Agreement needs equal reserved peaks, the OOM at the same event and charged peaks
    /// within one 2 MiB page per live segment.
    #[test]
    fn agreement_and_tolerance() {
        let mib = 1u64 << 20;
        let same = validation(replay(8, 10 * mib, 2, None), replay(8, 14 * mib, 1, None));
        assert!(same.charged_within_tolerance() && same.agrees());
        assert_eq!(same.charged_difference_bytes(), 4 * mib);
        let charged = validation(replay(8, 10 * mib, 1, None), replay(8, 13 * mib, 1, None));
        assert!(!charged.charged_within_tolerance() && !charged.agrees());
        let reserved = validation(replay(8, 0, 1, None), replay(9, 0, 1, None));
        assert!(!reserved.agrees());
        let oom = validation(replay(8, 0, 1, Some(3)), replay(8, 0, 1, Some(4)));
        assert!(!oom.agrees());
        assert_eq!(
            summary_line(&oom),
            "t / caching: reserved peak 8 = observed; charged peak predicted 0 observed 0 \
             (off by 0, within a page per segment); OOM predicted event 3 observed event 4  <- differs"
        );
        assert_eq!(
            summary_line(&same),
            "t / caching: reserved peak 8 = observed; charged peak predicted 10485760 observed \
             14680064 (off by -4194304, within a page per segment); OOM none on both"
        );
    }

    /// A row writes the figures, whole nanoseconds and empty fields where nothing was
    /// measured.
    #[test]
    fn csv_row() {
        let v = validation(replay(8, 10, 2, Some(5)), replay(8, 12, 1, None));
        let mut out = Vec::new();
        write_validation_csv(&[v], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().nth(1),
            Some(
                "t,caching,1073741824,8,8,10,12,5,,4,1234,,NVIDIA H100,13000,0,0,1,2,true,false,,0,0,\
                 disagree"
            )
        );
    }

    /// A run that differs is "within the driver's variation" only when a prediction
    /// within the spread reproduced it; it is never counted as agreeing, and the CSV,
    /// the summary line and the counts say which of the three each run is.
    #[test]
    fn within_variation_is_not_agreement() {
        let mib = 1u64 << 20;
        let mut v = validation(replay(8, 0, 1, None), replay(8, 0, 1, Some(4)));
        v.usable_spread_bytes = 4 * mib;
        v.within_driver_variation = true;
        assert!(!v.agrees());
        assert_eq!(v.verdict(), Verdict::WithinDriverVariation);
        assert!(summary_line(&v).ends_with(
            "OOM predicted none observed event 4  <- differs within the driver's variation \
             (4.00 MiB between processes)"
        ));
        let mut out = Vec::new();
        write_validation_csv(std::slice::from_ref(&v), &mut out).unwrap();
        let row = String::from_utf8(out).unwrap();
        assert!(
            row.lines()
                .nth(1)
                .unwrap()
                .ends_with(",false,,0,4194304,within_variation"),
            "{row}"
        );
        let mut off = v.clone();
        off.within_driver_variation = false;
        let same = validation(replay(8, 0, 1, None), replay(8, 0, 1, None));
        assert_eq!(same.verdict(), Verdict::Agree);
        let counts = VerdictCounts::of(&[v, off, same.clone(), same]);
        assert_eq!(
            counts,
            VerdictCounts {
                agree: 2,
                within_variation: 1,
                disagree: 1
            }
        );
        assert_eq!(
            counts.to_string(),
            "2 of 4 runs agree, 1 within the driver's variation, 1 disagree"
        );
    }
}
