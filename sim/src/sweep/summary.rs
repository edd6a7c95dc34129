//! What a sweep's rows say, per trace and across traces: the ranking, the
//! recommendation, the settings that changed nothing, and the spread of utilization,
//! reserved peak and overhead over the traces. Derived from the rows alone, so a merged
//! sweep says the same as one run.

use std::collections::BTreeMap;

use policies::registry;
use policies::spec::split_spec;

use super::record::SweepRecord;
use crate::fit::Fit;
use crate::stats::Spread;

/// A sweep's summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Per trace, in the sweep's order.
    pub traces: Vec<TraceSummary>,
    /// Per (configuration, device), across the traces, in the sweep's order.
    pub groups: Vec<GroupStats>,
}

/// What the rows of one trace say.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSummary {
    /// The trace.
    pub trace: String,
    /// Its rows (indices into the records), best first: those that do not run out of
    /// memory by reserved peak (ties: the smaller device, the default, the earlier row),
    /// then those that do, in row order.
    pub ranking: Vec<usize>,
    /// The recommended row: the first of the ranking if it does not run out of memory.
    pub recommended: Option<usize>,
    /// The default configuration's row on the recommended row's device (or, when no row
    /// fits, on the first device).
    pub default: Option<usize>,
    /// The least total memory the recommended configuration runs in on that device's
    /// model (a bisection, [`crate::fit()`]); `None` until [`super::run`] adds it (and
    /// after [`super::merge`], which has no traces).
    pub needs: Option<Fit>,
    /// Options that changed nothing for this trace.
    pub inert: Vec<Inert>,
}

/// An option whose values changed nothing for a trace: every pair of rows that differ
/// only in it has the same requested, allocated, reserved and charged peaks and the
/// same out-of-memory point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inert {
    /// The policy.
    pub policy: String,
    /// The option.
    pub key: String,
    /// The values compared, as written in the rows (`default` for an option left out).
    pub values: Vec<String>,
    /// What the option does (its help, which says what it needs to act).
    pub help: &'static str,
}

/// One configuration on one device across the sweep's traces.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupStats {
    /// The configuration.
    pub policy: String,
    /// The device.
    pub device: String,
    /// Traces that ran to the end.
    pub fits: usize,
    /// Traces that ran out of memory (not in the spreads: their peaks stop early).
    pub out_of_memory: usize,
    /// Allocated peak ÷ reserved peak.
    pub utilization: Option<Spread>,
    /// Reserved peak, bytes.
    pub reserved_bytes_peak: Option<Spread>,
    /// Reserved peak − requested peak, bytes.
    pub overhead_bytes: Option<Spread>,
}

/// The summary of finished rows ([`super::finish`]), without the bisection.
pub fn summarize(records: &[SweepRecord]) -> Summary {
    let traces = in_order(records, |r| (r.trace.as_str(), ""));
    let traces = traces
        .into_iter()
        .map(|((trace, _), rows)| trace_summary(trace, &rows, records))
        .collect();
    Summary {
        traces,
        groups: group_stats(records),
    }
}

