//! Arena allocation in the style of RAPIDS RMM's `arena_memory_resource`.
//!
//! RMM's arena resource keeps one *global arena* of large chunks drawn from the device and
//! one small *arena per stream* that takes fixed-size *superblocks* from the global arena.
//! Small requests are served from the stream's own superblocks, so streams never share a
//! superblock and need not synchronise with each other; large requests go to the global
//! arena directly. Both levels use address-ordered first fit with coalescing, which keeps
//! allocations packed towards low addresses and lets freed neighbours merge.
//!
//! # Rules
//!
//! - **Alignment.** Every request is rounded up to a multiple of 256 bytes (RMM's
//!   allocation alignment); [`Allocation::block_bytes`] is that rounded size.
//! - **Global arena.** A set of chunks, each one device segment of
//!   `max(growth_bytes, needed bytes rounded up to 2 MiB)` bytes, where the needed bytes
//!   are a large request's rounded size or one superblock. Each chunk keeps an
//!   address-ordered list of free ranges, coalesced on free. Allocation is first fit over
//!   the chunks in the order they were obtained and each chunk's ranges in address order,
//!   carving from the front of the range; if nothing fits, the arena grows by one chunk.
//! - **Arena order, not driver order.** RMM's arena is one upstream allocation, so its
//!   address-ordered first fit is an order inside that block, whatever address the
//!   driver gave it. A growing arena keeps that independence: its chunks are ordered as
//!   if each new one were appended after the others (by when it was obtained), and places
//!   inside a chunk by address. No decision depends on where the device puts a chunk, so
//!   the policy decides the same on the simulated device and on a GPU, whose placement
//!   differs (a U-Net run at 14 GiB ran out of memory in simulation and not on the GPU
//!   while chunks were ordered by device address).
//! - **Large requests** (rounded size above `threshold_bytes`) are served by the global
//!   arena directly.
//! - **Small requests** (rounded size at or below `threshold_bytes`) are served by the
//!   arena of the request's stream: first fit over its superblocks in arena order, each
//!   with its own address-ordered free list, coalesced on free. If none fits, the stream
//!   takes a new superblock of `superblock_bytes` from the global arena (first fit there,
//!   growing if needed). A small request always fits an empty superblock, since the
//!   threshold is at most one superblock. A stream needing a superblock takes, in arena
//!   order, the first orphan superblock with a free range that fits or the first free
//!   range of a chunk that holds a new superblock, whichever comes first.
//! - **Caching.** A superblock that becomes entirely free stays with its stream arena, and
//!   a chunk that becomes entirely free stays in the global arena, until
//!   [`Policy::empty_cache`] or memory pressure.
//! - **Memory pressure** (RMM's `do_allocate`: allocate, else `defragment()` and allocate
//!   once more, else out of memory). When the device refuses a new chunk, the policy
//!   *defragments* as RMM does: every stream arena gives *all* its superblocks back to the
//!   global arena (`arena::clean()`), the empty ones coalescing into free ranges and the
//!   others kept there, with their free blocks, as *orphan* superblocks; then every
//!   wholly free chunk goes back to the device (RMM's arena never grows, so it has no such
//!   step). Then the whole request is tried again from the start: a small one may now take
//!   an orphan superblock (RMM's global first fit over its superblocks takes the first
//!   that fits, empty or not, in its order), a large one a coalesced range, or the arena
//!   may now grow. If that fails too, the request ends in [`AllocError::OutOfMemory`] with
//!   `tried_bytes` the chunk size asked for. Live allocations are never touched; a block
//!   freed later goes back to whichever arena holds its superblock then (RMM's
//!   `deallocate_from_other_arena`), and an orphan that becomes empty coalesces into its
//!   chunk (RMM's `global_arena::deallocate`).
//! - **empty_cache** releases what is cached: empty superblocks back to the global arena,
//!   then wholly free chunks back to the device (RMM has no such call; non-empty
//!   superblocks stay with their streams).
//!
//! Streams matter only for which arena serves a small request; a block freed on one
//! stream is reused at once by the same stream (its own order of work keeps that safe).
//! Large blocks in the global arena are shared by all streams, as in RMM; cross-stream
//! safety there is the caller's job.
//!
//! # Options ([`ArenaOptions`])
//!
//! - `superblock_bytes` (default 1 MiB): the unit stream arenas take from the global
//!   arena; a positive multiple of 256.
//! - `growth_bytes` (default 1 GiB): the smallest chunk the global arena draws from the
//!   device; at least one superblock.
//! - `threshold_bytes` (default 512 KiB, half the default superblock): the largest
//!   (rounded) request a stream arena serves; at most one superblock.
//!
//! # Snapshots
//!
//! Each chunk is reported as consecutive [`SegmentSnapshot`]s that together tile it in
//! address order: each superblock as one entry of pool `arena-superblock` (with its
//! owning stream and its small blocks), and each stretch of the chunk between superblocks
//! as one entry of pool `arena-global` (stream 0, with the large blocks and free ranges
//! of the global arena). Free ranges report 0 requested bytes.

