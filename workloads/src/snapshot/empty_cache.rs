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
//! and cannot be recovered; it has no effect on PyTorch's memory either. Where the
//! snapshot's stack frames were read, a run whose releases show
//! `torch.cuda.empty_cache()` is one wherever it falls (the reader's `decide`).

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
    decide: impl FnMut(usize, usize, bool) -> bool,
) -> (Vec<RecordedEntry>, Vec<u64>) {
    let points = empty_cache_points(entries, decide);
    let mut out = entries.to_vec();
    insert_at(&mut out, &points, |_| EMPTY_CACHE);
    (out, source_indexes(entries.len(), &points))
}

/// An inferred `empty_cache` entry.
pub(super) const EMPTY_CACHE: RecordedEntry = RecordedEntry {
    action: Action::EmptyCache,
    addr: 0,
    size: 0,
    stream: 0,
};

/// A segment release: what a run of releases is made of.
pub(super) fn is_release(a: Action) -> bool {
    matches!(a, Action::SegmentFree | Action::SegmentUnmap)
}

/// An entry the rule passes over when it looks for what follows a run of releases
/// (no effect on memory).
pub(super) fn passed_over(a: Action) -> bool {
    matches!(a, Action::Snapshot | Action::Annotate)
}

/// Whether a run of releases followed by `a` (the next entry not [`passed_over`]) lies
/// inside a malloc: the malloc's own segment allocation or mapping, or its `oom`.
pub(super) fn ends_inside_malloc(a: Action) -> bool {
    matches!(a, Action::SegmentAlloc | Action::SegmentMap | Action::Oom)
}

/// Where [`infer_empty_cache_with`] inserts its `empty_cache` entries: the index of
/// the entry each goes before (the first of its run of releases), ascending.
pub(super) fn empty_cache_points(
    entries: &[RecordedEntry],
    mut decide: impl FnMut(usize, usize, bool) -> bool,
) -> Vec<usize> {
    let mut points = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        if is_release(entries[i].action) {
            let start = i;
            let mut end = i;
            while end < entries.len() && is_release(entries[end].action) {
                end += 1;
            }
            let inside_malloc = entries[end..]
                .iter()
                .find(|e| !passed_over(e.action))
                .is_some_and(|e| ends_inside_malloc(e.action));
            if decide(start, end, inside_malloc) {
                points.push(start);
            }
            i = end;
        } else {
            i += 1;
        }
    }
    points
}

/// Inserts one value before each of `v`'s elements at `points` (ascending, each at
/// most once), in place: `fill(element)` of the element it goes before.
pub(super) fn insert_at<T: Copy>(v: &mut Vec<T>, points: &[usize], fill: impl Fn(T) -> T) {
    let Some(&first) = points.first() else {
        return;
    };
    let old = v.len();
    v.resize(old + points.len(), v[first]);
    // Moved from the back: each run of elements up by the insertions before it.
    let (mut read, mut write) = (old, old + points.len());
    for &p in points.iter().rev() {
        let n = read - p;
        v.copy_within(p..read, write - n);
        write -= n;
        write -= 1;
        v[write] = fill(v[p]);
        read = p;
    }
    debug_assert_eq!(read, write);
}

/// For each entry after the insertions at `points` into `len` entries, the index of
/// the entry it came from (an inserted one: the entry it goes before).
pub(super) fn source_indexes(len: usize, points: &[usize]) -> Vec<u64> {
    let mut out: Vec<u64> = (0..len as u64).collect();
    insert_at(&mut out, points, |i| i);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Insertions in place land before their elements, at the ends and side by side.
    #[test]
    fn insertions_in_place() {
        let mut v = vec![10, 11, 12, 13];
        insert_at(&mut v, &[0, 1, 3], |x| x + 100);
        assert_eq!(v, vec![110, 10, 111, 11, 12, 113, 13]);
        let mut v = vec![10, 11];
        insert_at(&mut v, &[], |x| x + 100);
        assert_eq!(v, vec![10, 11]);
        assert_eq!(source_indexes(3, &[2]), vec![0, 1, 2, 2]);
    }

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
