//! Where the CUDA driver places device allocations in the virtual address space: the
//! [`AddressModel::Driver`](crate::AddressModel::Driver) model of the simulated device.
//!
//! PyTorch breaks best-fit ties between equal free blocks of different segments by
//! address, so a replay is exact only if the simulated segments lie in the same
//! order as the real ones. The driver's placement is undocumented; these are its rules
//! as every recorded run of `tests/data` shows them (H100, driver 580, CUDA 13; the
//! measurements and their agreement with this model are in `docs/fidelity.md`,
//! "Addresses"):
//!
//! 1. The driver takes address space in **chunks**, multiples of 32 MiB
//!    ([`VaSpace::chunk_bytes`]), stacked downward from the top: a new chunk goes just
//!    below the lowest one (`cuMemAlloc` of 20 MiB eight times: addresses 32 MiB
//!    apart, falling).
//! 2. An allocation takes its span (its size rounded up to the 2 MiB page) at the
//!    **lowest free address of the most recently created chunk** that has room, then of
//!    the one before it, and so on: a large segment lies at the bottom of its own
//!    chunk, and later 2 MiB segments fill the chunk's leftover from the bottom up.
//! 3. When no chunk has room, a new chunk of the span rounded up to 32 MiB is taken:
//!    from the **highest** hole left by released chunks that is **strictly larger**
//!    than it (at the hole's top), else below every chunk.
//! 4. A chunk is released when its last allocation is freed; its range becomes a
//!    hole (merged with adjacent holes).
//!
//! What no trace shows: memory the driver itself takes in the same address space
//! (the CUDA context, kernel modules loaded on first use, library workspaces). It
//! moves the first placements of a run; hints from a recorded run
//! ([`VaSpace::place_at`]) put the model back on the recorded path.

use std::collections::BTreeMap;

/// Chunk granularity measured on the H100 (the address gap between consecutive
/// 20 MiB `cuMemAlloc`s).
pub const DEFAULT_CHUNK_BYTES: u64 = 32 << 20;

/// Alignment and rounding of every placement: the driver's 2 MiB page.
pub const PLACEMENT_ALIGN_BYTES: u64 = 2 << 20;

/// Places of [`VaSpace::order`] under one bound of [`VaSpace::run_room`].
const RUN: usize = 64;

/// A place of [`VaSpace::order`] whose chunk was dropped.
const NO_CHUNK: u32 = u32::MAX;

/// `v.remove(i)`, without the `memmove` call when it is the last entry (a chunk's
/// only placement, the newest chunk): the call for nothing was most of the address
/// model's removals, and `memmove`'s dispatch on the length branches the least
/// predictably of its steps.
#[inline(always)]
fn remove_at<T>(v: &mut Vec<T>, i: usize) -> T {
    if i + 1 == v.len() {
        v.pop().expect("a last entry")
    } else {
        v.remove(i)
    }
}

/// A page bitmap of a chunk ([`Chunk::occupied`]).
type Pages = u128;

/// Pages of [`PLACEMENT_ALIGN_BYTES`] a chunk can hold and still be kept as a page
/// bitmap ([`Chunk::occupied`]): 128, a [`Pages`]' bits (256 MiB).
const BITMAP_PAGES: u64 = Pages::BITS as u64;

/// log2 of [`PLACEMENT_ALIGN_BYTES`].
const PAGE_SHIFT: u32 = PLACEMENT_ALIGN_BYTES.trailing_zeros();

#[derive(Clone, Debug)]
struct Chunk {
    base: u64,
    size: u64,
    /// Its place in [`VaSpace::order`] (creation order: chunks are searched newest
    /// first).
    pos: u32,
    /// Whether the placements are kept as page bitmaps (`occupied`, `starts`), not in
    /// `live`: while the chunk starts on a page, holds at most [`BITMAP_PAGES`] pages
    /// and every placement covers whole pages without overlapping another (what
    /// [`VaSpace::place`] makes). A recorded placement that is not so turns the chunk
    /// to `live` for good. A bitmap finds the lowest run of free pages with a few
    /// shifts and masks, where `live` is walked placement by placement with a branch
    /// on each (most of the address model's mispredicted branches).
    paged: bool,
    /// While `paged`: the pages live placements cover (bit `i`: the page at
    /// `base + i` pages).
    occupied: Pages,
    /// While `paged`: the first page of each live placement.
    starts: Pages,
    /// While `paged`: the chunk's whole pages (bit `i` set for each page `i` that
    /// lies inside it).
    pages: Pages,
    /// While not `paged`: live placements as (address, end), sorted by address.
    live: Vec<(u64, u64)>,
    /// Bytes the live placements cover, while they do not overlap (`disjoint`): no
    /// free run of the chunk is longer than `size - used`.
    used: u64,
    /// Whether the live placements are known not to overlap (recorded addresses can
    /// put one over another); once false, `used` bounds nothing.
    disjoint: bool,
}

/// Bit `i` set for each `i` below `n` (`n` at most [`BITMAP_PAGES`]).
#[inline(always)]
fn low_bits(n: u64) -> Pages {
    if n >= BITMAP_PAGES {
        Pages::MAX
    } else {
        (1 << n) - 1
    }
}

/// Bits `first .. first + count` set (`count` from 1 to [`BITMAP_PAGES`] - `first`):
/// without a branch.
#[inline(always)]
fn page_run(first: u64, count: u64) -> Pages {
    debug_assert!(count >= 1 && first + count <= BITMAP_PAGES);
    (Pages::MAX >> (BITMAP_PAGES - count)) << first
}

impl Chunk {
    /// A new chunk at `base` of `size` bytes, without placements, whose `live` vector
    /// (for a chunk that is not paged) is `live` (empty).
    fn new(base: u64, size: u64, pos: u32, live: Vec<(u64, u64)>) -> Chunk {
        debug_assert!(live.is_empty());
        let paged = base % PLACEMENT_ALIGN_BYTES == 0 && size >> PAGE_SHIFT <= BITMAP_PAGES;
        Chunk {
            base,
            size,
            pos,
            paged,
            occupied: 0,
            starts: 0,
            pages: if paged {
                low_bits(size >> PAGE_SHIFT)
            } else {
                0
            },
            live,
            used: 0,
            disjoint: true,
        }
    }

    /// An upper bound of the span [`Chunk::take`] can find room for: the free bytes
    /// while the placements are disjoint, else any.
    #[inline(always)]
    fn room(&self) -> u64 {
        if self.disjoint {
            self.size.saturating_sub(self.used)
        } else {
            u64::MAX
        }
    }

    /// Whether no placement is live.
    #[inline(always)]
    fn is_empty(&self) -> bool {
        if self.paged {
            self.occupied == 0
        } else {
            self.live.is_empty()
        }
    }

    /// Whether every live placement ends at or before `addr`.
    fn all_end_by(&self, addr: u64) -> bool {
        if self.paged {
            let end_pages = u64::from(Pages::BITS - self.occupied.leading_zeros());
            self.base + (end_pages << PAGE_SHIFT) <= addr
        } else {
            self.live.iter().all(|&(_, e)| e <= addr)
        }
    }