mod free_list;
mod regions;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::device::{Device, DeviceAddr, DeviceError, Segment};
use crate::lease::{Lease, Leases};
use crate::options::{Field, FieldValue, PolicyOptions};
use crate::policy::{
    AllocError, Allocation, BlockSnapshot, BlockState, Policy, PolicyStats, Request,
    SegmentSnapshot, StreamId, MAX_REQUEST_BYTES,
};
use crate::registry::OptionsError;
use free_list::FreeList;
use regions::{Order, Regions};

/// Every allocation size is rounded up to a multiple of this (RMM's
/// `CUDA_ALLOCATION_ALIGNMENT`).
pub const ALIGNMENT_BYTES: u64 = 256;

/// Chunks larger than `growth_bytes` are rounded up to a multiple of this.
pub const CHUNK_ROUNDING_BYTES: u64 = 2 << 20;

/// Options of the arena policy. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaOptions {
    /// Size of the superblocks per-stream arenas take from the global arena (default 1 MiB).
    pub superblock_bytes: u64,
    /// Size of each chunk the global arena draws from the device (default 1 GiB).
    pub growth_bytes: u64,
    /// Requests above this go to the global arena directly (default: half a superblock).
    pub threshold_bytes: u64,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        let superblock_bytes = 1 << 20;
        ArenaOptions {
            superblock_bytes,
            growth_bytes: 1 << 30,
            threshold_bytes: ArenaOptions::default_threshold(superblock_bytes),
        }
    }
}

impl PolicyOptions for ArenaOptions {
    const NAME: &'static str = "arena";
    const ABOUT: &'static str = "RAPIDS RMM's arena resource: a global arena of large chunks \
        and one arena per stream taking superblocks from it, address-ordered first fit \
        with coalescing.";
    const FIELDS: &'static [Field<Self>] = &[
        Field {
            name: "superblock",
            help: "Unit stream arenas take from the global arena; a positive multiple of 256.",
            value: FieldValue::Bytes(|o| o.superblock_bytes, |o, v| o.superblock_bytes = v),
        },
        Field {
            name: "growth",
            help: "Smallest chunk the global arena draws from the device; at least one \
                   superblock.",
            value: FieldValue::Bytes(|o| o.growth_bytes, |o, v| o.growth_bytes = v),
        },
        Field {
            name: "threshold",
            help: "Largest (rounded) request a stream arena serves; at most one superblock. \
                   Default: half the superblock.",
            value: FieldValue::Bytes(|o| o.threshold_bytes, |o, v| o.threshold_bytes = v),
        },
    ];

    fn derive_defaults(&mut self, given: &[&str]) {
        if !given.contains(&"threshold") {
            self.threshold_bytes = ArenaOptions::default_threshold(self.superblock_bytes);
        }
    }

    fn validate(&self) -> Result<(), OptionsError> {
        ArenaOptions::validate(self)
    }

    type Built = ArenaPolicy;

    fn build_policy(&self) -> Result<ArenaPolicy, OptionsError> {
        ArenaPolicy::new(self.clone())
    }
}

impl ArenaOptions {
    /// The threshold when none is given: half a superblock.
    pub fn default_threshold(superblock_bytes: u64) -> u64 {
        superblock_bytes / 2
    }

    /// Checks the options: the superblock a positive multiple of 256 bytes, growth at
    /// least one superblock, threshold at most one superblock.
    ///
    /// # Errors
    /// When one of those does not hold.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let err = |message: String| {
            Err(OptionsError {
                policy: "arena",
                message,
            })
        };
        let (superblock, growth, threshold) = (
            self.superblock_bytes,
            self.growth_bytes,
            self.threshold_bytes,
        );
        if superblock == 0 || superblock % ALIGNMENT_BYTES != 0 {
            return err(format!(
                "superblock must be a positive multiple of 256, got {superblock}"
            ));
        }
        if growth < superblock {
            return err(format!(
                "growth ({growth}) must be at least superblock ({superblock})"
            ));
        }
        if threshold > superblock {
            return err(format!(
                "threshold ({threshold}) must not exceed superblock ({superblock})"
            ));
        }
        Ok(())
    }
}

