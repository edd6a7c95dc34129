//! Names in a snapshot's bytes that say its stack frames are needed.
//!
//! Stack frames are most of a snapshot's bytes, and the reader skips them unless asked
//! ([`super::SnapshotOptions::keep_frames`]). In a snapshot with private pools, some
//! things only frames show:
//! - which entries a checkpoint restore made: `torch.compile`'s CUDA graph trees
//!   (`torch/_inductor/cudagraph_trees.py`) set their private pool back to a checkpoint
//!   in `apply_checkpoint_execution_state_in_allocator`, through
//!   `setCheckpointPoolState`, whose allocations take the checkpointed blocks, not the
//!   best fit; and which requests are the trees' (their pool is no MemPool);
//! - which segment releases were `torch.cuda.empty_cache()` (`torch.cuda.graph` calls it
//!   just before capturing): a release right before a capture's first segment looks like
//!   the capture's malloc giving memory back, which it does not.
//!
//! And without private pools, that the trees ran at all though their pool is gone.
//! [`Scan`] looks for the trees' file name, `empty_cache` and a frame dict's key in the
//! bytes as the pickle machine reads them (one multi-pattern search, far faster than the
//! parse); the reader reads the file again with frames only when they are needed
//! ([`frames_needed`]). (A caller of `torch._C._cuda_setCheckpointPoolState` other than the
//! trees is not looked for: its restores replay as ordinary requests.)

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

use aho_corasick::AhoCorasick;

/// The function of inductor's CUDA graph trees that sets their pool back to a
/// checkpoint (Python frames); its allocations are the restore's.
pub(crate) const RESTORE_FUNCTION: &str = "apply_checkpoint_execution_state_in_allocator";
/// The allocator's own method (C++ frames, `stacks="all"`).
pub(crate) const RESTORE_METHOD: &str = "::setCheckpointPoolState";
/// The file of inductor's CUDA graph trees (`torch.compile(mode="reduce-overhead")`),
/// which defines [`RESTORE_FUNCTION`].
const TREES_FILE: &str = "cudagraph_trees.py";
/// `torch.cuda.empty_cache` (Python frames, in `torch/cuda/memory.py`).
const EMPTY_CACHE: &str = "empty_cache";
/// A key of every stack frame dict: the snapshot has stack frames at all.
const FRAME_KEY: &str = "filename";
/// Its binding (C++ frames, `stacks="all"`).
const EMPTY_CACHE_BINDING: &str = "THCPModule_emptyCache";

/// Whether a frame is `torch.cuda.empty_cache()`'s (by its function's and file's names).
pub(crate) fn is_empty_cache_frame(name: &str, filename: &str) -> bool {
    (name == EMPTY_CACHE && filename.ends_with("memory.py"))
        || name.starts_with(EMPTY_CACHE_BINDING)
}

/// Whether a frame (by its function's name) is a checkpoint restore's.
pub(crate) fn is_restore_frame(name: &str) -> bool {
    name == RESTORE_FUNCTION || name.contains(RESTORE_METHOD)
}

/// Whether a frame (by its file's name) is the CUDA graph trees'.
pub(crate) fn is_trees_frame(filename: &str) -> bool {
    filename.ends_with(TREES_FILE)
}

/// Whether a snapshot needs its stack frames: it names the CUDA graph trees and shows
/// private pools (their checkpoint restores, and which requests are theirs), or it
/// names `empty_cache` and has a run of releases right before a segment allocation or
/// an `oom` (`ambiguous`: by position a malloc's own, which the frames tell from an
/// `empty_cache()`).
pub(crate) fn frames_needed(seen: Seen, shows_pools: bool, ambiguous: bool) -> bool {
    (seen.trees && shows_pools) || (seen.empty_cache && ambiguous)
}

/// Whether the streamed read hands a snapshot to the whole-trace reader for its stack
/// frames or their absence: [`frames_needed`], or a run of releases right before a
/// segment allocation (`ambiguous`, by position alone) in a snapshot with no frames,
/// which the whole-trace reader's pools may settle and which it warns about otherwise.
pub(crate) fn stream_declines(seen: Seen, shows_pools: bool, ambiguous: bool) -> bool {
    frames_needed(seen, shows_pools, ambiguous) || (ambiguous && !seen.frames)
}

/// The warning for a snapshot without stack frames whose run of releases at entry `at`
/// comes right before a segment allocation (or an `oom`), taken for the malloc's own.
pub(crate) fn no_frames_caveat(at: usize) -> String {
    format!(
        "the snapshot has no stack frames, so it cannot say whether the segment releases at entry {at}, right before a segment allocation, were torch.cuda.empty_cache() or the malloc's own (PyTorch releases inside a malloc when cudaMalloc fails near the device's capacity, or for garbage collection): they replay as the malloc's, and if they were empty_cache() the replay keeps segments PyTorch gave back from there (not exact); record with stack traces (torch.cuda.memory._record_memory_history()'s default)"
    )
}