    /// Shrinks the chunk to `size` bytes (every placement ends within it).
    fn shrink(&mut self, size: u64) {
        self.size = size;
        if self.paged {
            self.pages = low_bits(size >> PAGE_SHIFT);
            debug_assert_eq!(self.occupied & !self.pages, 0);
        }
    }

    /// Takes `span` bytes (whole pages) at the lowest [`PLACEMENT_ALIGN_BYTES`]-aligned
    /// address of this chunk where they are free, and records the placement there;
    /// `None` (nothing recorded) when no free run holds them.
    #[inline(always)]
    fn take(&mut self, span: u64) -> Option<u64> {
        if self.disjoint && self.size.saturating_sub(self.used) < span {
            // Fewer free bytes than `span`: no free run holds it.
            return None;
        }
        if !self.paged {
            return self.take_listed(span);
        }
        // Bit `i` of `runs`: pages `i .. i + have` are all free (and inside the chunk).
        let want = span >> PAGE_SHIFT;
        let mut runs = !self.occupied & self.pages;
        let mut have = 1;
        while have < want {
            let step = (want - have).min(have);
            runs &= runs >> step;
            have += step;
        }
        if runs == 0 {
            return None;
        }
        let first = u64::from(runs.trailing_zeros());
        self.occupied |= page_run(first, want);
        self.starts |= 1 << first;
        self.used += span;
        Some(self.base + (first << PAGE_SHIFT))
    }

    /// [`Chunk::take`] of a chunk that is not `paged`.
    #[inline(never)]
    fn take_listed(&mut self, span: u64) -> Option<u64> {
        let (addr, i) = self.lowest_fit(span)?;
        self.record_fit(i, addr, addr + span);
        Some(addr)
    }

    /// The lowest [`PLACEMENT_ALIGN_BYTES`]-aligned address in this chunk where `span`
    /// bytes are free, and where a placement there goes in `live` (for
    /// [`Chunk::record_fit`]); not `paged`. (A constant alignment: rounding up is a
    /// mask, not a division.)
    #[inline]
    fn lowest_fit(&self, span: u64) -> Option<(u64, usize)> {
        let align = PLACEMENT_ALIGN_BYTES;
        let mut cur = self.base;
        for (i, &(addr, end)) in self.live.iter().enumerate() {
            let start = cur.next_multiple_of(align);
            if start.checked_add(span).is_some_and(|e| e <= addr) {
                return Some((start, i));
            }
            cur = cur.max(end);
        }
        let start = cur.next_multiple_of(align);
        (start.checked_add(span)? <= self.base + self.size).then_some((start, self.live.len()))
    }

    /// Records a placement [`Chunk::lowest_fit`] found, at `i` in `live`: it starts at
    /// or after every end before `i` and ends at or before the start at `i`, so it
    /// touches nothing and goes there as [`Chunk::record`] would put it, without
    /// searching again.
    #[inline(always)]
    fn record_fit(&mut self, i: usize, addr: u64, end: u64) {
        debug_assert_eq!(i, self.live.partition_point(|&(a, _)| a < addr));
        debug_assert!(i == 0 || self.live[..i].iter().all(|&(_, e)| e <= addr));
        debug_assert!(self.live.get(i).is_none_or(|&(a, _)| end <= a));
        self.live.insert(i, (addr, end));
        self.used += end - addr;
    }

    /// The live placements as (address, end), sorted by address, of a `paged` chunk.
    fn paged_live(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut starts = self.starts;
        while starts != 0 {
            let first = u64::from(starts.trailing_zeros());
            starts &= starts - 1;
            let end = self.paged_end(first);
            out.push((
                self.base + (first << PAGE_SHIFT),
                self.base + (end << PAGE_SHIFT),
            ));
        }
        out
    }

    /// The page after the last of the placement starting at page `first` (`paged`):
    /// the next placement's first page or the next free page, whichever comes first.
    #[inline(always)]
    fn paged_end(&self, first: u64) -> u64 {
        // Bits above `first` (none when it is the last page: the shift by one more
        // than `first` is done in two, so it never reaches the width).
        let after = (Pages::MAX << first) << 1;
        u64::from(((self.starts | !self.occupied) & after).trailing_zeros())
    }

    /// Keeps the placements in `live` from now on (a recorded placement the bitmaps
    /// cannot hold).
    #[cold]
    fn unpage(&mut self) {
        debug_assert!(self.live.is_empty());
        self.live = self.paged_live();
        self.paged = false;
        self.occupied = 0;
        self.starts = 0;
        self.pages = 0;
    }

    /// Records a placement (replacing one at the same address, as a map would).
    #[inline(always)]
    fn record(&mut self, addr: u64, end: u64) {
        if self.paged {
            let offset = addr.wrapping_sub(self.base);
            let first = offset >> PAGE_SHIFT;
            let count = (end - addr) >> PAGE_SHIFT;
            if addr >= self.base
                && offset % PLACEMENT_ALIGN_BYTES == 0
                && (end - addr) % PLACEMENT_ALIGN_BYTES == 0
                && count > 0
                && first + count <= BITMAP_PAGES
            {
                let mask = page_run(first, count);
                if mask & !self.pages == 0 && mask & self.occupied == 0 {
                    self.occupied |= mask;
                    self.starts |= 1 << first;
                    self.used += end - addr;
                    return;
                }
            }
            self.unpage();
        }
        let i = self.live.partition_point(|&(a, _)| a < addr);
        if self.live.get(i).is_some_and(|&(a, _)| a == addr) {
            self.live[i] = (addr, end);
            self.disjoint = false;
            return;
        }
        let touches_before = i > 0 && self.live[i - 1].1 > addr;
        let touches_after = self.live.get(i).is_some_and(|&(a, _)| a < end);
        if touches_before || touches_after {
            self.disjoint = false;
        }
        self.live.insert(i, (addr, end));
        self.used += end - addr;
    }

    /// Forgets the placement at `addr`, if there is one.
    #[inline(always)]
    fn forget(&mut self, addr: u64) {
        if self.paged {
            let offset = addr.wrapping_sub(self.base);
            let first = offset >> PAGE_SHIFT;
            if addr < self.base || offset % PLACEMENT_ALIGN_BYTES != 0 || first >= BITMAP_PAGES {
                return;
            }
            if self.starts & (1 << first) == 0 {
                return;
            }
            let end = self.paged_end(first);
            self.occupied &= !page_run(first, end - first);
            self.starts &= !(1 << first);
            self.used -= (end - first) << PAGE_SHIFT;
            return;
        }
        let i = self.live.partition_point(|&(a, _)| a < addr);
        if self.live.get(i).is_some_and(|&(a, _)| a == addr) {
            let (a, end) = remove_at(&mut self.live, i);
            self.used = self.used.saturating_sub(end - a);
        }
    }
}

/// A short map kept as a vector sorted by key: an address space's chunks by base and
/// its holes. They are few (holes lie between live chunks, and every placement already
/// walks the live chunks), so a binary search and a shift of a short vector cost less
/// than an ordered map's node walks, and allocate nothing once the vector has grown.
/// Same answers as the `BTreeMap` it replaces, query for query.
#[derive(Clone, Debug)]
struct SortedMap<V> {
    entries: Vec<(u64, V)>,
}

impl<V: Copy> SortedMap<V> {
    fn new() -> SortedMap<V> {
        SortedMap {
            entries: Vec::new(),
        }
    }

