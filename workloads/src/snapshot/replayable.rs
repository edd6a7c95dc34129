//! Whether a snapshot's trace can be replayed, and if not, what is missing. Reading a
//! snapshot keeps whatever it holds; converting it to a trace
//! ([`RecordedRun::to_trace`]) refuses what cannot be replayed, with this message. A
//! trace that starts mid-run (a ring buffer that wrapped, a recording started late) is
//! replayable: its starting state is rebuilt (`crate::start`).

use crate::recorded::{Action, RecordedRun};
use crate::size::format_size_human;
use crate::ReadError;

const RECORD_FROM_START: &str = "call torch.cuda.memory._record_memory_history(max_entries=...) \
     before the first CUDA allocation, with max_entries above the number of trace entries";

impl RecordedRun {
    /// Checks that a snapshot's trace can be replayed: it has entries (not
    /// `include_traces=False`, not a bare `memory_snapshot()` list), the actions a
    /// replay needs were not left out with `skip_actions`. A trace that starts mid-run passes: its
    /// starting state is rebuilt from the segments when it becomes a trace
    /// ([`RecordedRun::rebuild_start`]). Runs from `record_torch.py` JSON pass.
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
        // A ring buffer may keep only frees (the end of a program), but not segments
        // created for nothing.
        let created = count(Action::SegmentAlloc) + count(Action::SegmentMap);
        if count(Action::Alloc) == 0 && frees > 0 && created > 0 {
            return Err(skipped("alloc", "it frees blocks and creates segments"));
        }
        if count(Action::FreeCompleted) == 0 && count(Action::FreeRequested) > 0 {
            return Err(skipped("free_completed", "it has 'free_requested' entries"));
        }
        Ok(())
    }
}