/// What the reader says about what [`Scan`] found, for a snapshot that shows private
/// pools or none (`shows_pools`), whose frames were needed and not read (`unread`: it
/// did not come from a file).
pub(crate) fn caveat(seen: Seen, shows_pools: bool, unread: bool) -> Option<String> {
    if unread {
        let trees = seen.trees && shows_pools;
        return Some(format!(
            "the snapshot's stack frames show {}, but it was not read from a file, so its frames were not read again to find {}: {} (not exact); give the snapshot as a file",
            if trees { "torch.compile's CUDA graph trees" } else { "torch.cuda.empty_cache() calls" },
            if trees { "the trees' checkpoint restores and which releases torch.cuda.empty_cache() made" } else { "which segment releases they made" },
            if trees {
                "the restores' allocations replay as ordinary requests of the pool, and a release right before a segment allocation is taken for the malloc's"
            } else {
                "a release right before a segment allocation is taken for the malloc's"
            },
        ));
    }
    if seen.trees && !shows_pools {
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
    /// `empty_cache`.
    pub empty_cache: bool,
    /// A stack frame dict's key: the snapshot has frames.
    pub frames: bool,
}

/// A reader that looks for [`TREES_FILE`], [`EMPTY_CACHE`] and [`FRAME_KEY`] in what
/// passes through it.
pub(crate) struct Scan<R> {
    inner: R,
    /// The three names, found in one pass.
    names: &'static AhoCorasick,
    /// The last bytes read (one less than the longer name), for a name cut in two.
    tail: Vec<u8>,
    seen: Rc<Cell<Seen>>,
}

/// One less than the longest name ([`TREES_FILE`]).
const KEEP: usize = TREES_FILE.len() - 1;
const _: () = assert!(TREES_FILE.len() >= EMPTY_CACHE.len() && TREES_FILE.len() >= FRAME_KEY.len());

impl<R: Read> Scan<R> {
    /// `inner`, scanned; `seen` is updated as it is read.
    pub(crate) fn new(inner: R, seen: Rc<Cell<Seen>>) -> Scan<R> {
        static NAMES: std::sync::OnceLock<AhoCorasick> = std::sync::OnceLock::new();
        let names = NAMES.get_or_init(|| {
            AhoCorasick::new([TREES_FILE, EMPTY_CACHE, FRAME_KEY]).expect("three short names")
        });
        Scan {
            inner,
            names,
            tail: Vec::with_capacity(2 * KEEP),
            seen,
        }
    }

    fn look(&mut self, bytes: &[u8]) {
        let mut seen = self.seen.get();
        if (seen.trees && seen.empty_cache && seen.frames) || bytes.is_empty() {
            return;
        }
        // A name across the previous read and this one: the tail and this read's head.
        let head = &bytes[..bytes.len().min(KEEP)];
        self.tail.extend_from_slice(head);
        for hay in [&self.tail[..], bytes] {
            for m in self.names.find_iter(hay) {
                match m.pattern().as_usize() {
                    0 => seen.trees = true,
                    1 => seen.empty_cache = true,
                    _ => seen.frames = true,
                }
            }
        }
        self.seen.set(seen);
        // The new tail: the last `KEEP` bytes read.
        if bytes.len() >= KEEP {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - KEEP..]);
        } else {
            let drop = self.tail.len().saturating_sub(KEEP);
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

    /// Each name is found whole, cut across reads anywhere, one byte at a time, and
    /// nothing else is; restore, trees' and `empty_cache` frames are told by name.
    #[test]
    fn names_are_found_across_reads() {
        let text = format!("xx/torch/_inductor/{TREES_FILE}yy{EMPTY_CACHE}zz{FRAME_KEY}");
        let bytes = text.as_bytes();
        let both = Seen {
            trees: true,
            empty_cache: true,
            frames: true,
        };
        for cut in 0..=bytes.len() {
            for cut2 in cut..=bytes.len() {
                let seen = scan(&[&bytes[..cut], &bytes[cut..cut2], &bytes[cut2..]]);
                assert_eq!(seen, both, "{cut} {cut2}");
            }
        }
        let ones: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(scan(&ones), both);
        assert!(scan(&[b"cudagraph_trees", b".p", b"y_"]).trees);
        assert_eq!(scan(&[b"cudagraph_trees.p", b"", b"x"]), Seen::default());
        assert!(scan(&[b"empty_cach", b"e"]).empty_cache);
        assert!(scan(&[b"file", b"name"]).frames);
        assert_eq!(scan(&[RESTORE_FUNCTION.as_bytes()]), Seen::default());
        let cpp = "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::setCheckpointPoolState";
        assert!(is_restore_frame(RESTORE_FUNCTION) && is_restore_frame(cpp));
        assert!(!is_restore_frame("apply_checkpoint"));
        assert!(is_trees_frame(
            "/usr/lib/python3/site-packages/torch/_inductor/cudagraph_trees.py"
        ));
        assert!(!is_trees_frame("cudagraph_trees.pyc"));
        assert!(is_empty_cache_frame("empty_cache", "/torch/cuda/memory.py"));
        assert!(is_empty_cache_frame(
            "THCPModule_emptyCache(_object*, _object*)",
            ""
        ));
        assert!(!is_empty_cache_frame("empty_cache", "/user/script.py"));
    }
}