/// Each (configuration, device)'s spread over the traces of `records`, in the order
/// they first appear (also what `compare` prints across its traces).
pub fn group_stats(records: &[SweepRecord]) -> Vec<GroupStats> {
    in_order(records, |r| (r.policy.as_str(), r.device.as_str()))
        .into_iter()
        .map(|((policy, device), rows)| {
            let fit: Vec<&SweepRecord> = rows
                .iter()
                .map(|&i| &records[i])
                .filter(|r| r.fits())
                .collect();
            let spread = |f: &dyn Fn(&SweepRecord) -> Option<f64>| {
                Spread::of(&fit.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            GroupStats {
                policy: policy.to_string(),
                device: device.to_string(),
                fits: fit.len(),
                out_of_memory: rows.len() - fit.len(),
                utilization: spread(&|r| r.utilization_value()),
                reserved_bytes_peak: spread(&|r| Some(r.reserved_bytes_peak as f64)),
                overhead_bytes: spread(&|r| Some(r.overhead_bytes as f64)),
            }
        })
        .collect()
}

/// The rows of each key, the keys in the order they first appear.
fn in_order<'r>(
    records: &'r [SweepRecord],
    key: impl Fn(&'r SweepRecord) -> (&'r str, &'r str),
) -> Vec<((&'r str, &'r str), Vec<usize>)> {
    let mut index: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut groups: Vec<((&str, &str), Vec<usize>)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let k = key(r);
        let at = *index.entry(k).or_insert_with(|| {
            groups.push((k, Vec::new()));
            groups.len() - 1
        });
        groups[at].1.push(i);
    }
    groups
}

fn trace_summary(trace: &str, rows: &[usize], records: &[SweepRecord]) -> TraceSummary {
    let mut ranking: Vec<usize> = rows.to_vec();
    ranking.sort_by_key(|&i| {
        let r = &records[i];
        if r.fits() {
            (
                0,
                r.reserved_bytes_peak,
                r.total_bytes,
                !r.default,
                r.combination,
            )
        } else {
            (1, 0, 0, false, r.combination)
        }
    });
    let recommended = rows.iter().copied().find(|&i| records[i].recommended);
    let device = recommended.map_or_else(
        || rows.first().map(|&i| records[i].device.as_str()),
        |i| Some(records[i].device.as_str()),
    );
    let default = rows
        .iter()
        .copied()
        .find(|&i| records[i].default && Some(records[i].device.as_str()) == device);
    TraceSummary {
        trace: trace.to_string(),
        ranking,
        recommended,
        default,
        needs: None,
        inert: inert(rows, records),
    }
}

/// The options that changed nothing among `rows` (one trace's).
fn inert(rows: &[usize], records: &[SweepRecord]) -> Vec<Inert> {
    type Outcome = (u64, u64, u64, u64, Option<u64>, Option<u64>);
    // Rows alike but for one key: the device and the other settings.
    type Alike<'a> = (&'a str, Vec<(&'a str, &'a str)>);
    let outcome = |r: &SweepRecord| -> Outcome {
        (
            r.requested_bytes_peak,
            r.allocated_bytes_peak,
            r.reserved_bytes_peak,
            r.charged_bytes_peak,
            r.oom_event_index,
            r.oom_requested_bytes,
        )
    };
    let parsed: Vec<(usize, &str, BTreeMap<&str, &str>)> = rows
        .iter()
        .map(|&i| {
            let (name, settings) = split_spec(&records[i].policy);
            (i, name, settings.into_iter().collect())
        })
        .collect();
    // Policies and their keys in the order the rows first show them.
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for (_, name, settings) in &parsed {
        for k in settings.keys() {
            if !keys.contains(&(name, k)) {
                keys.push((name, k));
            }
        }
    }
    let mut out = Vec::new();
    for (name, key) in keys {
        // Rows alike but for `key`: (device, the other settings) -> (value, outcome).
        let mut groups: BTreeMap<Alike<'_>, Vec<(&str, Outcome)>> = BTreeMap::new();
        for (i, n, settings) in &parsed {
            if *n != name {
                continue;
            }
            let others: Vec<(&str, &str)> = settings
                .iter()
                .filter(|(k, _)| **k != key)
                .map(|(k, v)| (*k, *v))
                .collect();
            let value = settings.get(key).copied().unwrap_or("default");
            groups
                .entry((records[*i].device.as_str(), others))
                .or_default()
                .push((value, outcome(&records[*i])));
        }
        let mut values: Vec<&str> = Vec::new();
        let mut varied = false;
        let mut same = true;
        for members in groups.values() {
            let distinct = members
                .iter()
                .map(|(v, _)| v)
                .collect::<std::collections::BTreeSet<_>>();
            if distinct.len() < 2 {
                continue;
            }
            varied = true;
            for (v, _) in members {
                if !values.contains(v) {
                    values.push(v);
                }
            }
            same &= members.windows(2).all(|w| w[0].1 == w[1].1);
        }
        if varied && same {
            let help = registry::find(name)
                .and_then(|e| e.docs().into_iter().find(|d| d.name == key))
                .map_or("", |d| d.help);
            out.push(Inert {
                policy: name.to_string(),
                key: key.to_string(),
                values: values.into_iter().map(str::to_string).collect(),
                help,
            });
        }
    }
    out
}
