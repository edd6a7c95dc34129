//! Writes a PyTorch-2.11-shaped snapshot pickle of N trace entries whose live state is
//! flat (one 2 GiB segment, up to 512 live blocks), as it goes: constant memory, about
//! 60 bytes per entry (80 with `--wrapped`), 5 to 8 M entries a second of CPU
//! (`tools/flat_snapshot.py` writes the same bytes at about 100 k entries a second).
//!
//! ```sh
//! cargo run --release -p workloads --example flat_snapshot -- N OUT.pickle [--wrapped] [--pools [--pool-ids]]
//! ```
//!
//! Without `--wrapped`: the snapshot `tools/flat_snapshot.py N OUT` writes, byte for
//! byte: the segment allocated first, then allocations and frees of up to 512 live
//! blocks in it (one free in 7 recorded as `free_requested`, then `free_completed`),
//! all freed at the end; the final segments list that segment, free. It replays from
//! an empty allocator.
//!
//! With `--wrapped`: what PyTorch's ring buffer keeps of a longer run of the same kind
//! (`_record_memory_history(max_entries=N)` after it wrapped): the last N entries of a
//! run whose first 20 000 entries (the segment's allocation among them) are gone, every
//! free recorded as `free_requested` then `free_completed` (as PyTorch records them),
//! blocks of 1 to 4 MiB (the large pool's), and the blocks live at the end left live;
//! the final segments list the segment with its live blocks. Its replay starts from the
//! state rebuilt at its first entry. The run is simulated twice (the final segments
//! come first in the file), the first time without writing.
//!
//! With `--pools`: the run without `--wrapped`, with a private pool, as PyTorch 2.11
//! records a CUDA graph's (no `pool_id` on entries: the pool is known by address from
//! the final segments): a second 2 GiB segment, of pool `(1, 0)`, allocated after the
//! first, and in one block of 64 steps out of 16 the allocations and frees are those of
//! 512 more slots in it (a capture, each a run of the pool's requests); all freed at the
//! end, both segments listed, free. Its replay routes each run to the pool.
//!
//! With `--wrapped --pools`: the wrapped run with the private pool: both segments'
//! allocations are among the entries lost, the pool's frees are recorded as PyTorch
//! records them too, and the blocks live at the end are left live in both segments,
//! listed. Its replay starts from the state rebuilt at its first entry, the pool's
//! segment in the pool, live then.
//!
//! With `--pool-ids` (with `--pools`): every entry carries `pool_id`, as PyTorch 2.15
//! records them (`(1, 0)` for the pool's entries, `(0, 0)` for the others): the pool of
//! each request is read from its entry, not told from the final segments.
//!
//! `docs/performance.md` ("Snapshots, late night", "Snapshots, early morning") replays
//! these to show memory flat in the file's length.

use std::io::{self, Write};

const BASE: u64 = 0x7F00_0000_0000;
const SEG: u64 = 2 << 30;
const SLOT: u64 = 4 << 20;
const SLOTS: usize = 512;
/// Entries of a `--wrapped` run that the ring buffer lost.
const LOST: u64 = 20_000;
/// The private pool's segment (`--pools`), right after the default one.
const POOL_BASE: u64 = BASE + SEG;
/// Steps in a block of `--pools` steps; the first of every [`PHASES`] is a capture's.
const PHASE: u64 = 64;
const PHASES: u64 = 16;