    /// The number of entries with a key below `key`.
    #[inline]
    fn rank(&self, key: u64) -> usize {
        self.entries.partition_point(|&(k, _)| k < key)
    }

    fn get(&self, key: u64) -> Option<V> {
        self.entries
            .get(self.rank(key))
            .filter(|&&(k, _)| k == key)
            .map(|&(_, v)| v)
    }

    /// Inserts or replaces the value under `key`.
    fn insert(&mut self, key: u64, value: V) {
        let i = self.rank(key);
        match self.entries.get_mut(i) {
            Some((k, v)) if *k == key => *v = value,
            _ => self.entries.insert(i, (key, value)),
        }
    }

    fn remove(&mut self, key: u64) -> Option<V> {
        let i = self.rank(key);
        match self.entries.get(i) {
            Some(&(k, _)) if k == key => Some(remove_at(&mut self.entries, i).1),
            _ => None,
        }
    }

    /// The entry with the highest key below `key` (`range(..key).next_back()`).
    fn last_below(&self, key: u64) -> Option<(u64, V)> {
        self.rank(key).checked_sub(1).map(|i| self.entries[i])
    }

    /// The entry with the highest key at or below `key` (`range(..=key).next_back()`).
    fn last_at_or_below(&self, key: u64) -> Option<(u64, V)> {
        match key.checked_add(1) {
            Some(above) => self.last_below(above),
            None => self.entries.last().copied(),
        }
    }

    /// The entry with the lowest key at or above `key` (`range(key..).next()`).
    fn first_at_or_above(&self, key: u64) -> Option<(u64, V)> {
        self.entries.get(self.rank(key)).copied()
    }

    /// The entries with keys below `key`, highest first (`range(..key).rev()`).
    fn below_rev(&self, key: u64) -> impl Iterator<Item = (u64, V)> + '_ {
        self.entries[..self.rank(key)].iter().rev().copied()
    }

    /// Every entry, lowest key first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, V)> + '_ {
        self.entries.iter().copied()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// One placement of [`VaSpace::place`] or [`VaSpace::place_at`], to release it by:
/// its address and the chunk holding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// First byte.
    pub addr: u64,
    /// Slot of its chunk.
    chunk: u32,
}

impl Placed {
    /// The placement at `addr` in the chunk of slot `chunk` ([`Placed::chunk`]), for a
    /// holder that keeps the two apart.
    #[inline(always)]
    pub(crate) fn at(addr: u64, chunk: u32) -> Placed {
        Placed { addr, chunk }
    }

    /// The slot of its chunk.
    #[inline(always)]
    pub(crate) fn chunk(&self) -> u32 {
        self.chunk
    }
}

/// The driver's address space as the model sees it (see the module docs).
#[derive(Clone, Debug)]
pub struct VaSpace {
    chunk_bytes: u64,
    /// Lowest address taken so far: new chunks go below it.
    cursor: u64,
    /// No chunk goes below this address.
    floor: u64,
    /// Chunks by slot; `None` for a free slot.
    chunks: Vec<Option<Chunk>>,
    free_slots: Vec<u32>,
    /// Placement vectors of released chunks, kept for new chunks.
    spare_live: Vec<Vec<(u64, u64)>>,
    /// Chunk slots by base address.
    by_base: SortedMap<u32>,
    /// Chunk slots in creation order, oldest first ([`Chunk::pos`]); a dropped chunk
    /// leaves [`NO_CHUNK`] until the vector is compacted.
    order: Vec<u32>,
    /// By place in `order`: an upper bound of the span a placement in that chunk can
    /// get (no span above it fits; 0 where no chunk is): lowered where a search found
    /// no room for a span, raised to the chunk's free bytes when it loses a placement
    /// (a placement more only shortens the free runs, so the bound holds).
    room: Vec<u64>,
    /// By run of [`RUN`] places of `order`: an upper bound of their `room`, so that
    /// rule 2's search, newest chunk first, passes over a run where no chunk has room
    /// (with thousands of chunks live, a search of every chunk on each placement was
    /// most of a replay's time).
    run_room: Vec<u64>,
    /// Places of `order` left by dropped chunks.
    dropped: usize,
    /// Holes left by released chunks: start → end.
    holes: SortedMap<u64>,
}

impl VaSpace {
    /// An empty address space whose first chunk will end at `top`, with chunks of
    /// `chunk_bytes` granularity (a multiple of 2 MiB; 0 means the H100's 32 MiB), and
    /// no chunk below `floor`.
    pub fn new(top: u64, chunk_bytes: u64, floor: u64) -> VaSpace {
        let chunk_bytes = if chunk_bytes == 0 {
            DEFAULT_CHUNK_BYTES
        } else {
            chunk_bytes.next_multiple_of(PLACEMENT_ALIGN_BYTES)
        };
        VaSpace {
            chunk_bytes,
            cursor: top - top % chunk_bytes,
            floor,
            chunks: Vec::new(),
            free_slots: Vec::new(),
            spare_live: Vec::new(),
            by_base: SortedMap::new(),
            order: Vec::new(),
            room: Vec::new(),
            run_room: Vec::new(),
            dropped: 0,
            holes: SortedMap::new(),
        }
    }

