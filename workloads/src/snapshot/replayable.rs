//! Whether a snapshot's trace can be replayed from an empty allocator, and if not,
//! what is missing. Reading a snapshot keeps whatever it holds (a later step may
//! rebuild the allocator's state from its segments); converting it to a trace
//! ([`RecordedRun::to_trace`]) refuses what cannot be replayed, with this message.

use std::collections::HashMap;

use crate::recorded::{Action, RecordedEntry, RecordedRun, RecordedSegment};
use crate::size::format_size_human;
use crate::ReadError;

const RECORD_FROM_START: &str = "call torch.cuda.memory._record_memory_history(max_entries=...) \
     before the first CUDA allocation, with max_entries above the number of trace entries";

impl RecordedRun {
    /// Checks that a snapshot's trace replays from an empty allocator: it has entries
    /// (not `include_traces=False`, not a bare `memory_snapshot()` list), the actions a
    /// replay needs were not left out with `skip_actions`, and it accounts for every
    /// segment the snapshot lists (recording started before the first allocation and
    /// the ring buffer never wrapped), and no entry belongs to a private memory pool
    /// (not replayed yet). Runs from `record_torch.py` JSON pass.
    ///
    /// # Errors
    /// A [`ReadErrorKind::Invalid`](crate::ReadErrorKind::Invalid) error saying what
    /// is missing and how to record it.
    pub fn check_replayable(&self) -> Result<(), ReadError> {
        let Some(info) = &self.snapshot else {
            return Ok(());
        };
        let invalid =
            |location: Option<String>, m: String| ReadError::invalid(&self.path, location, m);
        let count = |a: Action| self.entries.iter().filter(|e| e.action == a).count();
        let reserved = self
            .segments
            .iter()
            .fold(0u64, |s, x| s.saturating_add(x.total_size));
        let state = format!(
            "{} segment(s), {} reserved",
            self.segments.len(),
            format_size_human(reserved)
        );
        if !info.traced {
            return Err(invalid(
                None,
                format!(
                    "the snapshot holds no trace, only the allocator's state when it was taken ({state}): \
                     it was taken without memory history (torch.cuda.memory_snapshot(), or \
                     include_traces=False), so there is nothing to replay ({RECORD_FROM_START}, \
                     and save it with torch.cuda.memory._dump_snapshot)"
                ),
            ));
        }
        if self.entries.is_empty() && !self.segments.is_empty() {
            return Err(invalid(
                None,
                format!(
                    "the trace of device {} has no entries but the snapshot lists {state}: memory \
                     history was not recorded on this device, or with include_traces=False ({RECORD_FROM_START})",
                    info.device
                ),
            ));
        }
        let skipped = |action: &str, why: &str| {
            invalid(
                None,
                format!(
                    "the trace has no '{action}' entries though {why}: it was recorded with \
                     skip_actions leaving out '{action}', which a replay needs (record without skip_actions)"
                ),
            )
        };
        let frees = count(Action::FreeRequested) + count(Action::FreeCompleted);
        if count(Action::Alloc) == 0 && frees > 0 {
            return Err(skipped("alloc", "it frees blocks"));
        }
        if count(Action::FreeCompleted) == 0 && count(Action::FreeRequested) > 0 {
            return Err(skipped("free_completed", "it has 'free_requested' entries"));
        }
        let segment_ops = count(Action::SegmentAlloc) + count(Action::SegmentMap);
        if segment_ops == 0 && count(Action::Alloc) > 0 && !self.segments.is_empty() {
            return Err(invalid(
                None,
                format!(
                    "the trace allocates blocks but has no 'segment_alloc' or 'segment_map' entries, \
                     while the snapshot lists {state}: the recording started after its segments were \
                     allocated, or skip_actions left out 'segment_alloc', so it cannot be replayed \
                     from an empty allocator ({RECORD_FROM_START}, without skip_actions)"
                ),
            ));
        }
        if let Some(&(entry, pool)) = info.entry_pools.first() {
            return Err(invalid(
                Some(format!("entry {entry}")),
                format!(
                    "the entry belongs to the private memory pool {pool:?} (a CUDA graph or \
                     torch.cuda.MemPool), and {} entries do: replaying private pools is not \
                     supported yet, and replaying them in the default pool would be wrong",
                    info.entry_pools.len()
                ),
            ));
        }
        check_complete(
            &self.path,
            &self.entries,
            &self.source_indexes,
            &self.segments,
        )
    }
}

/// Refuses a trace that does not account for the snapshot's segments (late start or
/// wrapped ring buffer).
fn check_complete(
    path: &std::path::Path,
    entries: &[RecordedEntry],
    source_indexes: &[u64],
    segments: &[RecordedSegment],
) -> Result<(), ReadError> {
    let refuse = |location: Option<String>, what: String| {
        ReadError::invalid(
            path,
            location,
            format!(
                "{what}: the recording started after allocations existed or its ring buffer wrapped, so it \
                 cannot be replayed from an empty allocator ({RECORD_FROM_START})"
            ),
        )
    };
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut mapped: u64 = 0;
    for (index, e) in entries.iter().enumerate() {
        let problem = match e.action {
            Action::SegmentAlloc => live.insert(e.addr, e.size).map(|_| {
                format!(
                    "segment_alloc at {:#x}, a segment that is already live",
                    e.addr
                )
            }),
            Action::SegmentFree => match live.remove(&e.addr) {
                Some(_) => None,
                None => Some(format!(
                    "segment_free of {:#x}, a segment the trace never allocated",
                    e.addr
                )),
            },
            Action::SegmentMap => {
                mapped = mapped.saturating_add(e.size);
                None
            }
            Action::SegmentUnmap => match mapped.checked_sub(e.size) {
                Some(rest) => {
                    mapped = rest;
                    None
                }
                None => Some("segment_unmap of more bytes than the trace mapped".to_string()),
            },
            _ => None,
        };
        if let Some(what) = problem {
            let at = source_indexes.get(index).copied().unwrap_or(index as u64);
            return Err(refuse(Some(format!("entry {at}")), what));
        }
    }
    let listed: HashMap<u64, u64> = segments
        .iter()
        .filter(|s| !s.is_expandable)
        .map(|s| (s.address, s.total_size))
        .collect();
    let listed_mapped = segments
        .iter()
        .filter(|s| s.is_expandable)
        .fold(0u64, |sum, s| sum.saturating_add(s.total_size));
    if live != listed {
        let bytes = |m: &HashMap<u64, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
        return Err(refuse(
            None,
            format!(
                "the trace leaves {} segment(s) of {} but the snapshot lists {} of {}",
                live.len(),
                format_size_human(bytes(&live)),
                listed.len(),
                format_size_human(bytes(&listed))
            ),
        ));
    }
    if mapped != listed_mapped {
        return Err(refuse(
            None,
            format!(
                "the trace leaves {} mapped in expandable segments but the snapshot lists {}",
                format_size_human(mapped),
                format_size_human(listed_mapped)
            ),
        ));
    }
    Ok(())
}