/// A place in the arena's order: the position of its chunk (the order chunks were
/// obtained in) and the device address.
type Place = (u64, u64);

/// Who holds a free list of [`ArenaPolicy::regions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    /// A chunk of the global arena (its segment is in [`ArenaPolicy::segments`]).
    Chunk,
    /// A superblock held by this stream's arena.
    Stream(StreamId),
    /// A superblock given back to the global arena with live blocks under memory
    /// pressure.
    Orphan,
}

/// One chunk or superblock: where it is, who holds it, its free ranges.
#[derive(Debug)]
struct Region {
    place: Place,
    holder: Holder,
    free: FreeList,
    /// The id of the run of its order it is in (`regions.rs`), or `NO_RUN`.
    run: u32,
}

/// One stream's arena: its superblocks (their places, and their slots in
/// [`ArenaPolicy::regions`]) in arena order.
#[derive(Debug)]
struct StreamArena {
    stream: StreamId,
    superblocks: Order,
}

/// A handed-out block; its detail is the slot of the chunk or superblock holding it
/// (in [`ArenaPolicy::regions`]).
type LiveBlock = Lease<u32>;

/// RMM-style arena allocator. See the module docs.
#[derive(Debug)]
pub struct ArenaPolicy {
    options: ArenaOptions,
    /// The global arena: its chunks in arena order (by position), each as its place
    /// and its slot in `regions`, the same form as a stream arena's superblocks, so
    /// one first fit serves both.
    chunks: Order,
    /// Each chunk's device segment, in the order of `chunks`.
    segments: Vec<Segment>,
    /// The position the next chunk gets.
    next_position: u64,
    /// Every chunk and superblock (held by a stream arena or orphaned), by slot. A live
    /// block names its slot, so a free goes to its free list whatever the block's size.
    regions: Regions,
    /// Per-stream arenas, by stream. No empty arena is kept.
    arenas: Vec<StreamArena>,
    /// Orphan superblocks by place (arena order): their slots.
    orphans: Order,
    /// Live blocks; an allocation's `block` indexes it.
    live: Leases<u32>,
    stats: PolicyStats,
}