    /// The chunk granularity.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn span(&self, size: u64) -> Option<u64> {
        size.max(1).checked_next_multiple_of(PLACEMENT_ALIGN_BYTES)
    }

    fn chunk(&self, slot: u32) -> &Chunk {
        self.chunks[slot as usize].as_ref().expect("live chunk")
    }

    fn chunk_mut(&mut self, slot: u32) -> &mut Chunk {
        self.chunks[slot as usize].as_mut().expect("live chunk")
    }

    fn add_chunk(&mut self, base: u64, size: u64) -> u32 {
        if let Some(old) = self.by_base.get(base) {
            // Only a recorded address can put a chunk where one starts: the new one
            // replaces it, as the address → chunk map this model was written with did.
            self.drop_chunk(old);
        }
        let pos = u32::try_from(self.order.len()).expect("fewer than 2^32 chunks");
        let chunk = Chunk::new(base, size, pos, self.spare_live.pop().unwrap_or_default());
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.chunks[s as usize] = Some(chunk);
                s
            }
            None => {
                self.chunks.push(Some(chunk));
                u32::try_from(self.chunks.len() - 1).expect("fewer than 2^32 live chunks")
            }
        };
        self.by_base.insert(base, slot);
        self.order.push(slot);
        if self.order.len() == RUN + 1 {
            // Many chunks from now on: their bounds are kept.
            self.set_bounds();
        } else if self.bounded() {
            self.room.push(size);
            if pos as usize % RUN == 0 {
                self.run_room.push(size);
            } else {
                let run = self.run_room.last_mut().expect("the run of the last place");
                *run = (*run).max(size);
            }
        }
        self.cursor = self.cursor.min(base);
        self.take_hole_range(base, base + size);
        slot
    }

    /// Forgets a chunk (its range does not become a hole).
    fn drop_chunk(&mut self, slot: u32) -> Chunk {
        let chunk = self.chunks[slot as usize].take().expect("live chunk");
        if self.by_base.get(chunk.base) == Some(slot) {
            self.by_base.remove(chunk.base);
        }
        let pos = chunk.pos as usize;
        let bounded = self.bounded();
        if pos + 1 == self.order.len() {
            // The newest chunk: its place goes, with the gaps before it.
            self.order.pop();
            while self.order.last() == Some(&NO_CHUNK) {
                self.order.pop();
                self.dropped -= 1;
            }
        } else {
            self.order[pos] = NO_CHUNK;
            self.dropped += 1;
            if bounded {
                self.room[pos] = 0;
            }
        }
        self.free_slots.push(slot);
        if self.dropped * 2 > self.order.len() {
            self.compact();
        } else if bounded {
            if self.bounded() {
                // The bounds of places gone go with them (the last run's stays an
                // upper bound of what is left of it).
                self.room.truncate(self.order.len());
                self.run_room.truncate(self.order.len().div_ceil(RUN));
            } else {
                self.room.clear();
                self.run_room.clear();
            }
        }
        chunk
    }

    /// Whether the bounds (`room`, `run_room`) are kept: past [`RUN`] places, where a
    /// search of every chunk would cost more than passing over runs of them.
    #[inline(always)]
    fn bounded(&self) -> bool {
        self.order.len() > RUN
    }

    /// Sets every place's bound from its chunk (its free bytes, or any span where its
    /// placements overlap) and every run's from its places': where the bounds start to
    /// be kept, and after the places change.
    #[cold]
    fn set_bounds(&mut self) {
        let chunks = &self.chunks;
        self.room.clear();
        self.room.extend(self.order.iter().map(|&slot| {
            if slot == NO_CHUNK {
                0
            } else {
                chunks[slot as usize].as_ref().expect("live chunk").room()
            }
        }));
        self.run_room.clear();
        self.run_room.extend(
            self.room
                .chunks(RUN)
                .map(|run| run.iter().copied().max().unwrap_or(0)),
        );
    }

    /// Closes the gaps dropped chunks left in `order` (places change; the order does
    /// not), and sets the bounds again where they are kept.
    #[cold]
    fn compact(&mut self) {
        let mut kept = 0;
        for i in 0..self.order.len() {
            let slot = self.order[i];
            if slot == NO_CHUNK {
                continue;
            }
            self.order[kept] = slot;
            self.chunks[slot as usize].as_mut().expect("live chunk").pos = kept as u32;
            kept += 1;
        }
        self.order.truncate(kept);
        self.dropped = 0;
        if self.bounded() {
            self.set_bounds();
        } else {
            self.room.clear();
            self.run_room.clear();
        }
    }

    #[inline(always)]
    fn record(&mut self, slot: u32, addr: u64, end: u64) -> Placed {
        let bounded = self.bounded();
        let chunk = self.chunk_mut(slot);
        chunk.record(addr, end);
        // A placement more leaves no longer free run, so the bound holds as it is,
        // unless a recorded placement went over another or replaced one at its address
        // (perhaps shorter): then any span may fit.
        if !chunk.disjoint && bounded {
            let pos = chunk.pos as usize;
            self.reset_bound(pos, u64::MAX);
        }
        Placed { addr, chunk: slot }
    }

    /// The bound of the chunk at `pos` in `order` becomes `room`, a fresh upper bound
    /// of the span it has room for (which may be above the old one), and its run's rises
    /// to it. Only while the bounds are kept.
    #[inline(always)]
    fn reset_bound(&mut self, pos: usize, room: u64) {
        self.room[pos] = room;
        let run = &mut self.run_room[pos / RUN];
        *run = (*run).max(room);
    }

    /// Removes `[lo, hi)` from the holes (a chunk now covers it): the holes below `hi`,
    /// from the highest down to the first that ends at or below `lo` (holes overlap
    /// only after recorded addresses put chunks over each other; then this order is
    /// the one the model was measured with).
    fn take_hole_range(&mut self, lo: u64, hi: u64) {
        let mut below = hi;
        // Keys below `below` are untouched by the loop's own insertions (at `s` and
        // `hi`, both at or above it), so this walks the holes as they were.
        while let Some((s, e)) = self.holes.last_below(below) {
            if e <= lo {
                break;
            }
            self.holes.remove(s);
            if s < lo {
                self.holes.insert(s, lo);
            }
            if e > hi {
                self.holes.insert(hi, e);
            }
            below = s;
        }
    }

    /// Where the driver would place an allocation of `size` bytes; the placement is
    /// recorded until [`VaSpace::release`]. `None` when no chunk has room and a new
    /// one would go below the floor.
    pub fn place(&mut self, size: u64) -> Option<Placed> {
        let span = self.span(size)?;
        // Rule 2: the newest chunk with room, at its lowest free address.
        let found = if self.bounded() {
            self.place_in_chunks(span)
        } else {
            // Few chunks: each is read (a dropped chunk's gap, `NO_CHUNK`, is no slot).
            let chunks = &mut self.chunks;
            self.order.iter().rev().find_map(|&slot| {
                let chunk = chunks.get_mut(slot as usize)?.as_mut()?;
                let addr = chunk.take(span)?;
                Some(Placed { addr, chunk: slot })
            })
        };
        if found.is_some() {
            return found;
        }
        // Rule 3: a new chunk, from the highest hole strictly larger than it, else
        // below everything.
        let size = span.checked_next_multiple_of(self.chunk_bytes)?;
        let base = match self.holes.iter().rev().find(|&(s, e)| e - s > size) {
            Some((_, e)) => e - size,
            None => (self.cursor - self.cursor % self.chunk_bytes)
                .checked_sub(size)
                .filter(|&b| b >= self.floor)?,
        };
        let slot = self.add_chunk(base, size);
        Some(self.record(slot, base, base + span))
    }

    /// Rule 2 of [`VaSpace::place`]: the newest chunk where `span` bytes are free, at
    /// its lowest free address, recorded there. The chunks are read newest first, as
    /// the rule says, passing over each one whose bound (`room`) is below `span` and
    /// each run of them whose bound is: those have no room for it. A chunk found
    /// without room lowers its bound below `span`, and a run searched to its end
    /// without finding one takes the highest bound of its chunks.
    #[inline]
    fn place_in_chunks(&mut self, span: u64) -> Option<Placed> {
        let mut end = self.order.len();
        while end > 0 {
            let run = (end - 1) / RUN;
            let first = run * RUN;
            if self.run_room[run] >= span {
                let order = &self.order[first..end];
                let rooms = &mut self.room[first..end];
                for (room, &slot) in rooms.iter_mut().zip(order).rev() {
                    if *room < span {
                        continue;
                    }
                    let chunk = self.chunks[slot as usize].as_mut().expect("live chunk");
                    if let Some(addr) = chunk.take(span) {
                        // The bound holds: a placement more leaves no longer free run.
                        return Some(Placed { addr, chunk: slot });
                    }
                    // No free run of `span` bytes: none longer either.
                    *room = span - 1;
                }
                self.run_room[run] = rooms.iter().copied().max().unwrap_or(0);
            }
            end = first;
        }
        None
    }

    /// Records an allocation the driver placed at `addr` (a recorded address): inside
    /// the chunk that holds it, or in a new chunk starting there (as large as the
    /// rules make it, short of the next chunk above). `None` (nothing recorded) when
    /// its span is beyond any address.
    pub fn place_at(&mut self, addr: u64, size: u64) -> Option<Placed> {
        let span = self.span(size)?;
        let end = addr.saturating_add(span);
        let holder = self
            .by_base
            .last_at_or_below(addr)
            .filter(|&(b, slot)| b.saturating_add(self.chunk(slot).size) >= end)
            .map(|(_, slot)| slot);
        if let Some(slot) = holder {
            return Some(self.record(slot, addr, end));
        }
        // Chunks the placement would overlap lose the overlap's claim: the recorded
        // address is the truth, so the model's chunk there was wrong. Shrink them.
        let overlapping: Vec<(u64, u32)> = self
            .by_base
            .below_rev(end)
            .take_while(|&(b, slot)| b.saturating_add(self.chunk(slot).size) > addr)
            .collect();
        for (b, slot) in overlapping {
            let c = self.chunk_mut(slot);
            if b < addr && c.all_end_by(addr) {
                c.shrink(addr - b);
            }
        }
        let next = self
            .by_base
            .first_at_or_above(addr)
            .map_or(u64::MAX, |(b, _)| b);
        let size = span
            .checked_next_multiple_of(self.chunk_bytes)
            .unwrap_or(span)
            .min(next.saturating_sub(addr))
            .min(u64::MAX - addr)
            .max(end - addr);
        let slot = self.add_chunk(addr, size);
        Some(self.record(slot, addr, end))
    }

    /// Frees a placement; a chunk left empty becomes a hole. A placement no longer
    /// there is ignored.
    pub fn release(&mut self, placed: Placed) {
        let bounded = self.bounded();
        let Some(Some(chunk)) = self.chunks.get_mut(placed.chunk as usize) else {
            return;
        };
        chunk.forget(placed.addr);
        if !chunk.is_empty() {
            if bounded {
                // Room again: the bound goes back up to the chunk's free bytes.
                let (pos, room) = (chunk.pos as usize, chunk.room());
                self.reset_bound(pos, room);
            }
            return;
        }
        let mut chunk = self.drop_chunk(placed.chunk);
        let (mut lo, mut hi) = (chunk.base, chunk.base + chunk.size);
        chunk.live.clear();
        self.spare_live.push(chunk.live);
        if let Some((s, e)) = self.holes.last_at_or_below(lo) {
            if e == lo {
                self.holes.remove(s);
                lo = s;
            }
        }
        if let Some(e) = self.holes.remove(hi) {
            hi = e;
        }
        self.holes.insert(lo, hi);
    }
}

