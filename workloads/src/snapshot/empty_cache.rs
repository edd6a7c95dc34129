//! Inferring `torch.cuda.empty_cache()` calls, which snapshots do not record.
//!
//! They record what such a call does: a run of consecutive
//! `segment_free`/`segment_unmap` entries. The allocator also releases segments inside
//! a malloc (garbage collection, the retry before an OOM), and those runs are always
//! followed by the malloc's `segment_alloc`/`segment_map`, or by its `oom`. So a run of
//! `segment_free`/`segment_unmap` entries whose next entry (skipping `snapshot` and
//! `annotate` entries) is not `segment_alloc`, `segment_map` or `oom` (or that ends the
//! trace) is taken as an `empty_cache` call, and an [`Action::EmptyCache`] entry is
//! inserted before the run. An `empty_cache` call that released nothing left no trace
//! and cannot be recovered; it has no effect on PyTorch's memory either.

use crate::recorded::{Action, RecordedEntry};

/// Inserts an [`Action::EmptyCache`] entry before every run of
/// `segment_free`/`segment_unmap` entries that no `segment_alloc`, `segment_map` or
/// `oom` follows (skipping entries without effect); see the module docs. Returns the
/// new entries and, for each, the index of the input entry it came from (an inserted
/// entry gets the index of the run's first entry).
pub fn infer_empty_cache(entries: &[RecordedEntry]) -> (Vec<RecordedEntry>, Vec<u64>) {
    infer_empty_cache_with(entries, |_, _, inside_malloc| !inside_malloc)
}

/// [`infer_empty_cache`] with the decision left to `decide(start, end, inside_malloc)`
/// for each run of releases `entries[start..end]` (`inside_malloc`: what the rule above
/// says): an entry is inserted before the run when it returns true. What the pool of
/// each entry tells ([`super::pools`]) refines the rule: a private pool's own
/// `emptyCache` is no `empty_cache()`, and a malloc routed to a private pool gives back
/// no other pool's segments.
pub(super) fn infer_empty_cache_with(
    entries: &[RecordedEntry],
    mut decide: impl FnMut(usize, usize, bool) -> bool,
) -> (Vec<RecordedEntry>, Vec<u64>) {
    let releases = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let mut out = Vec::with_capacity(entries.len());
    let mut indexes = Vec::with_capacity(entries.len());
    let mut i = 0;
    while i < entries.len() {
        if releases(entries[i].action) {
            let start = i;
            let mut end = i;
            while end < entries.len() && releases(entries[end].action) {
                end += 1;
            }
            let next = entries[end..]
                .iter()
                .find(|e| !matches!(e.action, Action::Snapshot | Action::Annotate))
                .map(|e| e.action);
            let inside_malloc = matches!(
                next,
                Some(Action::SegmentAlloc | Action::SegmentMap | Action::Oom)
            );
            if decide(start, end, inside_malloc) {
                out.push(RecordedEntry {
                    action: Action::EmptyCache,
                    addr: 0,
                    size: 0,
                    stream: 0,
                });
                indexes.push(start as u64);
            }
            for (k, e) in entries.iter().enumerate().take(end).skip(start) {
                out.push(*e);
                indexes.push(k as u64);
            }
            i = end;
        } else {
            out.push(entries[i]);
            indexes.push(i as u64);
            i += 1;
        }
    }
    (out, indexes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Releases inside a malloc (followed by segment_alloc, segment_map or oom, past
    /// snapshots and annotations) are not empty_cache calls; one at the very end is.
    #[test]
    fn empty_cache_inference_rule() {
        let e = |action: Action| RecordedEntry {
            action,
            addr: 0,
            size: 0,
            stream: 0,
        };
        let (out, indexes) = infer_empty_cache(&[
            e(Action::SegmentFree),
            e(Action::Snapshot),
            e(Action::SegmentAlloc),
            e(Action::SegmentUnmap),
            e(Action::Annotate),
            e(Action::SegmentMap),
            e(Action::SegmentFree),
            e(Action::Oom),
            e(Action::SegmentFree),
            e(Action::SegmentUnmap),
            e(Action::Alloc),
            e(Action::SegmentFree),
        ]);
        let actions: Vec<&str> = out.iter().map(|e| e.action.name()).collect();
        assert_eq!(
            actions,
            vec![
                "segment_free",
                "snapshot",
                "segment_alloc",
                "segment_unmap",
                "annotate",
                "segment_map",
                "segment_free",
                "oom",
                "empty_cache",
                "segment_free",
                "segment_unmap",
                "alloc",
                "empty_cache",
                "segment_free",
            ]
        );
        assert_eq!(indexes, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 11]);
    }
}
