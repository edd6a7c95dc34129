//! A name in a snapshot's bytes that says its stack frames are needed.
//!
//! Stack frames are most of a snapshot's bytes, and the reader skips them unless asked
//! ([`super::SnapshotOptions::keep_frames`]). Two things only they show, both about
//! `torch.compile`'s CUDA graph trees (`torch/_inductor/cudagraph_trees.py`): which
//! entries a checkpoint restore made (the trees set their private pool back to a
//! checkpoint in `apply_checkpoint_execution_state_in_allocator`, through
//! `setCheckpointPoolState`, whose allocations take the checkpointed blocks, not the
//! best fit), and that the trees ran at all when the snapshot no longer shows their
//! pool. [`Scan`] looks for the trees' file name in the bytes as the pickle machine
//! reads them (one substring search, far faster than the parse); the reader reads the
//! file again with frames only when it finds it in a snapshot that shows private pools.
//! (A caller of `torch._C._cuda_setCheckpointPoolState` other than the trees is not
//! looked for: its restores replay as ordinary requests.)

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

use memchr::memmem::Finder;

/// The function of inductor's CUDA graph trees that sets their pool back to a
/// checkpoint (Python frames); its allocations are the restore's.
pub(crate) const RESTORE_FUNCTION: &str = "apply_checkpoint_execution_state_in_allocator";
/// The allocator's own method (C++ frames, `stacks="all"`).
pub(crate) const RESTORE_METHOD: &str = "::setCheckpointPoolState";
/// The file of inductor's CUDA graph trees (`torch.compile(mode="reduce-overhead")`),
/// which defines [`RESTORE_FUNCTION`].
const TREES_FILE: &str = "cudagraph_trees.py";

/// Whether a frame (by its function's name) is a checkpoint restore's.
pub(crate) fn is_restore_frame(name: &str) -> bool {
    name == RESTORE_FUNCTION || name.contains(RESTORE_METHOD)
}

/// Whether a frame (by its file's name) is the CUDA graph trees'.
pub(crate) fn is_trees_frame(filename: &str) -> bool {
    filename.ends_with(TREES_FILE)
}

/// What the reader says about what [`Scan`] found, for a snapshot that shows private
/// pools or none (`shows_pools`), read with stack frames or without (`frames_read`).
pub(crate) fn caveat(seen: Seen, shows_pools: bool, frames_read: bool) -> Option<String> {
    if !seen.trees {
        return None;
    }
    if shows_pools && !frames_read {
        return Some(format!(
            "the snapshot's stack frames show torch.compile's CUDA graph trees ({TREES_FILE}), which set their pool back to checkpoints, but it was not read from a file, so its frames were not read again to find those restores: their allocations replay as ordinary requests of the pool (not exact); give the snapshot as a file"
        ));
    }
    if !shows_pools {
        return Some(format!(
            "the snapshot's stack frames show torch.compile's CUDA graph trees ({TREES_FILE}), but it shows no private pool: the trees' pool was gone when the snapshot was taken (torch._dynamo.reset(), or the compiled function freed), and PyTorch before 2.15 records no pool on trace entries, so the trees' requests replay from the default pools (not exact); take the snapshot while the compiled function is alive, or record the run with tools/record_torch.py"
        ));
    }
    None
}

/// What [`Scan`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The CUDA graph trees' file name.
    pub trees: bool,
}

/// A reader that looks for [`TREES_FILE`] in what passes through it.
pub(crate) struct Scan<R> {
    inner: R,
    finder: Finder<'static>,
    /// The last bytes read (one less than the name), for a name cut in two.
    tail: Vec<u8>,
    seen: Rc<Cell<Seen>>,
}

impl<R: Read> Scan<R> {
    /// `inner`, scanned; `seen` is updated as it is read.
    pub(crate) fn new(inner: R, seen: Rc<Cell<Seen>>) -> Scan<R> {
        Scan {
            inner,
            finder: Finder::new(TREES_FILE.as_bytes()),
            tail: Vec::with_capacity(2 * TREES_FILE.len()),
            seen,
        }
    }

    fn look(&mut self, bytes: &[u8]) {
        if self.seen.get().trees || bytes.is_empty() {
            return;
        }
        let keep = TREES_FILE.len() - 1;
        // A name across the previous read and this one: the tail and this read's head.
        let head = &bytes[..bytes.len().min(keep)];
        self.tail.extend_from_slice(head);
        let found = self.finder.find(&self.tail).is_some() || self.finder.find(bytes).is_some();
        if found {
            self.seen.set(Seen { trees: true });
            return;
        }
        // The new tail: the last `keep` bytes read.
        if bytes.len() >= keep {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - keep..]);
        } else {
            let drop = self.tail.len().saturating_sub(keep);
            self.tail.drain(..drop);
        }
    }
}

impl<R: Read> Read for Scan<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.look(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> Seen {
        let seen = Rc::new(Cell::new(Seen::default()));
        let mut s = Scan::new(io::empty(), Rc::clone(&seen));
        for c in chunks {
            s.look(c);
        }
        seen.get()
    }

    /// The trees' file name is found whole, cut across reads anywhere, one byte at a
    /// time, and nothing else is; restore frames are told by name.
    #[test]
    fn the_name_is_found_across_reads() {
        let text = format!("xx/torch/_inductor/{TREES_FILE}yy");
        let bytes = text.as_bytes();
        let yes = Seen { trees: true };
        for cut in 0..=bytes.len() {
            for cut2 in cut..=bytes.len() {
                let seen = scan(&[&bytes[..cut], &bytes[cut..cut2], &bytes[cut2..]]);
                assert_eq!(seen, yes, "{cut} {cut2}");
            }
        }
        let ones: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(scan(&ones), yes);
        assert_eq!(scan(&[b"cudagraph_trees", b".p", b"y_"]), yes);
        assert_eq!(scan(&[b"cudagraph_trees.p", b"", b"x"]), Seen::default());
        assert_eq!(scan(&[RESTORE_FUNCTION.as_bytes()]), Seen::default());
        let cpp = "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::setCheckpointPoolState";
        assert!(is_restore_frame(RESTORE_FUNCTION) && is_restore_frame(cpp));
        assert!(!is_restore_frame("apply_checkpoint"));
        assert!(is_trees_frame(
            "/usr/lib/python3/site-packages/torch/_inductor/cudagraph_trees.py"
        ));
        assert!(!is_trees_frame("cudagraph_trees.pyc"));
    }
}