/// The pickle, as `tools/flat_snapshot.py` writes it.
struct Out<W: Write> {
    out: W,
    memo: u32,
    /// Memo slots of the keys and key-like strings written (few: a short list).
    keys: Vec<(&'static str, u32)>,
    /// Memo slots of an entry's keys and actions, by [`Out::key_at`]'s id.
    cached: [Option<u32>; 16],
}

impl<W: Write> Out<W> {
    #[inline]
    fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)
    }

    fn memoize(&mut self) -> io::Result<u32> {
        self.memo += 1;
        self.bytes(&[0x94])?;
        Ok(self.memo - 1)
    }

    fn get(&mut self, slot: u32) -> io::Result<()> {
        match u8::try_from(slot) {
            Ok(s) => self.bytes(&[b'h', s]),
            Err(_) => {
                let b = slot.to_le_bytes();
                self.bytes(&[b'j', b[0], b[1], b[2], b[3]])
            }
        }
    }

    fn short(&mut self, text: &str) -> io::Result<()> {
        self.bytes(&[0x8c, text.len() as u8])?;
        self.bytes(text.as_bytes())
    }

    /// [`Out::key`] with its memo slot cached under `id` (an entry's keys: no search).
    #[inline]
    fn key_at(&mut self, id: usize, k: &'static str) -> io::Result<()> {
        if let Some(slot) = self.cached[id] {
            return self.get(slot);
        }
        self.key(k)?;
        self.cached[id] = self
            .keys
            .iter()
            .find(|(s, _)| *s == k)
            .map(|&(_, slot)| slot);
        Ok(())
    }

    /// A key (or a string used as one): written and memoized once, then referred to.
    fn key(&mut self, k: &'static str) -> io::Result<()> {
        if let Some(&(_, slot)) = self.keys.iter().find(|(s, _)| *s == k) {
            return self.get(slot);
        }
        self.short(k)?;
        let slot = self.memoize()?;
        self.keys.push((k, slot));
        Ok(())
    }

    fn uint(&mut self, v: u64) -> io::Result<()> {
        if v < 256 {
            self.bytes(&[b'K', v as u8])
        } else if v < 65536 {
            let b = (v as u16).to_le_bytes();
            self.bytes(&[b'M', b[0], b[1]])
        } else if v < 1 << 31 {
            let b = (v as u32).to_le_bytes();
            self.bytes(&[b'J', b[0], b[1], b[2], b[3]])
        } else {
            let b = v.to_le_bytes();
            self.bytes(&[0x8a, 8, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        }
    }
}

/// Slots of live blocks (address, size), by slot index.
type Slots = [Option<(u64, u64)>; SLOTS];

/// The run: the random choices and the live blocks, entry by entry.
struct Run {
    state: u64,
    slots: [Option<(u64, u64)>; SLOTS],
    wrapped: bool,
    /// `--pools`: the private pool's slots, and the steps taken.
    pool: Option<Box<Slots>>,
    steps: u64,
}

impl Run {
    fn new(wrapped: bool, pools: bool) -> Run {
        Run {
            state: 0x2545_F491_4F6C_DD1D,
            slots: [None; SLOTS],
            wrapped,
            pool: pools.then(|| Box::new([None; SLOTS])),
            steps: 0,
        }
    }

    fn rnd(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// The next step's entries (one, or a free's two), as `(action, addr, size,
    /// whether it is the private pool's)`.
    fn step(&mut self, mut entry: impl FnMut(&'static str, u64, u64, bool)) {
        let i = (self.rnd() % SLOTS as u64) as usize;
        let capture = self.steps / PHASE % PHASES == 0;
        self.steps += 1;
        if let Some(pool) = self.pool.as_mut().filter(|_| capture) {
            match pool[i] {
                None => {
                    let size = 512 * (1 + self.state % 8192);
                    let addr = POOL_BASE + i as u64 * SLOT;
                    entry("alloc", addr, size, true);
                    pool[i] = Some((addr, size));
                }
                Some((addr, size)) => {
                    if self.wrapped {
                        entry("free_requested", addr, size, true);
                    }
                    entry("free_completed", addr, size, true);
                    pool[i] = None;
                }
            }
            return;
        }
        match self.slots[i] {
            None => {
                let size = if self.wrapped {
                    (1 << 20) + 512 * (1 + self.rnd() % 6144)
                } else {
                    512 * (1 + self.rnd() % 8192)
                };
                let addr = BASE + i as u64 * SLOT;
                entry("alloc", addr, size, false);
                self.slots[i] = Some((addr, size));
            }
            Some((addr, size)) => {
                if self.wrapped || self.rnd() % 7 == 0 {
                    entry("free_requested", addr, size, false);
                }
                entry("free_completed", addr, size, false);
                self.slots[i] = None;
            }
        }
    }
}

/// The trace's entries as they are written.
struct Trace {
    time: u64,
    count: u64,
    batch: u32,
    /// Entries still to be lost (a wrapped ring buffer's).
    lost: u64,
    /// The memo slot of the empty frames list.
    empty: u32,
    /// `--pool-ids`: every entry carries its `pool_id`.
    pool_ids: bool,
}

impl Trace {
    fn entry<W: Write>(
        &mut self,
        p: &mut Out<W>,
        action: &'static str,
        addr: u64,
        size: u64,
        private: bool,
    ) -> io::Result<()> {
        if self.lost > 0 {
            self.lost -= 1;
            return Ok(());
        }
        if self.batch == 1000 {
            p.bytes(b"e(")?;
            self.batch = 0;
        }
        self.batch += 1;
        self.count += 1;
        self.time += 7;
        p.bytes(b"}")?;
        p.memoize()?;
        p.bytes(b"(")?;
        let (id, action) = match action {
            "alloc" => (10, "alloc"),
            "free_requested" => (11, "free_requested"),
            "free_completed" => (12, "free_completed"),
            _ => (13, action),
        };
        p.key_at(0, "action")?;
        p.key_at(id, action)?;
        p.key_at(1, "addr")?;
        p.uint(addr)?;
        p.key_at(2, "size")?;
        p.uint(size)?;
        p.key_at(3, "stream")?;
        p.uint(0)?;
        p.key_at(4, "time_us")?;
        p.uint(self.time)?;
        p.key_at(5, "compile_context")?;
        p.short("N/A")?;
        p.memoize()?;
        p.key_at(6, "user_metadata")?;
        p.key_at(7, "")?;
        p.key_at(8, "frames")?;
        p.get(self.empty)?;
        if self.pool_ids {
            p.key_at(9, "pool_id")?;
            p.uint(u64::from(private))?;
            p.uint(0)?;
            p.bytes(&[0x86])?;
        }
        p.bytes(b"u")
    }
}

/// Writes one segment of the final segments list (at `base`, of `pool`, with the
/// blocks `live` live) as `tools/flat_snapshot.py` writes its one segment; its frames
/// the empty list memoized at `empty`, or a new one. Returns that list's memo slot.
fn segment<W: Write>(
    p: &mut Out<W>,
    base: u64,
    pool: (u64, u64),
    live: &[(u64, u64)],
    empty: Option<u32>,
) -> io::Result<u32> {
    p.bytes(b"}")?;
    p.memoize()?;
    p.bytes(b"(")?;
    let allocated: u64 = live.iter().map(|&(_, s)| s).sum();
    for (k, v) in [
        ("device", 0),
        ("address", base),
        ("total_size", SEG),
        ("allocated_size", allocated),
        ("active_size", allocated),
        ("requested_size", allocated),
        ("stream", 0),
    ] {
        p.key(k)?;
        p.uint(v)?;
    }
    p.key("segment_type")?;
    p.key("large")?;
    p.key("segment_pool_id")?;
    p.uint(pool.0)?;
    p.uint(pool.1)?;
    p.bytes(&[0x86])?;
    p.memoize()?;
    p.key("is_expandable")?;
    p.bytes(&[0x89])?;
    p.key("frames")?;
    let empty = match empty {
        Some(slot) => {
            p.get(slot)?;
            slot
        }
        None => {
            p.bytes(b"]")?;
            p.memoize()?
        }
    };
    p.key("blocks")?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"(")?;
    // The blocks tiling the segment: the live ones, the free gaps between them.
    let mut blocks: Vec<(u64, u64, u64, &'static str)> = Vec::new();
    let mut at = base;
    for &(addr, size) in live {
        if addr > at {
            blocks.push((at, addr - at, 0, "inactive"));
        }
        blocks.push((addr, size, size, "active_allocated"));
        at = addr + size;
    }
    if at < base + SEG {
        blocks.push((at, base + SEG - at, 0, "inactive"));
    }
    for (addr, size, requested, state) in blocks {
        p.bytes(b"}")?;
        p.memoize()?;
        p.bytes(b"(")?;
        p.key("address")?;
        p.uint(addr)?;
        p.key("size")?;
        p.uint(size)?;
        p.key("requested_size")?;
        p.uint(requested)?;
        p.key("state")?;
        p.key(state)?;
        p.key("frames")?;
        p.get(empty)?;
        p.bytes(b"u")?;
    }
    p.bytes(b"eu")?;
    Ok(empty)
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wrapped = args.iter().any(|a| a == "--wrapped");
    let pools = args.iter().any(|a| a == "--pools");
    let pool_ids = args.iter().any(|a| a == "--pool-ids");
    let rest: Vec<&String> = args
        .iter()
        .filter(|a| !matches!(a.as_str(), "--wrapped" | "--pools" | "--pool-ids"))
        .collect();
    let (Some(n), Some(path), None) = (
        rest.first().and_then(|n| n.parse::<u64>().ok()),
        rest.get(1),
        rest.get(2),
    ) else {
        eprintln!("usage: flat_snapshot N_ENTRIES OUT.pickle [--wrapped] [--pools [--pool-ids]]");
        std::process::exit(2);
    };
    if pool_ids && !pools {
        eprintln!("flat_snapshot: --pool-ids needs --pools");
        std::process::exit(2);
    }
    if n < 2000 || (pools && n < 4000) {
        eprintln!(
            "flat_snapshot: N_ENTRIES must be at least {}",
            if pools { 4000 } else { 2000 }
        );
        std::process::exit(2);
    }
    // The live blocks at the end of a wrapped run, by slot (the pool's too).
    let mut at_end = [None; SLOTS];
    let mut pool_at_end = [None; SLOTS];
    if wrapped {
        let mut run = Run::new(true, pools);
        // The segments' allocations.
        let mut count = 1 + u64::from(pools);
        while count < LOST + n {
            run.step(|_, _, _, _| count += 1);
        }
        at_end = run.slots;
        if let Some(pool) = run.pool {
            pool_at_end = *pool;
        }
    }
    let tmp = format!("{path}.tmp");
    let file = std::fs::File::create(&tmp)?;
    let mut p = Out {
        out: io::BufWriter::with_capacity(1 << 20, file),
        memo: 0,
        keys: Vec::new(),
        cached: [None; 16],
    };
    p.bytes(b"\x80\x04}")?;
    p.memoize()?;
    p.bytes(b"(")?;
    p.key("segments")?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"(")?;
    let live: Vec<(u64, u64)> = at_end.iter().flatten().copied().collect();
    let empty = segment(&mut p, BASE, (0, 0), &live, None)?;
    if pools {
        let live: Vec<(u64, u64)> = pool_at_end.iter().flatten().copied().collect();
        segment(&mut p, POOL_BASE, (1, 0), &live, Some(empty))?;
    }
    p.bytes(b"e")?;
    p.key("device_traces")?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"(]")?;
    p.memoize()?;
    p.bytes(b"(")?;
    let mut trace = Trace {
        time: 1_795_391_990_920_542,
        count: 0,
        batch: 0,
        lost: if wrapped { LOST } else { 0 },
        empty,
        pool_ids,
    };
    trace.entry(&mut p, "segment_alloc", BASE, SEG, false)?;
    if pools {
        trace.entry(&mut p, "segment_alloc", POOL_BASE, SEG, true)?;
    }
    let mut run = Run::new(wrapped, pools);
    let end = match (wrapped, pools) {
        (true, _) => n,
        (false, false) => n - 1100,
        (false, true) => n - 1612,
    };
    let mut result = Ok(());
    while trace.count < end && result.is_ok() {
        run.step(|action, addr, size, private| {
            if result.is_ok() {
                result = trace.entry(&mut p, action, addr, size, private);
            }
        });
    }
    result?;
    if !wrapped {
        for i in 0..SLOTS {
            if let Some((addr, size)) = run.slots[i].take() {
                trace.entry(&mut p, "free_completed", addr, size, false)?;
            }
        }
        if let Some(pool) = run.pool.as_mut() {
            for slot in pool.iter_mut() {
                if let Some((addr, size)) = slot.take() {
                    trace.entry(&mut p, "free_completed", addr, size, true)?;
                }
            }
        }
    }
    p.bytes(b"eeu.")?;
    p.out.flush()?;
    drop(p);
    std::fs::rename(&tmp, path)?;
    println!("{} entries", trace.count);
    Ok(())
}