/// A [`VaSpace`] released by address, as a recorded run's frees name them: the
/// placement last recorded at an address is the one its release frees.
#[derive(Clone, Debug)]
struct ByAddress {
    va: VaSpace,
    owner: BTreeMap<u64, Placed>,
}

impl ByAddress {
    fn new(va: VaSpace) -> ByAddress {
        ByAddress {
            va,
            owner: BTreeMap::new(),
        }
    }

    fn place(&mut self, size: u64) -> Option<u64> {
        let p = self.va.place(size)?;
        self.owner.insert(p.addr, p);
        Some(p.addr)
    }

    fn place_at(&mut self, addr: u64, size: u64) {
        if let Some(p) = self.va.place_at(addr, size) {
            self.owner.insert(p.addr, p);
        }
    }

    fn release(&mut self, addr: u64) {
        if let Some(p) = self.owner.remove(&addr) {
            self.va.release(p);
        }
    }
}

/// How well the model places a recorded sequence of segments: see
/// [`check_placements`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementCheck {
    /// Segment allocations after the first (the first one anchors the model).
    pub segments: usize,
    /// Of those, placed by the model, run on its own from the first segment's address
    /// (no other hint), on the same side of every live segment as on the GPU: the order
    /// best-fit ties depend on.
    pub order_right: usize,
    /// Of those, placed by the model at exactly the recorded address when every
    /// earlier segment is where the GPU put it: the rules alone, without the drift of
    /// earlier mistakes.
    pub exact_right: usize,
    /// Of those, placed below every live segment on the GPU: what a model that stacks
    /// every segment below the last (the old top-down one) gets right.
    pub below_all: usize,
}

/// One `cuMemAlloc` (`alloc` true) or `cuMemFree` of a recorded run, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedPlacement {
    /// Allocation or free.
    pub alloc: bool,
    /// The address the driver returned (or freed).
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
}