impl ArenaPolicy {
    /// An arena allocator with the given options.
    ///
    /// # Errors
    /// See [`ArenaOptions::validate`].
    pub fn new(options: ArenaOptions) -> Result<ArenaPolicy, OptionsError> {
        options.validate()?;
        Ok(ArenaPolicy {
            options,
            chunks: Order::default(),
            segments: Vec::new(),
            next_position: 0,
            regions: Regions::default(),
            arenas: Vec::new(),
            orphans: Order::default(),
            live: Leases::default(),
            stats: PolicyStats::default(),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &ArenaOptions {
        &self.options
    }

    /// The block size for a request of `size_bytes`: rounded up to 256 bytes.
    pub fn block_bytes_for(size_bytes: u64) -> u64 {
        size_bytes.div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES
    }

    /// The chunk the global arena draws from the device when `bytes` do not fit.
    pub fn chunk_bytes_for(&self, bytes: u64) -> u64 {
        self.options
            .growth_bytes
            .max(bytes.div_ceil(CHUNK_ROUNDING_BYTES) * CHUNK_ROUNDING_BYTES)
    }

    /// First fit over the global arena in arena order, without growing: the block's
    /// place and its chunk's slot.
    #[inline]
    fn global_first_fit(&mut self, bytes: u64) -> Option<(Place, u32)> {
        self.regions
            .first_fit_among(&self.chunks, bytes)
            .map(|((position, _), addr, slot)| ((position, addr), slot))
    }

    /// The first place (arena order) of a chunk range that holds `bytes`, without
    /// carving it.
    fn global_peek(&mut self, bytes: u64) -> Option<Place> {
        let (i, addr) = self.regions.first_holding(&self.chunks, bytes)?;
        let ((position, _), _) = self.chunks.items()[i];
        Some((position, addr))
    }

    /// First fit over the global arena; grows by a chunk if nothing fits. `None` when
    /// the device refuses the chunk.
    fn global_allocate(
        &mut self,
        device: &mut dyn Device,
        bytes: u64,
    ) -> Result<Option<(Place, u32)>, DeviceError> {
        if let Some(found) = self.global_first_fit(bytes) {
            return Ok(Some(found));
        }
        if !self.grow(device, self.chunk_bytes_for(bytes))? {
            return Ok(None);
        }
        Ok(Some(
            self.global_first_fit(bytes)
                .expect("a new chunk holds the request"),
        ))
    }

    /// The index of `stream`'s arena in `arenas`, or where it would go.
    #[inline]
    fn arena_index(&self, stream: StreamId) -> Result<usize, usize> {
        self.arenas.binary_search_by_key(&stream, |a| a.stream)
    }

    /// Gives the superblock in `slot` (at `place`) to `stream`'s arena.
    fn hand_to(&mut self, stream: StreamId, place: Place, slot: u32) {
        self.regions.set_holder(slot, Holder::Stream(stream));
        let i = match self.arena_index(stream) {
            Ok(i) => i,
            Err(i) => {
                self.arenas.insert(
                    i,
                    StreamArena {
                        stream,
                        superblocks: Order::default(),
                    },
                );
                i
            }
        };
        self.regions
            .place_in(&mut self.arenas[i].superblocks, place, slot);
    }

    /// A superblock for `stream` holding a free range of `bytes`: the first orphan that
    /// fits or the first chunk range that holds a new superblock, whichever comes first
    /// in arena order; else a new superblock from a new chunk. `None` when the device
    /// refuses the chunk.
    fn acquire_superblock(
        &mut self,
        device: &mut dyn Device,
        stream: StreamId,
        bytes: u64,
    ) -> Result<Option<u32>, DeviceError> {
        let superblock_bytes = self.options.superblock_bytes;
        let orphan = self.regions.first_holding(&self.orphans, bytes);
        let fresh = self.global_peek(superblock_bytes);
        let adopted = orphan.filter(|&(i, _)| fresh.is_none_or(|f| self.orphans.items()[i].0 < f));
        if let Some((i, _)) = adopted {
            let (place, slot) = self.regions.take_out(&mut self.orphans, i);
            self.hand_to(stream, place, slot);
            return Ok(Some(slot));
        }
        let Some((place, _)) = self.global_allocate(device, superblock_bytes)? else {
            return Ok(None);
        };
        let slot = self.regions.insert(Region {
            place,
            holder: Holder::Orphan,
            free: FreeList::whole(place.1, superblock_bytes),
            run: regions::NO_RUN,
        });
        self.hand_to(stream, place, slot);
        Ok(Some(slot))
    }

    /// The first step of [`ArenaPolicy::try_allocate`] alone: first fit in the global
    /// arena for a large block, in `stream`'s superblocks (arena order) for a small
    /// one; the block's address and its chunk's or superblock's slot, `None` when that
    /// finds nothing (then `try_allocate` takes the same first step, finds nothing
    /// again, and goes on to grow or acquire).
    ///
    /// Large or small is a coin toss on many traces: it only chooses which list of
    /// places to search (without a branch), and one loop searches either.
    #[inline(always)]
    fn first_fit_held(&mut self, stream: StreamId, bytes: u64) -> Option<(u64, u32)> {
        let small: &Order = match self.arena_index(stream) {
            Ok(i) => &self.arenas[i].superblocks,
            Err(_) => &Order::EMPTY,
        };
        // Chosen by an index, not a branch (`black_box` keeps the compiler from
        // making it one again).
        let lists = [small, &self.chunks];
        let large = std::hint::black_box(usize::from(bytes > self.options.threshold_bytes));
        let candidates = lists[large];
        self.regions
            .first_fit_among(candidates, bytes)
            .map(|(_, addr, slot)| (addr, slot))
    }

    /// One attempt at a block of `bytes` for `stream` (large: the global arena; small:
    /// the stream's superblocks, then a superblock acquired): the block's address and
    /// its chunk's or superblock's slot, or `None` when the device refuses a chunk.
    fn try_allocate(
        &mut self,
        device: &mut dyn Device,
        stream: StreamId,
        bytes: u64,
    ) -> Result<Option<(u64, u32)>, DeviceError> {
        if let Some(found) = self.first_fit_held(stream, bytes) {
            return Ok(Some(found));
        }
        if bytes > self.options.threshold_bytes {
            // Nothing fits: `global_allocate` grows the arena by a chunk.
            return Ok(self
                .global_allocate(device, bytes)?
                .map(|((_, addr), slot)| (addr, slot)));
        }
        let Some(slot) = self.acquire_superblock(device, stream, bytes)? else {
            return Ok(None);
        };
        let addr = self
            .regions
            .first_fit(slot, bytes)
            .expect("an acquired superblock fits the request");
        Ok(Some((addr, slot)))
    }

    /// Takes the superblock in `slot` out of the table and gives its range back to the
    /// global arena.
    fn dissolve(&mut self, slot: u32) {
        let sb = self
            .regions
            .remove(slot)
            .expect("arena: dissolving an empty slot");
        self.global_free(sb.place.0, sb.place.1, self.options.superblock_bytes);
    }

    /// RMM's `defragment()`: every stream arena gives all its superblocks to the global
    /// arena (empty ones coalesce into their chunk, the others become orphans); then every
    /// wholly free chunk goes back to the device.
    fn defragment(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        let superblock_bytes = self.options.superblock_bytes;
        let mut orphans = Vec::new();
        for mut arena in std::mem::take(&mut self.arenas) {
            for (place, slot) in self.regions.take_all(&mut arena.superblocks) {
                let sb = self
                    .regions
                    .get(slot)
                    .expect("arena: a stream arena names an empty slot");
                if sb.free.is_whole(place.1, superblock_bytes) {
                    self.dissolve(slot);
                } else {
                    self.regions.set_holder(slot, Holder::Orphan);
                    orphans.push((place, slot));
                }
            }
        }
        // Each stream's in arena order; places are distinct.
        orphans.sort_unstable();
        self.regions.merge_into(&mut self.orphans, orphans);
        self.release_free_chunks(device)
    }

    /// Adds one chunk of `chunk_bytes` to the global arena; `false` if the device is out
    /// of memory.
    fn grow(&mut self, device: &mut dyn Device, chunk_bytes: u64) -> Result<bool, DeviceError> {
        let segment = match device.allocate_segment(chunk_bytes) {
            Ok(segment) => segment,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let (base, size) = (segment.addr.0, segment.size_bytes);
        assert!(
            self.segments.iter().all(|s| s.addr.0 != base),
            "arena: the device handed out one base address twice"
        );
        self.stats.reserved_bytes += size;
        self.stats.segment_count += 1;
        let position = self.next_position;
        self.next_position += 1;
        let place = (position, base);
        let slot = self.regions.insert(Region {
            place,
            holder: Holder::Chunk,
            free: FreeList::whole(base, size),
            run: regions::NO_RUN,
        });
        // Positions only grow: the chunk goes last.
        self.regions.place_in(&mut self.chunks, place, slot);
        self.segments.push(segment);
        Ok(true)
    }

    /// Returns a range to the global arena: the chunk at `position`.
    fn global_free(&mut self, position: u64, addr: u64, len: u64) {
        let chunks = self.chunks.items();
        let i = chunks.partition_point(|&((p, _), _)| p < position);
        let &((_, base), slot) = chunks
            .get(i)
            .filter(|&&((p, _), _)| p == position)
            .expect("arena: freed range of no chunk");
        assert!(
            addr >= base && addr + len <= base + self.segments[i].size_bytes,
            "arena: freed range {addr:#x} leaves its chunk"
        );
        self.regions.give_back(slot, addr, len);
    }

    /// Empty superblocks back to the global arena, then wholly free chunks back to the
    /// device.
    fn release_cached(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        let superblock_bytes = self.options.superblock_bytes;
        for mut arena in std::mem::take(&mut self.arenas) {
            let superblocks = self.regions.take_all(&mut arena.superblocks);
            let mut kept = Vec::with_capacity(superblocks.len());
            for (place, slot) in superblocks {
                let sb = self
                    .regions
                    .get(slot)
                    .expect("arena: a stream arena names an empty slot");
                if sb.free.is_whole(place.1, superblock_bytes) {
                    self.dissolve(slot);
                } else {
                    kept.push((place, slot));
                }
            }
            if !kept.is_empty() {
                self.regions.fill(&mut arena.superblocks, kept);
                self.arenas.push(arena);
            }
        }
        self.release_free_chunks(device)
    }

    /// Every wholly free chunk back to the device, in arena order.
    fn release_free_chunks(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        let mut i = 0;
        while i < self.chunks.len() {
            let ((_, base), slot) = self.chunks.items()[i];
            let size = self.segments[i].size_bytes;
            let chunk = self
                .regions
                .get(slot)
                .expect("arena: a chunk without its free list");
            if !chunk.free.is_whole(base, size) {
                i += 1;
                continue;
            }
            self.regions.take_out(&mut self.chunks, i);
            self.regions.remove(slot);
            let segment = self.segments.remove(i);
            self.stats.reserved_bytes -= size;
            self.stats.segment_count -= 1;
            device.free_segment(segment)?;
        }
        Ok(())
    }

    /// [`Policy::allocate`] beyond its inline first step: the checks, growing the
    /// global arena or acquiring a superblock, defragmenting (out of line, so the usual
    /// case keeps its registers).
    #[inline(never)]
    fn allocate_rest(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError> {
        let size = request.size_bytes;
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if size >= MAX_REQUEST_BYTES {
            return Err(AllocError::OutOfMemory {
                requested_bytes: size,
                tried_bytes: size,
                stats: self.stats,
            });
        }
        let bytes = ArenaPolicy::block_bytes_for(size);
        let stream = request.stream;
        let found = match self.try_allocate(device, stream, bytes)? {
            Some(found) => Some(found),
            None => {
                // RMM: defragment, then allocate once more.
                self.defragment(device)?;
                self.try_allocate(device, stream, bytes)?
            }
        };
        let Some((addr, slot)) = found else {
            let needed = if bytes > self.options.threshold_bytes {
                bytes
            } else {
                self.options.superblock_bytes
            };
            return Err(AllocError::OutOfMemory {
                requested_bytes: size,
                tried_bytes: self.chunk_bytes_for(needed),
                stats: self.stats,
            });
        };
        Ok(self
            .live
            .issue(addr, size, bytes, stream, slot, &mut self.stats))
    }
}

impl Default for ArenaPolicy {
    fn default() -> Self {
        ArenaPolicy::new(ArenaOptions::default()).expect("default arena options are valid")
    }
}

/// Panics unless the (address, length) pieces tile `lo..hi` exactly.
fn assert_tiles(pieces: &BTreeMap<u64, u64>, lo: u64, hi: u64, what: &str) {
    let mut cursor = lo;
    for (&addr, &len) in pieces {
        assert_eq!(
            addr, cursor,
            "arena: {what} at {lo:#x} is not tiled (gap or overlap at {addr:#x})"
        );
        cursor += len;
    }
    assert_eq!(
        cursor, hi,
        "arena: {what} at {lo:#x} is not tiled to its end"
    );
}

impl Policy for ArenaPolicy {
    fn name(&self) -> &str {
        "arena"
    }

    fn allocate(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError> {
        let size = request.size_bytes;
        // The usual case, inline: a free range that holds the block where
        // `try_allocate` looks first (the global arena's chunks for a large block, the
        // stream's superblocks for a small one), without growing or acquiring. Else
        // (a first fit that finds nothing changes nothing) `allocate_rest` takes the
        // request from the start.
        if size > 0 && size < MAX_REQUEST_BYTES {
            let bytes = ArenaPolicy::block_bytes_for(size);
            let stream = request.stream;
            if let Some((addr, slot)) = self.first_fit_held(stream, bytes) {
                return Ok(self
                    .live
                    .issue(addr, size, bytes, stream, slot, &mut self.stats));
            }
        }
        self.allocate_rest(device, request)
    }

    fn free(
        &mut self,
        _device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        let block = self.live.retire(allocation, "arena", &mut self.stats);
        // Back to the chunk or superblock that holds it, whatever its size (a
        // superblock's free list is the same whichever arena holds it now); an orphan
        // superblock that becomes empty coalesces into its chunk.
        let slot = block.detail;
        let region = self.regions.give_back(slot, block.addr, block.block_bytes);
        if region.holder == Holder::Orphan
            && region
                .free
                .is_whole(region.place.1, self.options.superblock_bytes)
        {
            let place = region.place;
            let i = self.orphans.items().partition_point(|&(p, _)| p < place);
            assert!(
                self.orphans.items().get(i) == Some(&(place, slot)),
                "arena: an orphan superblock missing"
            );
            self.regions.take_out(&mut self.orphans, i);
            self.dissolve(slot);
        }
        Ok(())
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        self.release_cached(device)
    }

    fn stats(&self) -> PolicyStats {
        self.stats
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let superblock_bytes = self.options.superblock_bytes;
        let live: BTreeMap<u64, &LiveBlock> = self.live.values().map(|b| (b.addr, b)).collect();
        let superblocks: BTreeMap<u64, (StreamId, &FreeList)> = self
            .regions
            .values()
            .filter_map(|sb| match sb.holder {
                Holder::Chunk => None,
                Holder::Stream(stream) => Some((sb.place.1, (stream, &sb.free))),
                Holder::Orphan => Some((sb.place.1, (StreamId(0), &sb.free))),
            })
            .collect();
        let in_chunk = |b: &&LiveBlock| {
            self.regions
                .get(b.detail)
                .is_some_and(|r| r.holder == Holder::Chunk)
        };
        let free_block = |addr: u64, size_bytes: u64| BlockSnapshot {
            addr: DeviceAddr(addr),
            size_bytes,
            requested_bytes: 0,
            state: BlockState::Free,
        };
        let live_block = |b: &LiveBlock| BlockSnapshot {
            addr: DeviceAddr(b.addr),
            size_bytes: b.block_bytes,
            requested_bytes: b.requested_bytes,
            state: BlockState::Allocated,
        };
        let entry = |pool, stream, blocks: Vec<BlockSnapshot>| SegmentSnapshot {
            addr: blocks[0].addr,
            size_bytes: blocks.iter().map(|b| b.size_bytes).sum(),
            stream,
            pool,
            blocks,
        };
        let mut out = Vec::new();
        // Snapshots list segments in address order.
        let mut chunks: Vec<(&Region, u64)> = self
            .chunks
            .items()
            .iter()
            .zip(&self.segments)
            .map(|(&(_, slot), segment)| {
                let chunk = self
                    .regions
                    .get(slot)
                    .expect("arena: a chunk without its free list");
                (chunk, segment.size_bytes)
            })
            .collect();
        chunks.sort_unstable_by_key(|(c, _)| c.place.1);
        for (chunk, size) in chunks {
            let (base, end) = (chunk.place.1, chunk.place.1 + size);
            // The chunk's pieces in address order: global blocks, or a superblock.
            let mut pieces: BTreeMap<u64, Option<BlockSnapshot>> = BTreeMap::new();
            for &(addr, len) in chunk.free.ranges() {
                pieces.insert(addr, Some(free_block(addr, len)));
            }
            for (_, b) in live.range(base..end).filter(|(_, b)| in_chunk(b)) {
                pieces.insert(b.addr, Some(live_block(b)));
            }
            for (&addr, _) in superblocks.range(base..end) {
                pieces.insert(addr, None);
            }
            let mut run = Vec::new();
            for (addr, piece) in pieces {
                match piece {
                    Some(block) => run.push(block),
                    None => {
                        if !run.is_empty() {
                            out.push(entry("arena-global", StreamId(0), std::mem::take(&mut run)));
                        }
                        let (stream, free) = superblocks[&addr];
                        let sb_end = addr + superblock_bytes;
                        let mut blocks: BTreeMap<u64, BlockSnapshot> = free
                            .ranges()
                            .iter()
                            .map(|&(a, len)| (a, free_block(a, len)))
                            .collect();
                        for (_, b) in live.range(addr..sb_end) {
                            blocks.insert(b.addr, live_block(b));
                        }
                        out.push(entry(
                            "arena-superblock",
                            stream,
                            blocks.into_values().collect(),
                        ));
                    }
                }
            }
            if !run.is_empty() {
                out.push(entry("arena-global", StreamId(0), run));
            }
        }
        out
    }

    fn check_invariants(&self) {
        let o = &self.options;
        // Live blocks, split by where they live.
        let mut global_live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut small_live: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
        let (requested, allocated, count) = self.live.check("arena");
        for b in self.live.values() {
            assert_eq!(
                b.block_bytes,
                ArenaPolicy::block_bytes_for(b.requested_bytes),
                "arena: block not the 256-rounded request"
            );
            let region = self.regions.get(b.detail).unwrap_or_else(|| {
                panic!(
                    "arena: block {:#x} names a chunk or superblock that is gone",
                    b.addr
                )
            });
            match region.holder {
                Holder::Stream(_) | Holder::Orphan => {
                    assert!(
                        b.block_bytes <= o.threshold_bytes,
                        "arena: large block in a superblock"
                    );
                    small_live
                        .entry(region.place.1)
                        .or_default()
                        .insert(b.addr, b.block_bytes);
                }
                Holder::Chunk => {
                    assert!(
                        b.block_bytes > o.threshold_bytes,
                        "arena: small block in the global arena"
                    );
                    assert!(
                        global_live
                            .insert(b.addr, (b.block_bytes, region.place.0))
                            .is_none(),
                        "arena: two global blocks at one address"
                    );
                }
            }
        }
        // Where each superblock is: its arena's list or the orphans, as it records; every
        // list (the chunks' too) in arena order.
        self.regions.check(
            "arena chunks and superblocks",
            [&self.chunks, &self.orphans]
                .into_iter()
                .chain(self.arenas.iter().map(|a| &a.superblocks)),
        );
        assert!(
            self.arenas.windows(2).all(|w| w[0].stream < w[1].stream),
            "arena: stream arenas out of order"
        );
        let mut listed = 0usize;
        for arena in &self.arenas {
            assert!(
                !arena.superblocks.is_empty(),
                "arena: empty stream arena kept"
            );
            for &(place, slot) in arena.superblocks.items() {
                let sb = self
                    .regions
                    .get(slot)
                    .expect("arena: a stream arena names an empty slot");
                assert!(
                    sb.place == place && sb.holder == Holder::Stream(arena.stream),
                    "arena: superblock {:#x} held elsewhere than recorded",
                    place.1
                );
                listed += 1;
            }
        }
        for &(place, slot) in self.orphans.items() {
            let sb = self
                .regions
                .get(slot)
                .expect("arena: an orphan slot without its superblock");
            assert!(
                sb.place == place && sb.holder == Holder::Orphan,
                "arena: superblock {:#x} held elsewhere than recorded",
                place.1
            );
            assert!(
                !sb.free.is_whole(place.1, o.superblock_bytes),
                "arena: an empty orphan superblock at {:#x}",
                place.1
            );
            listed += 1;
        }
        let superblocks = || self.regions.values().filter(|r| r.holder != Holder::Chunk);
        assert_eq!(listed, superblocks().count(), "arena: superblock holders");
        // Superblocks: their free ranges and small blocks tile them.
        let mut owner: BTreeMap<u64, u64> = BTreeMap::new();
        for sb in superblocks() {
            let (position, addr) = sb.place;
            let chunk = self
                .chunks
                .items()
                .iter()
                .position(|&((p, _), _)| p == position)
                .expect("arena: superblock of no chunk");
            let segment = &self.segments[chunk];
            let (base, len) = (segment.addr.0, segment.size_bytes);
            assert!(
                addr >= base && addr + o.superblock_bytes <= base + len,
                "arena: superblock {addr:#x} outside the chunk of its place"
            );

            assert!(
                owner.insert(addr, position).is_none(),
                "arena: superblock {addr:#x} owned by two streams"
            );
            sb.free.check(addr, addr + o.superblock_bytes, "superblock");
            let mut pieces = small_live.remove(&addr).unwrap_or_default();
            for &(a, len) in sb.free.ranges() {
                assert!(
                    pieces.insert(a, len).is_none(),
                    "arena: free range over a live block at {a:#x}"
                );
            }
            assert_tiles(&pieces, addr, addr + o.superblock_bytes, "superblock");
        }
        assert!(
            small_live.is_empty(),
            "arena: a small block outside every superblock"
        );
        // Chunks: free ranges, global blocks and superblocks tile them.
        let mut reserved = 0u64;
        let mut placed = 0usize;
        assert_eq!(
            self.chunks.len(),
            self.segments.len(),
            "arena: chunks and their segments"
        );
        assert_eq!(
            self.chunks.len(),
            self.regions
                .values()
                .filter(|r| r.holder == Holder::Chunk)
                .count(),
            "arena: a chunk's free list outside the global arena"
        );
        let mut bases: Vec<u64> = self.segments.iter().map(|s| s.addr.0).collect();
        bases.sort_unstable();
        assert!(
            bases.windows(2).all(|w| w[0] < w[1]),
            "arena: two chunks at one base address"
        );
        for (&((position, base), slot), segment) in self.chunks.items().iter().zip(&self.segments) {
            assert!(
                position < self.next_position,
                "arena: position from the future"
            );
            let end = base + segment.size_bytes;
            let chunk = self
                .regions
                .get(slot)
                .expect("arena: a chunk without its free list");
            assert!(
                segment.addr.0 == base
                    && chunk.place == (position, base)
                    && chunk.holder == Holder::Chunk,
                "arena: chunk {base:#x} and its free list disagree"
            );
            chunk.free.check(base, end, "chunk");
            let mut pieces: BTreeMap<u64, u64> = chunk.free.ranges().iter().copied().collect();
            for (&a, &(len, at)) in global_live.range(base..end) {
                assert_eq!(
                    at, position,
                    "arena: global block {a:#x} filed under another chunk"
                );
                assert!(
                    pieces.insert(a, len).is_none(),
                    "arena: global block over a free range at {a:#x}"
                );
                placed += 1;
            }
            for (&sb, &at) in owner.range(base..end) {
                assert_eq!(at, position, "arena: superblock {sb:#x} in another chunk");
                assert!(
                    pieces.insert(sb, o.superblock_bytes).is_none(),
                    "arena: superblock over another piece at {sb:#x}"
                );
                placed += 1;
            }
            assert_tiles(&pieces, base, end, "chunk");
            reserved += segment.size_bytes;
        }
        assert_eq!(
            placed,
            global_live.len() + owner.len(),
            "arena: a block or superblock lies outside every chunk"
        );
        let recomputed = PolicyStats {
            requested_bytes: requested,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            allocation_count: count,
            segment_count: self.chunks.len() as u64,
        };
        assert_eq!(
            self.stats, recomputed,
            "arena: stats disagree with the blocks and segments"
        );
    }
}