/// Runs the model over a recorded sequence of segment allocations and frees and counts
/// how often it places a segment as the driver did (see [`PlacementCheck`]).
pub fn check_placements(ops: &[RecordedPlacement], chunk_bytes: u64) -> PlacementCheck {
    let mut check = PlacementCheck::default();
    let Some(first) = ops.iter().find(|o| o.alloc) else {
        return check;
    };
    let top = first
        .addr
        .saturating_add(first.size.next_multiple_of(chunk_bytes.max(1)));
    let mut own = ByAddress::new(VaSpace::new(top, chunk_bytes, 0));
    let mut forced = ByAddress::new(VaSpace::new(top, chunk_bytes, 0));
    // recorded address -> (model's address, size) of live segments
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut anchored = false;
    for op in ops {
        if !op.alloc {
            if let Some(p) = live.remove(&op.addr) {
                own.release(p);
            }
            forced.release(op.addr);
            continue;
        }
        if !anchored {
            anchored = true;
            own.place_at(op.addr, op.size);
            forced.place_at(op.addr, op.size);
            live.insert(op.addr, op.addr);
            continue;
        }
        check.segments += 1;
        if live.keys().all(|&real| real > op.addr) {
            check.below_all += 1;
        }
        let predicted = forced.clone().place(op.size);
        if predicted == Some(op.addr) {
            check.exact_right += 1;
        }
        forced.place_at(op.addr, op.size);
        let Some(p) = own.place(op.size) else {
            continue;
        };
        if live
            .iter()
            .all(|(&real, &model)| (real < op.addr) == (model < p))
        {
            check.order_right += 1;
        }
        live.insert(op.addr, p);
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const TOP: u64 = 0x7f00_0000_0000;

    fn p(v: &mut ByAddress, size: u64) -> u64 {
        v.place(size).expect("room")
    }

    /// The address model as first written (ordered maps, release by address): the
    /// reference the slot-table version must agree with.
    #[allow(dead_code)]
    mod reference {
        use super::super::{DEFAULT_CHUNK_BYTES, PLACEMENT_ALIGN_BYTES};
        use std::collections::BTreeMap;

        #[derive(Clone, Debug)]
        struct OldChunk {
            size: u64,
            /// Creation order: chunks are searched newest first.
            seq: u64,
            /// Live placements in this chunk: address → end.
            live: BTreeMap<u64, u64>,
        }

        impl OldChunk {
            /// The lowest `align`-aligned address in this chunk (at `base`) where `span` bytes
            /// are free.
            fn lowest_fit(&self, base: u64, span: u64, align: u64) -> Option<u64> {
                let mut cur = base;
                for (&addr, &end) in &self.live {
                    let start = cur.next_multiple_of(align);
                    if start.checked_add(span).is_some_and(|e| e <= addr) {
                        return Some(start);
                    }
                    cur = cur.max(end);
                }
                let start = cur.next_multiple_of(align);
                (start.checked_add(span)? <= base + self.size).then_some(start)
            }
        }

        /// The driver's address space as the model sees it (see the module docs).
        #[derive(Clone, Debug)]
        pub struct OldVaSpace {
            chunk_bytes: u64,
            align: u64,
            /// Lowest address taken so far: new chunks go below it.
            cursor: u64,
            /// No chunk goes below this address.
            floor: u64,
            /// Chunks by base address.
            chunks: BTreeMap<u64, OldChunk>,
            /// Chunk bases by creation order, newest last.
            by_seq: BTreeMap<u64, u64>,
            next_seq: u64,
            /// Holes left by released chunks: start → end.
            pub holes: BTreeMap<u64, u64>,
            /// Chunk base of every live placement.
            owner: BTreeMap<u64, u64>,
        }

        impl OldVaSpace {
            /// An empty address space whose first chunk will end at `top`, with chunks of
            /// `chunk_bytes` granularity (a multiple of 2 MiB; 0 means the H100's 32 MiB), and
            /// no chunk below `floor`.
            pub fn new(top: u64, chunk_bytes: u64, floor: u64) -> OldVaSpace {
                let chunk_bytes = if chunk_bytes == 0 {
                    DEFAULT_CHUNK_BYTES
                } else {
                    chunk_bytes.next_multiple_of(PLACEMENT_ALIGN_BYTES)
                };
                OldVaSpace {
                    chunk_bytes,
                    align: PLACEMENT_ALIGN_BYTES,
                    cursor: top - top % chunk_bytes,
                    floor,
                    chunks: BTreeMap::new(),
                    by_seq: BTreeMap::new(),
                    next_seq: 0,
                    holes: BTreeMap::new(),
                    owner: BTreeMap::new(),
                }
            }

            /// The chunk granularity.
            pub fn chunk_bytes(&self) -> u64 {
                self.chunk_bytes
            }

            fn span(&self, size: u64) -> Option<u64> {
                size.max(1).checked_next_multiple_of(self.align)
            }

            fn add_chunk(&mut self, base: u64, size: u64) {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.chunks.insert(
                    base,
                    OldChunk {
                        size,
                        seq,
                        live: BTreeMap::new(),
                    },
                );
                self.by_seq.insert(seq, base);
                self.cursor = self.cursor.min(base);
                self.take_hole_range(base, base + size);
            }

            fn record(&mut self, base: u64, addr: u64, end: u64) {
                self.chunks
                    .get_mut(&base)
                    .expect("chunk of a placement")
                    .live
                    .insert(addr, end);
                self.owner.insert(addr, base);
            }

            /// Removes `[lo, hi)` from the holes (a chunk now covers it).
            fn take_hole_range(&mut self, lo: u64, hi: u64) {
                let overlapping: Vec<(u64, u64)> = self
                    .holes
                    .range(..hi)
                    .rev()
                    .take_while(|&(_, &e)| e > lo)
                    .map(|(&s, &e)| (s, e))
                    .collect();
                for (s, e) in overlapping {
                    self.holes.remove(&s);
                    if s < lo {
                        self.holes.insert(s, lo);
                    }
                    if e > hi {
                        self.holes.insert(hi, e);
                    }
                }
            }

            /// Where the driver would place an allocation of `size` bytes; the placement is
            /// recorded until [`OldVaSpace::release`]. `None` when no chunk has room and a new
            /// one would go below the floor.
            pub fn place(&mut self, size: u64) -> Option<u64> {
                let span = self.span(size)?;
                // Rule 2: the newest chunk with room, at its lowest free address.
                let found = self.by_seq.values().rev().find_map(|&base| {
                    self.chunks[&base]
                        .lowest_fit(base, span, self.align)
                        .map(|addr| (base, addr))
                });
                if let Some((base, addr)) = found {
                    self.record(base, addr, addr + span);
                    return Some(addr);
                }
                // Rule 3: a new chunk, from the highest hole strictly larger than it, else
                // below everything.
                let size = span.checked_next_multiple_of(self.chunk_bytes)?;
                let base = match self.holes.iter().rev().find(|&(&s, &e)| e - s > size) {
                    Some((_, &e)) => e - size,
                    None => (self.cursor - self.cursor % self.chunk_bytes)
                        .checked_sub(size)
                        .filter(|&b| b >= self.floor)?,
                };
                self.add_chunk(base, size);
                self.record(base, base, base + span);
                Some(base)
            }

            /// Records an allocation the driver placed at `addr` (a recorded address): inside
            /// the chunk that holds it, or in a new chunk starting there (as large as the
            /// rules make it, short of the next chunk above).
            pub fn place_at(&mut self, addr: u64, size: u64) {
                let Some(span) = self.span(size) else {
                    return;
                };
                let end = addr.saturating_add(span);
                let holder = self
                    .chunks
                    .range(..=addr)
                    .next_back()
                    .filter(|(&b, c)| b.saturating_add(c.size) >= end)
                    .map(|(&b, _)| b);
                if let Some(base) = holder {
                    self.record(base, addr, end);
                    return;
                }
                // Chunks the placement would overlap lose the overlap's claim: the recorded
                // address is the truth, so the model's chunk there was wrong. Shrink them.
                let overlapping: Vec<u64> = self
                    .chunks
                    .range(..end)
                    .rev()
                    .take_while(|(&b, c)| b.saturating_add(c.size) > addr)
                    .map(|(&b, _)| b)
                    .collect();
                for b in overlapping {
                    let c = &self.chunks[&b];
                    if b < addr && c.live.values().all(|&e| e <= addr) {
                        self.chunks.get_mut(&b).expect("chunk").size = addr - b;
                    }
                }
                let next = self
                    .chunks
                    .range(addr..)
                    .next()
                    .map_or(u64::MAX, |(&b, _)| b);
                let size = span
                    .checked_next_multiple_of(self.chunk_bytes)
                    .unwrap_or(span)
                    .min(next.saturating_sub(addr))
                    .min(u64::MAX - addr)
                    .max(end - addr);
                self.add_chunk(addr, size);
                self.record(addr, addr, end);
            }

            /// Frees the placement at `addr`; a chunk left empty becomes a hole. Unknown
            /// addresses are ignored.
            pub fn release(&mut self, addr: u64) {
                let Some(base) = self.owner.remove(&addr) else {
                    return;
                };
                let chunk = self.chunks.get_mut(&base).expect("chunk of a placement");
                chunk.live.remove(&addr);
                if !chunk.live.is_empty() {
                    return;
                }
                let chunk = self.chunks.remove(&base).expect("chunk");
                self.by_seq.remove(&chunk.seq);
                let (mut lo, mut hi) = (base, base + chunk.size);
                if let Some((&s, &e)) = self.holes.range(..=lo).next_back() {
                    if e == lo {
                        self.holes.remove(&s);
                        lo = s;
                    }
                }
                if let Some(e) = self.holes.remove(&hi) {
                    hi = e;
                }
                self.holes.insert(lo, hi);
            }
        }
    }

    /// Runs `steps` random placements (`place_pct` percent of the steps at `step`, the
    /// rest releases, and recorded placements among them where `recorded`) of seed
    /// `seed` through the slot-table model and the ordered-map model it replaces,
    /// asserting the same addresses and holes after every step; `false` when the
    /// ordered-map model failed part way (recorded addresses that put a chunk where
    /// another starts made it fail, "no entry found").
    fn agrees_with_the_model(
        seed: u64,
        steps: usize,
        place_pct: impl Fn(usize) -> u64,
        recorded: bool,
        sizes: impl Fn(&mut dyn FnMut() -> u64) -> u64,
    ) -> bool {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let mut next = crate::xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let top = 1u64 << 40;
        let floor = top - (1 << 34);
        let mut new = ByAddress::new(VaSpace::new(top, 0, floor));
        let mut old = reference::OldVaSpace::new(top, 0, floor);
        // Live placements as (address, size asked).
        let mut live: Vec<(u64, u64)> = Vec::new();
        for step in 0..steps {
            let roll = next() % 100;
            let places = place_pct(step);
            if roll < places || live.is_empty() {
                let size = sizes(&mut next);
                let Ok(want) = catch_unwind(AssertUnwindSafe(|| old.place(size))) else {
                    return false;
                };
                let got = new.place(size);
                assert_eq!(got, want, "seed {seed} step {step}: place {size}");
                if let Some(a) = got {
                    live.push((a, size));
                }
            } else if recorded && roll < places + 15 {
                // A recorded address near a live one, aligned or not.
                let (near, near_size) = live[(next() % live.len() as u64) as usize];
                let addr = match next() % 3 {
                    0 => near + near_size.next_multiple_of(2 * MIB),
                    1 => near.saturating_sub((1 + next() % 8) * 2 * MIB),
                    _ => near + near_size + next() % (4 * MIB),
                };
                let size = match next() % 2 {
                    0 => (1 + next() % 8) * 2 * MIB,
                    _ => 1 + next() % (40 * MIB),
                };
                let end = addr.saturating_add(size);
                // Not over a live region: the device refuses those.
                if live.iter().any(|&(a, s)| a < end && addr < a + s) {
                    continue;
                }
                if catch_unwind(AssertUnwindSafe(|| old.place_at(addr, size))).is_err() {
                    return false;
                }
                new.place_at(addr, size);
                live.push((addr, size));
            } else {
                let (a, _) = live.swap_remove((next() % live.len() as u64) as usize);
                if catch_unwind(AssertUnwindSafe(|| old.release(a))).is_err() {
                    return false;
                }
                new.release(a);
            }
            let holes: BTreeMap<u64, u64> = new.va.holes.iter().collect();
            assert_eq!(holes, old.holes, "seed {seed} step {step}: holes");
        }
        true
    }

    /// A chunk kept as page bitmaps answers as one kept as a list of placements, step
    /// for step: the same addresses taken, the same room, emptiness and ends, over
    /// random takes, releases (of live placements, and of addresses that are not one)
    /// and recorded placements (aligned and not, over others, at a live placement's
    /// address), which turn the bitmaps into the list; chunks of up to 128 pages and
    /// one page more (never paged).
    #[test]
    fn paged_chunks_agree_with_listed_chunks() {
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let page = PLACEMENT_ALIGN_BYTES;
        let mut unpaged = 0;
        for round in 0..400 {
            let pages = [1, 16, 63, 64, 65, 127, 128, 129][round % 8];
            let base = (1u64 << 40) + (round as u64) * (1 << 32);
            let mut paged = Chunk::new(base, pages * page, 0, Vec::new());
            assert_eq!(paged.paged, pages <= BITMAP_PAGES);
            let mut listed = Chunk::new(base, pages * page, 0, Vec::new());
            listed.paged = false;
            listed.pages = 0;
            let mut live: Vec<u64> = Vec::new();
            for step in 0..300 {
                let ctx = format!("round {round} ({pages} pages) step {step}");
                match next() % 10 {
                    0..=4 => {
                        let span = match next() % 3 {
                            0 => page,
                            1 => (1 + next() % 8) * page,
                            _ => (1 + next() % pages.max(2)) * page,
                        };
                        let got = paged.take(span);
                        assert_eq!(got, listed.take(span), "{ctx}: take {span}");
                        live.extend(got);
                    }
                    5..=7 if !live.is_empty() => {
                        let at = (next() % live.len() as u64) as usize;
                        let addr = live.swap_remove(at);
                        paged.forget(addr);
                        listed.forget(addr);
                    }
                    8 => {
                        // An address that may be no placement's start.
                        let addr = base + (next() % (pages * 2 + 1)) * page / 2;
                        if !live.contains(&addr) {
                            paged.forget(addr);
                            listed.forget(addr);
                        }
                    }
                    _ => {
                        // A recorded placement: mostly whole pages, sometimes not, maybe
                        // over others or at a live placement's start.
                        let addr = match next() % 4 {
                            0 => base + (next() % (pages * 2)) * page / 2,
                            _ => base + (next() % pages) * page,
                        };
                        let span = (1 + next() % 4) * page;
                        let end = (addr + span).min(base + pages * page);
                        if end > addr && next() % 4 == 0 {
                            paged.record(addr, end);
                            listed.record(addr, end);
                            live.retain(|&a| a != addr);
                            live.push(addr);
                        }
                    }
                }
                assert_eq!(paged.is_empty(), listed.is_empty(), "{ctx}: empty");
                assert_eq!(paged.room(), listed.room(), "{ctx}: room");
                let placed = if paged.paged {
                    paged.paged_live()
                } else {
                    paged.live.clone()
                };
                assert_eq!(placed, listed.live, "{ctx}: placements");
                let probe = base + (next() % (pages + 1)) * page;
                assert_eq!(
                    paged.all_end_by(probe),
                    listed.all_end_by(probe),
                    "{ctx}: ends"
                );
            }
            unpaged += usize::from(!paged.paged && pages <= BITMAP_PAGES);
        }
        assert!(
            unpaged > 20,
            "recorded placements turned only {unpaged} chunks to lists"
        );
    }

    /// The sizes of the first model test: whole pages, a few pages, anything to 300 MiB.
    fn mixed_sizes(next: &mut dyn FnMut() -> u64) -> u64 {
        match next() % 3 {
            0 => 2 * MIB,
            1 => (1 + next() % 16) * 2 * MIB,
            _ => 1 + next() % (300 * MIB),
        }
    }

    /// Random placements, recorded placements (aligned and not, never over a live
    /// region, as the device asks them) and releases give the same addresses and the
    /// same holes in the slot-table model as in the ordered-map model it replaces, for
    /// as long as that model gives an answer (most sequences run to the end).
    #[test]
    fn agrees_with_the_ordered_map_model() {
        let seeds = 300u64;
        let completed = (1..=seeds)
            .filter(|&seed| agrees_with_the_model(seed, 600, |_| 45, true, mixed_sizes))
            .count() as u64;
        assert!(
            completed * 10 >= seeds * 8,
            "only {completed} of {seeds} ran to the end"
        );
    }

    /// With hundreds of chunks live (placements of 2 to 64 MiB piling up, then mostly
    /// released: runs of chunks passed over by their bounds, chunks found without
    /// room, the creation order compacted after many releases), the same addresses and
    /// holes as the ordered-map model, with and without recorded placements.
    #[test]
    fn many_chunks_agree_with_the_ordered_map_model() {
        let grow_then_shrink = |step: usize| if step < 1500 { 75 } else { 20 };
        let pages = |next: &mut dyn FnMut() -> u64| match next() % 4 {
            0 => 2 * MIB,
            1 => (1 + next() % 10) * 2 * MIB,
            _ => 1 + next() % (64 * MIB),
        };
        for seed in 1..=12u64 {
            assert!(agrees_with_the_model(
                seed,
                4000,
                grow_then_shrink,
                false,
                pages
            ));
        }
        let completed = (13..=36u64)
            .filter(|&seed| agrees_with_the_model(seed, 3000, grow_then_shrink, true, pages))
            .count();
        assert!(completed >= 12, "only {completed} of 24 ran to the end");
    }

    /// `SortedMap` answers every query as the `BTreeMap` it replaced, over random
    /// inserts (new keys and replacements), removals and lookups near the keys.
    #[test]
    fn sorted_map_is_an_ordered_map() {
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1du64);
        let mut fast: SortedMap<u64> = SortedMap::new();
        let mut map: BTreeMap<u64, u64> = BTreeMap::new();
        for step in 0..20_000 {
            // Keys from a small range (hits and misses), and the ends of u64.
            let key = match next() % 10 {
                0 => 0,
                1 => u64::MAX,
                _ => next() % 64,
            };
            let value = next();
            match next() % 4 {
                0 => {
                    fast.insert(key, value);
                    map.insert(key, value);
                }
                1 => assert_eq!(fast.remove(key), map.remove(&key), "step {step}"),
                _ => {}
            }
            let pair = |(&k, &v): (&u64, &u64)| (k, v);
            assert_eq!(fast.get(key), map.get(&key).copied(), "step {step}");
            assert_eq!(
                fast.last_below(key),
                map.range(..key).next_back().map(pair),
                "step {step}"
            );
            assert_eq!(
                fast.last_at_or_below(key),
                map.range(..=key).next_back().map(pair),
                "step {step}"
            );
            assert_eq!(
                fast.first_at_or_above(key),
                map.range(key..).next().map(pair),
                "step {step}"
            );
            assert!(
                fast.below_rev(key).eq(map.range(..key).rev().map(pair)),
                "step {step}"
            );
            assert!(fast.iter().eq(map.iter().map(pair)), "step {step}");
            assert_eq!(fast.len(), map.len(), "step {step}");
        }
    }

    /// No chunk goes below the floor: the model says there is no room instead of
    /// wrapping around.
    #[test]
    fn the_floor_is_respected() {
        let mut v = ByAddress::new(VaSpace::new(64 * MIB, 0, 2 * MIB));
        assert_eq!(v.place(20 * MIB), Some(32 * MIB));
        assert_eq!(v.place(20 * MIB), None, "would reach below 2 MiB");
        assert_eq!(
            v.place(10 * MIB),
            Some(32 * MIB + 20 * MIB),
            "a leftover still fits"
        );
        let mut w = ByAddress::new(VaSpace::new(u64::MAX, 0, 0));
        assert_eq!(w.place(u64::MAX), None);
        w.place_at(u64::MAX - 4 * MIB, 64 * MIB);
    }

    /// Large allocations take 32 MiB-rounded chunks stacked downward, each at its
    /// chunk's bottom (the H100's 20 MiB and 64 MiB + 1 probes: gaps of 32 and 96 MiB).
    #[test]
    fn chunks_stack_downward() {
        let mut v = ByAddress::new(VaSpace::new(TOP, 0, 0));
        let a = p(&mut v, 20 * MIB);
        let b = p(&mut v, 20 * MIB);
        assert_eq!(a, TOP - 32 * MIB);
        assert_eq!(a - b, 32 * MIB);
        let c = p(&mut v, 64 * MIB + 1);
        let d = p(&mut v, 64 * MIB + 1);
        assert_eq!(b - c, 96 * MIB);
        assert_eq!(c - d, 96 * MIB);
    }

    /// 2 MiB allocations fill the newest chunk's leftover from its lowest free address
    /// up, then the chunk before it.
    #[test]
    fn small_ones_fill_the_newest_leftover() {
        let mut v = ByAddress::new(VaSpace::new(TOP, 0, 0));
        let a = p(&mut v, 124 * MIB); // chunk of 128: 4 MiB left at its top
        let b = p(&mut v, 234 * MIB); // chunk of 256: 22 MiB left
        assert_eq!(p(&mut v, 2 * MIB), b + 234 * MIB);
        assert_eq!(p(&mut v, 2 * MIB), b + 236 * MIB);
        // 18 MiB left in b's chunk: a 20 MiB one needs a chunk of its own.
        let c = p(&mut v, 20 * MIB);
        assert!(c < b);
        // c's leftover (12 MiB) is newest now.
        assert_eq!(p(&mut v, 2 * MIB), c + 20 * MIB);
        assert!(a > b);
    }

    /// A released chunk becomes a hole; a new chunk takes the highest hole strictly
    /// larger than it, at the hole's top, and a hole of exactly its size is passed
    /// over.
    #[test]
    fn holes_are_reused_from_the_top() {
        let mut v = ByAddress::new(VaSpace::new(TOP, 0, 0));
        let a = p(&mut v, 128 * MIB); // chunk [a, a+128)
        let b = p(&mut v, 160 * MIB); // chunk [b, b+160)
        let _c = p(&mut v, 64 * MIB);
        v.release(a);
        v.release(b);
        // One merged hole [b, a+128) of 288 MiB: a 96 MiB chunk at its top.
        let d = p(&mut v, 84 * MIB);
        assert_eq!(d, a + 128 * MIB - 96 * MIB);
        // The rest, [b, d) = 192 MiB, is exactly a 192 MiB chunk: not taken.
        let e = p(&mut v, 180 * MIB);
        assert!(e < b, "a hole of exactly the chunk's size is passed over");
        let f = p(&mut v, 150 * MIB); // 160 < 192: fits at the hole's top
        assert_eq!(f, d - 160 * MIB);
    }

    /// A chunk stays while any placement in it lives, and its freed part is reused
    /// from its bottom.
    #[test]
    fn a_chunk_with_a_live_placement_is_kept() {
        let mut v = ByAddress::new(VaSpace::new(TOP, 0, 0));
        let big = p(&mut v, 252 * MIB); // chunk of 256, 4 MiB left
        let small = p(&mut v, 2 * MIB);
        assert_eq!(small, big + 252 * MIB);
        v.release(big);
        assert_eq!(p(&mut v, 150 * MIB), big, "the chunk's bottom again");
        assert_eq!(p(&mut v, 68 * MIB), big + 150 * MIB, "then just above");
    }

    /// Recorded placements are adopted: inside the chunk holding them, or as a new
    /// chunk there; the model continues from them.
    #[test]
    fn recorded_placements_are_adopted() {
        let mut v = ByAddress::new(VaSpace::new(TOP, 0, 0));
        let base = 0x7e00_0000_0000;
        v.place_at(base, 124 * MIB);
        assert_eq!(p(&mut v, 2 * MIB), base + 124 * MIB, "its chunk's leftover");
        assert_eq!(p(&mut v, 20 * MIB), base - 32 * MIB, "below it");
        v.place_at(base + 126 * MIB, 2 * MIB);
        v.release(base);
        v.release(base + 124 * MIB);
        v.release(base + 126 * MIB);
        assert_eq!(v.va.holes.len(), 1);
    }
}
