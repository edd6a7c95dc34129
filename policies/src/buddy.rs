//! Binary buddy allocation inside large segments.
//!
//! The classic buddy system (Knuth, TAOCP vol. 1 §2.5), run inside segments of one
//! fixed size drawn from the device. It trades internal fragmentation (every block is a
//! power of two, so up to half of it can be slack) for constant-shape bookkeeping and
//! merging that needs no neighbour links: a block's buddy is found by arithmetic.
//!
//! # Rules
//!
//! - **Rounding.** A request of `n` bytes gets a block of `max(n.next_power_of_two(),
//!   min_block_bytes)` bytes; [`Allocation::block_bytes`] and the allocated bytes count
//!   the whole block.
//! - **Normal requests** (block ≤ `segment_bytes`) are carved from segments of exactly
//!   `segment_bytes`. Free blocks sit in one ordered set per order (order `k` holds
//!   blocks of `min_block_bytes << k`), shared by all segments. The search takes the
//!   smallest order that has a free block and is at least the request's order, and
//!   within it the first block in *policy order*: the segment obtained first, then the
//!   lowest address inside it; a larger block is split in halves down to the request's
//!   order, the upper halves going back to the free sets. Only if no free block fits is
//!   a new segment drawn from the device.
//! - **Policy order, not driver order.** Segments are ordered by when they were
//!   obtained (as if each were appended after the others), never by the address the
//!   device gave them, so no decision depends on where the device places a segment: the
//!   simulated device (with its address model, or recorded PyTorch addresses) and a GPU
//!   decide the same. Ordering by device address made top-down and bottom-up placements
//!   of one trace differ in which segment a block came from, and so in what merged.
//! - **Merging.** On free, a block merges with its buddy (address `segment base +
//!   (offset XOR block size)`) while the buddy is free and of the same order, up to a
//!   whole segment.
//! - **Oversize requests** (block > `segment_bytes`, e.g. a 1 GiB + 1 B request with the
//!   defaults: a 2 GiB block) get a segment of exactly the block size to themselves.
//!   When freed, such a segment is cached whole and reused by the next oversize request
//!   of the same block size (lowest address first).
//! - **Caching.** A segment whose blocks are all free (one whole free block) stays cached
//!   until [`Policy::empty_cache`] or memory pressure, as do free oversize segments.
//! - **Out of memory.** When the device refuses a segment, the policy releases every
//!   wholly free segment (normal and oversize) and asks once more; if that fails too, the
//!   request ends in [`AllocError::OutOfMemory`] with `tried_bytes` the segment size asked
//!   for. Live allocations are never touched.
//! - **Streams are ignored.** There is a single pool; the policy does not track which
//!   stream uses a block, so stream safety (not reusing a block while another stream may
//!   still read it) is the caller's job, as with a plain `cudaMalloc`/`cudaFree` pair.
//!
//! # Options ([`BuddyOptions`])
//!
//! - `min_block_bytes` (default 512 B): the smallest block, a power of two ≥ 1.
//! - `segment_bytes` (default 1 GiB): the size of each normal segment, a power of two
//!   between `min_block_bytes` and 2^40 bytes.
//!
//! # Snapshots
//!
//! Each live segment is one [`SegmentSnapshot`] (pool `buddy` or `buddy-oversize`,
//! stream 0), its blocks tiling it in address order. Free blocks report 0 requested
//! bytes: after merging there is no single last tenant.

use std::collections::{BTreeMap, BTreeSet};

use crate::device::{Device, DeviceAddr, DeviceError, Segment};
use crate::lease::Leases;
use crate::options::{Field, FieldValue, PolicyOptions};
use crate::policy::{
    AllocError, Allocation, BlockSnapshot, BlockState, Policy, PolicyStats, Request,
    SegmentSnapshot, StreamId, MAX_REQUEST_BYTES,
};
use crate::registry::OptionsError;

/// Largest allowed `segment_bytes`: 2^40 bytes (1 TiB).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;

/// Options of the buddy policy. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuddyOptions {
    /// Smallest block, a power of two (default 512 B).
    pub min_block_bytes: u64,
    /// Size of each segment the policy draws from the device, a power of two (default 1 GiB).
    pub segment_bytes: u64,
}

impl Default for BuddyOptions {
    fn default() -> Self {
        BuddyOptions {
            min_block_bytes: 512,
            segment_bytes: 1 << 30,
        }
    }
}

impl PolicyOptions for BuddyOptions {
    const NAME: &'static str = "buddy";
    const ABOUT: &'static str = "Binary buddy allocation inside large segments: power-of-two \
        blocks split and merged with their buddy; larger requests get a segment of their own.";
    const FIELDS: &'static [Field<Self>] = &[
        Field {
            name: "min_block",
            help: "Smallest block, a power of two.",
            value: FieldValue::Bytes(|o| o.min_block_bytes, |o, v| o.min_block_bytes = v),
        },
        Field {
            name: "segment",
            help: "Size of each segment drawn from the device, a power of two between \
                   min_block and 1TiB.",
            value: FieldValue::Bytes(|o| o.segment_bytes, |o, v| o.segment_bytes = v),
        },
    ];

    fn validate(&self) -> Result<(), OptionsError> {
        BuddyOptions::validate(self)
    }

    type Built = BuddyPolicy;

    fn build_policy(&self) -> Result<BuddyPolicy, OptionsError> {
        BuddyPolicy::new(self.clone())
    }
}

impl BuddyOptions {
    /// Checks the options: both sizes powers of two, `1 ≤ min_block_bytes ≤
    /// segment_bytes ≤ 2^40`.
    ///
    /// # Errors
    /// When a size is not a power of two, the minimum block exceeds the segment, or the
    /// segment exceeds [`MAX_SEGMENT_BYTES`].
    pub fn validate(&self) -> Result<(), OptionsError> {
        let err = |message: String| {
            Err(OptionsError {
                policy: "buddy",
                message,
            })
        };
        let (min_block, segment) = (self.min_block_bytes, self.segment_bytes);
        if min_block == 0 {
            return err("min_block must be at least 1, got 0".to_string());
        }
        if !min_block.is_power_of_two() {
            return err(format!("min_block must be a power of two, got {min_block}"));
        }
        if !segment.is_power_of_two() {
            return err(format!("segment must be a power of two, got {segment}"));
        }
        if min_block > segment {
            return err(format!(
                "min_block ({min_block}) must not exceed segment ({segment})"
            ));
        }
        if segment > MAX_SEGMENT_BYTES {
            return err(format!("segment must be at most 2^40 bytes, got {segment}"));
        }
        Ok(())
    }
}

/// One device segment and what kind it is.
#[derive(Debug)]
struct BuddySegment {
    segment: Segment,
    /// Holds one oversize block of exactly its size.
    oversize: bool,
    /// When it was obtained (0 for the first): its place in the policy's order.
    position: u64,
}

/// What the policy records about a handed-out block, beside its lease.
#[derive(Debug)]
struct Held {
    /// The block is an oversize segment of its own.
    oversize: bool,
    /// Its segment's position (see [`BuddySegment::position`]).
    position: u64,
}

/// How many of an order's free blocks an [`OrderSet`] keeps in its fixed head.
const HEAD: usize = 3;

/// An empty slot of an [`OrderSet`]'s head: above every key (a key is a segment's
/// position and an address; no segment has position `u64::MAX`).
const VACANT: u128 = u128::MAX;

/// The free blocks of one order, by (segment position, address): policy order, the
/// smallest first.
///
/// The smallest [`HEAD`] keys sit in a fixed array in ascending order, its empty slots
/// [`VACANT`] (above every key); any further keys, all above the head's, in an ordered
/// set beside it (`rest`; empty on most traces, where an order holds one or two blocks).
/// A key is one `u128` (the position in the high half, the address in the low), whose
/// order is the pair's. The head's operations look at all of its slots and move them
/// with masks, whatever the number of keys: a lookup, insertion or removal has no loop
/// whose length depends on the data, so the branch predictor meets only the branches
/// that decide something (is the buddy free; is the head full), where the short
/// vectors this replaces mispredicted where their scans stopped.
#[derive(Debug)]
struct OrderSet {
    head: [u128; HEAD],
    /// Keys in `head` (the others are [`VACANT`]).
    len: usize,
    /// Keys above `head`'s largest; empty unless `head` is full.
    rest: BTreeSet<u128>,
}

impl Default for OrderSet {
    fn default() -> Self {
        OrderSet {
            head: [VACANT; HEAD],
            len: 0,
            rest: BTreeSet::new(),
        }
    }
}

/// The `u128` form of a (position, address) key; see [`OrderSet`].
#[inline(always)]
fn pack(key: (u64, u64)) -> u128 {
    (u128::from(key.0) << 64) | u128::from(key.1)
}

/// The (position, address) pair of a packed key.
#[inline(always)]
fn unpack(key: u128) -> (u64, u64) {
    ((key >> 64) as u64, key as u64)
}

/// `a` where `take_a`, else `b`, by masks (no branch).
#[inline(always)]
fn select(take_a: bool, a: u128, b: u128) -> u128 {
    let mask = u128::from(take_a).wrapping_neg();
    (a & mask) | (b & !mask)
}

impl OrderSet {
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of head keys below `key`: where it goes in the head.
    #[inline(always)]
    fn rank(&self, key: u128) -> usize {
        self.head.iter().map(|&k| usize::from(k < key)).sum()
    }

    /// The head with slot `at` dropped and `fill` appended.
    #[inline(always)]
    fn head_without(&self, at: usize, fill: u128) -> [u128; HEAD] {
        let h = &self.head;
        std::array::from_fn(|i| {
            let next = if i + 1 < HEAD { h[i + 1] } else { fill };
            select(i < at, h[i], next)
        })
    }

    /// Takes the smallest key.
    #[inline(always)]
    fn pop_first(&mut self) -> Option<(u64, u64)> {
        if self.len == 0 {
            return None;
        }
        let first = self.head[0];
        self.drop_head(0);
        Some(unpack(first))
    }

    /// Drops head slot `at`: the smallest of `rest` moves into the head, or the head
    /// shrinks by one.
    #[inline(always)]
    fn drop_head(&mut self, at: usize) {
        if !self.rest.is_empty() {
            self.refill_and_drop(at);
        } else {
            self.head = self.head_without(at, VACANT);
            self.len -= 1;
        }
    }

    /// The head with `key` put in slot `at` and the slots from `at` on moved up one
    /// (the last one falls off: a vacant slot, or the largest key of a full head).
    #[inline(always)]
    fn head_with(&self, at: usize, key: u128) -> [u128; HEAD] {
        let h = &self.head;
        std::array::from_fn(|i| {
            let prev = if i > 0 { h[i - 1] } else { key };
            select(i < at, h[i], select(i == at, key, prev))
        })
    }

    /// Drops head slot `at` and moves the smallest of `rest` into the head (out of
    /// line: `rest` is empty on most traces).
    #[cold]
    #[inline(never)]
    fn refill_and_drop(&mut self, at: usize) {
        let fill = self.rest.pop_first().expect("refilling from an empty rest");
        self.head = self.head_without(at, fill);
    }

    /// Adds a key to an empty set (a split's upper half: every order below the one
    /// split is empty).
    #[inline(always)]
    fn push_into_empty(&mut self, key: (u64, u64)) {
        debug_assert!(
            self.is_empty(),
            "buddy: a split half into a non-empty order"
        );
        self.head[0] = pack(key);
        self.len = 1;
    }

    /// (The head's case inline; a full head out of line.)
    #[inline(always)]
    fn insert(&mut self, key: (u64, u64)) {
        let key = pack(key);
        if self.len == HEAD {
            self.insert_full(key);
            return;
        }
        debug_assert!(!self.head.contains(&key), "buddy: free block twice");
        self.head = self.head_with(self.rank(key), key);
        self.len += 1;
    }

    /// Inserts into a full head: `key` goes to `rest` if it is above the head's
    /// largest, else the largest goes there and `key` into the head.
    #[cold]
    #[inline(never)]
    fn insert_full(&mut self, key: u128) {
        let largest = self.head[HEAD - 1];
        if key > largest {
            let fresh = self.rest.insert(key);
            debug_assert!(fresh, "buddy: free block twice");
            return;
        }
        debug_assert!(!self.head.contains(&key), "buddy: free block twice");
        self.rest.insert(largest);
        self.head = self.head_with(self.rank(key), key);
    }

    /// Removes `key`; whether it was there.
    #[inline(always)]
    fn remove(&mut self, key: (u64, u64)) -> bool {
        let key = pack(key);
        let hit = self.head.iter().fold(false, |hit, &k| hit | (k == key));
        if hit {
            self.drop_head(self.rank(key));
            return true;
        }
        if self.rest.is_empty() {
            return false;
        }
        self.rest.remove(&key)
    }

    fn contains(&self, key: (u64, u64)) -> bool {
        let key = pack(key);
        self.head[..self.len].contains(&key) || self.rest.contains(&key)
    }

    /// The keys, smallest first.
    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.head[..self.len]
            .iter()
            .chain(self.rest.iter())
            .map(|&k| unpack(k))
    }

    /// Takes every key out, smallest first.
    fn take_all(&mut self) -> Vec<(u64, u64)> {
        let all = self.iter().collect();
        *self = OrderSet::default();
        all
    }

    /// Panics unless the head is sorted, holds `len` keys and its empty slots are
    /// vacant, and `rest` holds keys above a full head's.
    fn check(&self) {
        assert!(self.len <= HEAD, "buddy: a free list's head overfull");
        assert!(
            self.head[..self.len].windows(2).all(|w| w[0] < w[1]),
            "buddy: a free list's head out of order"
        );
        assert!(
            self.head[..self.len].iter().all(|&k| k != VACANT)
                && self.head[self.len..].iter().all(|&k| k == VACANT),
            "buddy: a free list's head and its length disagree"
        );
        if let Some(&first) = self.rest.first() {
            assert!(
                self.len == HEAD && first > self.head[HEAD - 1],
                "buddy: a free list's rest beside a head that is not full, or below it"
            );
        }
    }
}

/// Binary buddy allocator. See the module docs.
#[derive(Debug)]
pub struct BuddyPolicy {
    options: BuddyOptions,
    /// Order of a whole normal segment: `segment_bytes = min_block_bytes << max_order`.
    max_order: u32,
    /// Free blocks of normal segments, one set per order, by (segment position,
    /// address): policy order.
    free_lists: Vec<OrderSet>,
    /// Bit `k` set when order `k`'s free list is not empty (at most 41 orders).
    nonempty: u64,
    /// Free (whole) oversize segments by (size, address).
    free_oversize: BTreeSet<(u64, u64)>,
    /// Every live device segment by base address.
    segments: BTreeMap<u64, BuddySegment>,
    /// (position, base address) of every live normal segment, by position: a freed
    /// block's segment found by its lease's position.
    bases: Vec<(u64, u64)>,
    /// The position the next segment gets.
    next_position: u64,
    /// Live blocks; an allocation's `block` indexes it.
    live: Leases<Held>,
    stats: PolicyStats,
}

impl BuddyPolicy {
    /// A buddy allocator with the given options.
    ///
    /// # Errors
    /// See [`BuddyOptions::validate`].
    pub fn new(options: BuddyOptions) -> Result<BuddyPolicy, OptionsError> {
        options.validate()?;
        let max_order = (options.segment_bytes / options.min_block_bytes).trailing_zeros();
        Ok(BuddyPolicy {
            options,
            max_order,
            free_lists: (0..=max_order).map(|_| OrderSet::default()).collect(),
            nonempty: 0,
            free_oversize: BTreeSet::new(),
            segments: BTreeMap::new(),
            bases: Vec::new(),
            next_position: 0,
            live: Leases::default(),
            stats: PolicyStats::default(),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &BuddyOptions {
        &self.options
    }

    /// The block size for a request of `size_bytes` (> 0, below [`MAX_REQUEST_BYTES`]).
    pub fn block_bytes_for(&self, size_bytes: u64) -> u64 {
        size_bytes
            .next_power_of_two()
            .max(self.options.min_block_bytes)
    }

    fn block_size(&self, order: u32) -> u64 {
        self.options.min_block_bytes << order
    }

    /// The order of a block size (both it and the minimum block are powers of two).
    fn order_of(&self, block_bytes: u64) -> u32 {
        block_bytes.trailing_zeros() - self.options.min_block_bytes.trailing_zeros()
    }

    /// Base address of the live normal segment at `position`.
    #[inline]
    fn base_at(&self, position: u64) -> u64 {
        // Blocks are taken from the oldest segment first (policy order), so most frees
        // land in the first one: look there before searching.
        if let Some(&(p, base)) = self.bases.first() {
            if p == position {
                return base;
            }
        }
        let at = self.bases.partition_point(|&(p, _)| p < position);
        let (p, base) = self.bases[at];
        debug_assert_eq!(p, position, "buddy: no live segment at a block's position");
        base
    }

    /// Base address of the segment holding `addr`.
    fn segment_base(&self, addr: u64) -> u64 {
        let (&base, _) = self
            .segments
            .range(..=addr)
            .next_back()
            .expect("buddy: block below every segment");
        base
    }

    /// Files a free block of order `order` under its segment's position.
    #[inline]
    fn push_free(&mut self, order: u32, position: u64, addr: u64) {
        self.free_lists[order as usize].insert((position, addr));
        self.nonempty |= 1 << order;
    }

    /// Takes the free block of the smallest order ≥ `order` (first in policy order),
    /// splitting it down to `order`: its segment's (base, position) and address. `None`
    /// if no free block is large enough.
    #[inline(always)]
    fn take_free(&mut self, order: u32) -> Option<(u64, u64)> {
        let found = (self.nonempty >> order).trailing_zeros();
        if found == 64 {
            return None;
        }
        let found = order + found;
        let list = &mut self.free_lists[found as usize];
        let (position, addr) = list.pop_first().expect("non-empty free list");
        // Its bit goes if it emptied (no branch on whether it did).
        self.nonempty &= !(u64::from(list.is_empty()) << found);
        // Every order from `order` up to `found` is empty (`found` is the smallest
        // non-empty one): each takes the upper half of one split as its only block.
        for k in order..found {
            let upper = addr + self.block_size(k);
            self.free_lists[k as usize].push_into_empty((position, upper));
        }
        self.nonempty |= (1 << found) - (1 << order);
        Some((position, addr))
    }

    /// Asks the device for a segment; on out of memory releases every wholly free
    /// segment and asks once more.
    fn draw_segment(
        &mut self,
        device: &mut dyn Device,
        size_bytes: u64,
        requested_bytes: u64,
    ) -> Result<Segment, AllocError> {
        match device.allocate_segment(size_bytes) {
            Ok(segment) => return Ok(segment),
            Err(DeviceError::OutOfMemory { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.release_free_segments(device)?;
        match device.allocate_segment(size_bytes) {
            Ok(segment) => Ok(segment),
            Err(DeviceError::OutOfMemory { .. }) => Err(AllocError::OutOfMemory {
                requested_bytes,
                tried_bytes: size_bytes,
                stats: self.stats,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Files a new segment; its base and position.
    fn add_segment(&mut self, segment: Segment, oversize: bool) -> (u64, u64) {
        let base = segment.addr.0;
        self.stats.reserved_bytes += segment.size_bytes;
        self.stats.segment_count += 1;
        let position = self.next_position;
        self.next_position += 1;
        let previous = self.segments.insert(
            base,
            BuddySegment {
                segment,
                oversize,
                position,
            },
        );
        assert!(
            previous.is_none(),
            "buddy: the device handed out one base address twice"
        );
        if !oversize {
            // Positions only grow: pushing keeps `bases` sorted.
            self.bases.push((position, base));
        }
        (base, position)
    }

    /// [`Policy::allocate`] beyond its inline first step: the checks, oversize
    /// requests, and normal ones that need a new segment (out of line, so the usual
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
        let block_bytes = self.block_bytes_for(size);
        let oversize = block_bytes > self.options.segment_bytes;
        let (addr, held) = if oversize {
            let cached = self
                .free_oversize
                .range((block_bytes, 0)..=(block_bytes, u64::MAX))
                .next()
                .copied();
            let (base, position) = match cached {
                Some(key) => {
                    self.free_oversize.remove(&key);
                    (key.1, self.segments[&key.1].position)
                }
                None => {
                    let segment = self.draw_segment(device, block_bytes, size)?;
                    self.add_segment(segment, true)
                }
            };
            (base, Held { oversize, position })
        } else {
            let order = self.order_of(block_bytes);
            let (position, addr) = match self.take_free(order) {
                Some(found) => found,
                None => {
                    let segment = self.draw_segment(device, self.options.segment_bytes, size)?;
                    let (base, position) = self.add_segment(segment, false);
                    self.push_free(self.max_order, position, base);
                    self.take_free(order)
                        .expect("a new segment holds any normal block")
                }
            };
            (addr, Held { oversize, position })
        };
        Ok(self.live.issue(
            addr,
            size,
            block_bytes,
            request.stream,
            held,
            &mut self.stats,
        ))
    }

    /// Caches a freed oversize segment whole (out of line: the ordered set's insertion).
    #[inline(never)]
    fn free_oversize_segment(&mut self, block_bytes: u64, addr: u64) {
        self.free_oversize.insert((block_bytes, addr));
    }

    /// Returns every wholly free segment, normal and oversize, to the device.
    fn release_free_segments(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        let whole: Vec<u64> = self.free_lists[self.max_order as usize]
            .take_all()
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        self.nonempty &= !(1 << self.max_order);
        let oversize: Vec<u64> = std::mem::take(&mut self.free_oversize)
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        for base in whole.into_iter().chain(oversize) {
            let entry = self
                .segments
                .remove(&base)
                .expect("buddy: free segment not in the segment table");
            if !entry.oversize {
                let at = self
                    .bases
                    .binary_search(&(entry.position, base))
                    .expect("buddy: normal segment without its base entry");
                self.bases.remove(at);
            }
            self.stats.reserved_bytes -= entry.segment.size_bytes;
            self.stats.segment_count -= 1;
            device.free_segment(entry.segment)?;
        }
        Ok(())
    }
}

impl Default for BuddyPolicy {
    fn default() -> Self {
        BuddyPolicy::new(BuddyOptions::default()).expect("default buddy options are valid")
    }
}

impl Policy for BuddyPolicy {
    fn name(&self) -> &str {
        "buddy"
    }

    fn rounded_bytes(&self, requested_bytes: u64) -> u64 {
        self.block_bytes_for(requested_bytes.max(1))
    }

    fn allocate(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError> {
        let size = request.size_bytes;
        // The usual case, inline: a normal block (`size` at most a segment, so its
        // power-of-two block too) from the free lists. Otherwise (or when no free block
        // is large enough, which `take_free` leaves unchanged) `allocate_rest` takes
        // the whole request from the start.
        if size > 0 && size <= self.options.segment_bytes {
            let block_bytes = self.block_bytes_for(size);
            if let Some((position, addr)) = self.take_free(self.order_of(block_bytes)) {
                let held = Held {
                    oversize: false,
                    position,
                };
                return Ok(self.live.issue(
                    addr,
                    size,
                    block_bytes,
                    request.stream,
                    held,
                    &mut self.stats,
                ));
            }
        }
        self.allocate_rest(device, request)
    }

    fn free(
        &mut self,
        _device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        let block = self.live.retire(allocation, "buddy", &mut self.stats);
        if block.detail.oversize {
            self.free_oversize_segment(block.block_bytes, block.addr);
            return Ok(());
        }
        let position = block.detail.position;
        let base = self.base_at(position);
        let mut addr = block.addr;
        let mut order = self.order_of(block.block_bytes);
        // One data-dependent branch per level: whether the buddy is free (an empty
        // order answers no through the same lookup, so its bit is not tested first).
        while order < self.max_order {
            let buddy = base + ((addr - base) ^ self.block_size(order));
            let list = &mut self.free_lists[order as usize];
            if !list.remove((position, buddy)) {
                break;
            }
            self.nonempty &= !(u64::from(list.is_empty()) << order);
            addr = addr.min(buddy);
            order += 1;
        }
        self.push_free(order, position, addr);
        Ok(())
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        self.release_free_segments(device)
    }

    fn stats(&self) -> PolicyStats {
        self.stats
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut blocks: BTreeMap<u64, BlockSnapshot> = BTreeMap::new();
        for (order, list) in self.free_lists.iter().enumerate() {
            for (_, addr) in list.iter() {
                let size_bytes = self.block_size(order as u32);
                blocks.insert(
                    addr,
                    BlockSnapshot {
                        addr: DeviceAddr(addr),
                        size_bytes,
                        requested_bytes: 0,
                        state: BlockState::Free,
                    },
                );
            }
        }
        for &(size_bytes, addr) in &self.free_oversize {
            blocks.insert(
                addr,
                BlockSnapshot {
                    addr: DeviceAddr(addr),
                    size_bytes,
                    requested_bytes: 0,
                    state: BlockState::Free,
                },
            );
        }
        for b in self.live.values() {
            blocks.insert(
                b.addr,
                BlockSnapshot {
                    addr: DeviceAddr(b.addr),
                    size_bytes: b.block_bytes,
                    requested_bytes: b.requested_bytes,
                    state: BlockState::Allocated,
                },
            );
        }
        self.segments
            .iter()
            .map(|(&base, s)| SegmentSnapshot {
                addr: DeviceAddr(base),
                size_bytes: s.segment.size_bytes,
                stream: StreamId(0),
                pool: if s.oversize {
                    "buddy-oversize"
                } else {
                    "buddy"
                },
                blocks: blocks
                    .range(base..base + s.segment.size_bytes)
                    .map(|(_, b)| b.clone())
                    .collect(),
            })
            .collect()
    }

    fn check_invariants(&self) {
        let seg_bytes = self.options.segment_bytes;
        assert_eq!(
            self.free_lists.len(),
            self.max_order as usize + 1,
            "buddy: one free list per order"
        );
        // Every block (free or live) by address: (size, is_free).
        let mut blocks: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
        let mut add = |addr: u64, size: u64, free: bool| {
            assert!(
                blocks.insert(addr, (size, free)).is_none(),
                "buddy: two blocks at {addr:#x}"
            );
        };
        for (order, list) in self.free_lists.iter().enumerate() {
            list.check();
            assert_eq!(
                self.nonempty & (1 << order) != 0,
                !list.is_empty(),
                "buddy: the non-empty bit of order {order} is wrong"
            );
            let size = self.block_size(order as u32);
            for (position, addr) in list.iter() {
                let base = self.segment_base(addr);
                let seg = &self.segments[&base];
                assert!(
                    !seg.oversize,
                    "buddy: free-list block {addr:#x} inside an oversize segment"
                );
                assert_eq!(
                    position, seg.position,
                    "buddy: free block {addr:#x} filed under another segment's position"
                );
                assert_eq!(
                    (addr - base) % size,
                    0,
                    "buddy: free block {addr:#x} not aligned to its order"
                );
                if order < self.max_order as usize {
                    let buddy = base + ((addr - base) ^ size);
                    assert!(
                        !list.contains((position, buddy)),
                        "buddy: free buddies {addr:#x} and {buddy:#x} were not merged"
                    );
                }
                add(addr, size, true);
            }
        }
        for &(size, addr) in &self.free_oversize {
            let seg = self
                .segments
                .get(&addr)
                .expect("buddy: cached oversize block is not a segment");
            assert!(
                seg.oversize && seg.segment.size_bytes == size,
                "buddy: cached oversize block disagrees with its segment"
            );
            add(addr, size, true);
        }
        let (requested, allocated, count) = self.live.check("buddy");
        for b in self.live.values() {
            assert_eq!(
                b.block_bytes,
                self.block_bytes_for(b.requested_bytes),
                "buddy: block not the rounded request"
            );
            let base = self.segment_base(b.addr);
            let seg = &self.segments[&base];
            assert_eq!(
                seg.oversize, b.detail.oversize,
                "buddy: live block in the wrong kind of segment"
            );
            assert_eq!(
                seg.position, b.detail.position,
                "buddy: live block filed under another segment's position"
            );
            if b.detail.oversize {
                assert_eq!(
                    (base, seg.segment.size_bytes),
                    (b.addr, b.block_bytes),
                    "buddy: oversize block does not fill its segment"
                );
            } else {
                assert_eq!(
                    (b.addr - base) % b.block_bytes,
                    0,
                    "buddy: live block not aligned to its order"
                );
            }
            add(b.addr, b.block_bytes, false);
        }
        let mut bases: Vec<(u64, u64)> = self
            .segments
            .iter()
            .filter(|(_, s)| !s.oversize)
            .map(|(&base, s)| (s.position, base))
            .collect();
        bases.sort_unstable();
        assert_eq!(
            self.bases, bases,
            "buddy: the base table disagrees with the normal segments"
        );
        let mut reserved = 0u64;
        for (&base, s) in &self.segments {
            assert_eq!(
                s.segment.addr.0, base,
                "buddy: segment filed under the wrong address"
            );
            let size = s.segment.size_bytes;
            if s.oversize {
                assert!(
                    size.is_power_of_two() && size > seg_bytes,
                    "buddy: oversize segment of {size} bytes"
                );
            } else {
                assert_eq!(size, seg_bytes, "buddy: normal segment of the wrong size");
            }
            let mut cursor = base;
            for (&addr, &(block_size, _)) in blocks.range(base..base + size) {
                assert_eq!(addr, cursor, "buddy: blocks do not tile the segment at {base:#x} (gap or overlap at {addr:#x})");
                cursor += block_size;
            }
            assert_eq!(
                cursor,
                base + size,
                "buddy: blocks do not tile the segment at {base:#x}"
            );
            reserved += size;
        }
        let tiled: usize = self
            .segments
            .iter()
            .map(|(&b, s)| blocks.range(b..b + s.segment.size_bytes).count())
            .sum();
        assert_eq!(
            tiled,
            blocks.len(),
            "buddy: a block lies outside every segment"
        );
        let recomputed = PolicyStats {
            requested_bytes: requested,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            allocation_count: count,
            segment_count: self.segments.len() as u64,
        };
        assert_eq!(
            self.stats, recomputed,
            "buddy: stats disagree with the blocks and segments"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::PolicyConfig;
    use crate::testing::{check_against_device, NullDevice, TestDevice};
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn req(size_bytes: u64) -> Request {
        Request {
            size_bytes,
            stream: StreamId(0),
        }
    }

    /// A policy with 512 B blocks in 4 KiB segments: small enough to reason about.
    fn small() -> BuddyPolicy {
        BuddyPolicy::new(BuddyOptions {
            min_block_bytes: 512,
            segment_bytes: 4096,
        })
        .unwrap()
    }

    /// (offset in segment, size, state) of every block of the snapshot's segment `i`.
    fn layout(p: &BuddyPolicy, i: usize) -> Vec<(u64, u64, BlockState)> {
        let s = &p.snapshot()[i];
        s.blocks
            .iter()
            .map(|b| (b.addr.0 - s.addr.0, b.size_bytes, b.state))
            .collect()
    }

    /// With the default options a 1 GiB + 1 B request gets a 2 GiB block in its own 2 GiB segment.
    #[test]
    fn golden_one_gib_plus_one() {
        let mut d = TestDevice::unbounded();
        let mut p = BuddyPolicy::default();
        let a = p.allocate(&mut d, req(GIB + 1)).unwrap();
        assert_eq!(a.block_bytes, 2 * GIB);
        assert_eq!(p.stats().reserved_bytes, 2 * GIB);
        assert_eq!(p.stats().allocated_bytes, 2 * GIB);
        assert_eq!(d.live_segments(), vec![(a.addr.0, 2 * GIB)]);
        assert_eq!(p.snapshot()[0].pool, "buddy-oversize");
        check_against_device(&p, &d);
    }

    /// Requests round up to a power of two of at least the minimum block, in 1 GiB segments.
    #[test]
    fn rounding_with_defaults() {
        for (request, block) in [
            (1, 512),
            (512, 512),
            (513, 1024),
            (4096, 4096),
            (5000, 8192),
            (GIB, GIB),
        ] {
            let mut d = TestDevice::unbounded();
            let mut p = BuddyPolicy::default();
            let a = p.allocate(&mut d, req(request)).unwrap();
            assert_eq!(a.block_bytes, block, "block for {request}");
            assert_eq!(p.stats().reserved_bytes, GIB, "reserved for {request}");
            assert_eq!(
                (p.stats().requested_bytes, p.stats().allocated_bytes),
                (request, block)
            );
            check_against_device(&p, &d);
        }
    }

    /// The first small block splits a fresh segment into halves down to its order.
    #[test]
    fn splitting_a_fresh_segment() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let a = p.allocate(&mut d, req(100)).unwrap();
        assert_eq!(a.addr.0, d.live_segments()[0].0);
        use BlockState::{Allocated as A, Free as F};
        assert_eq!(
            layout(&p, 0),
            vec![(0, 512, A), (512, 512, F), (1024, 1024, F), (2048, 2048, F)]
        );
        let b = p.allocate(&mut d, req(600)).unwrap();
        assert_eq!(
            b.addr.0 - a.addr.0,
            1024,
            "a 1 KiB block takes the free 1 KiB buddy, no split"
        );
        check_against_device(&p, &d);
    }

    /// Freeing merges buddies back into a whole segment, which is then reused without the device.
    #[test]
    fn merging_back_to_a_whole_segment() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let blocks: Vec<_> = (0..8)
            .map(|_| p.allocate(&mut d, req(512)).unwrap())
            .collect();
        assert_eq!(p.stats().segment_count, 1);
        for a in blocks.into_iter().rev() {
            p.free(&mut d, &a).unwrap();
            check_against_device(&p, &d);
        }
        assert_eq!(layout(&p, 0), vec![(0, 4096, BlockState::Free)]);
        let whole = p.allocate(&mut d, req(4096)).unwrap();
        assert_eq!(whole.addr.0, d.live_segments()[0].0);
        assert_eq!(d.stats().allocate_count, 1, "the cached segment was reused");
        check_against_device(&p, &d);
    }

    /// Adjacent free blocks that are not buddies stay apart.
    #[test]
    fn only_buddies_merge() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let _a = p.allocate(&mut d, req(512)).unwrap();
        let b = p.allocate(&mut d, req(512)).unwrap();
        let c = p.allocate(&mut d, req(1024)).unwrap();
        p.free(&mut d, &b).unwrap();
        p.free(&mut d, &c).unwrap();
        use BlockState::{Allocated as A, Free as F};
        assert_eq!(
            layout(&p, 0),
            vec![(0, 512, A), (512, 512, F), (1024, 1024, F), (2048, 2048, F)]
        );
        check_against_device(&p, &d);
    }

    /// The search takes the smallest order with a free block before splitting a larger one.
    #[test]
    fn smallest_order_first() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let a = p.allocate(&mut d, req(2048)).unwrap();
        let _b = p.allocate(&mut d, req(512)).unwrap();
        p.free(&mut d, &a).unwrap();
        // Free now: 2048 at 0, 512 at 2560, 1024 at 3072.
        let c = p.allocate(&mut d, req(1024)).unwrap();
        assert_eq!(c.addr.0 - d.live_segments()[0].0, 3072);
        let e = p.allocate(&mut d, req(512)).unwrap();
        assert_eq!(e.addr.0 - d.live_segments()[0].0, 2560);
        check_against_device(&p, &d);
    }

    /// Freed oversize segments are cached whole and reused only for the same block size.
    #[test]
    fn oversize_segments_are_cached_by_size() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let a = p.allocate(&mut d, req(5000)).unwrap();
        assert_eq!(a.block_bytes, 8192);
        let addr = a.addr;
        p.free(&mut d, &a).unwrap();
        assert_eq!(p.stats().reserved_bytes, 8192, "kept cached");
        let b = p.allocate(&mut d, req(20_000)).unwrap();
        assert_eq!(b.block_bytes, 32768);
        assert_ne!(b.addr, addr, "a different block size does not reuse it");
        let c = p.allocate(&mut d, req(6000)).unwrap();
        assert_eq!(c.addr, addr, "the same block size does");
        assert_eq!(d.stats().allocate_count, 2);
        check_against_device(&p, &d);
    }

    /// On device OOM the policy releases wholly free segments and the retry succeeds.
    #[test]
    fn oom_recovery_releases_free_segments() {
        let mut d = TestDevice::with_capacity(3 * 4096);
        let mut p = small();
        let keep = p.allocate(&mut d, req(512)).unwrap();
        let whole = p.allocate(&mut d, req(4096)).unwrap();
        p.free(&mut d, &whole).unwrap();
        assert_eq!(p.stats().reserved_bytes, 8192);
        let big = p.allocate(&mut d, req(8192)).unwrap();
        assert_eq!(
            p.stats().reserved_bytes,
            4096 + 8192,
            "the cached segment made room"
        );
        assert_eq!(d.stats().free_count, 1);
        check_against_device(&p, &d);
        p.free(&mut d, &big).unwrap();
        p.free(&mut d, &keep).unwrap();
        check_against_device(&p, &d);
    }

    /// A failed request leaves live allocations and allocated bytes as they were.
    #[test]
    fn oom_leaves_allocations_unchanged() {
        let mut d = TestDevice::with_capacity(2 * 4096);
        let mut p = small();
        let _live: Vec<_> = (0..4)
            .map(|_| p.allocate(&mut d, req(1024)).unwrap())
            .collect();
        let cached = p.allocate(&mut d, req(4096)).unwrap();
        p.free(&mut d, &cached).unwrap();
        let before = p.stats();
        let live_blocks = |p: &BuddyPolicy| {
            p.snapshot()
                .into_iter()
                .flat_map(|s| s.blocks)
                .filter(|b| b.state == BlockState::Allocated)
                .collect::<Vec<_>>()
        };
        let blocks_before = live_blocks(&p);
        let err = p.allocate(&mut d, req(3 * 4096)).unwrap_err();
        let AllocError::OutOfMemory {
            requested_bytes,
            tried_bytes,
            stats,
        } = err
        else {
            panic!("{err:?}")
        };
        assert_eq!((requested_bytes, tried_bytes), (3 * 4096, 4 * 4096));
        assert_eq!(stats, p.stats());
        assert_eq!(live_blocks(&p), blocks_before);
        let after = p.stats();
        assert_eq!(
            (
                after.requested_bytes,
                after.allocated_bytes,
                after.allocation_count
            ),
            (
                before.requested_bytes,
                before.allocated_bytes,
                before.allocation_count
            )
        );
        assert_eq!(
            after.reserved_bytes, 4096,
            "recovery released the cached segment"
        );
        check_against_device(&p, &d);

        let err = p.allocate(&mut NullDevice, req(512)).unwrap_err();
        assert!(
            matches!(
                err,
                AllocError::OutOfMemory {
                    tried_bytes: 4096,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// empty_cache returns every wholly free segment, normal and oversize, and keeps used ones.
    #[test]
    fn empty_cache_returns_every_free_segment() {
        let mut d = TestDevice::unbounded();
        let mut p = small();
        let used = p.allocate(&mut d, req(512)).unwrap();
        let whole1 = p.allocate(&mut d, req(4096)).unwrap();
        let whole2 = p.allocate(&mut d, req(4096)).unwrap();
        let over = p.allocate(&mut d, req(10_000)).unwrap();
        p.free(&mut d, &whole1).unwrap();
        p.free(&mut d, &whole2).unwrap();
        p.free(&mut d, &over).unwrap();
        assert_eq!(p.stats().segment_count, 4);
        p.empty_cache(&mut d).unwrap();
        assert_eq!(d.live_segments(), vec![(used.addr.0, 4096)]);
        check_against_device(&p, &d);
    }

    /// Invalid options are refused with a message naming the problem.
    #[test]
    fn option_validation() {
        let bad = |min_block_bytes, segment_bytes| {
            BuddyOptions {
                min_block_bytes,
                segment_bytes,
            }
            .validate()
            .unwrap_err()
        };
        let e = bad(3000, 1 << 30);
        assert_eq!(
            (e.policy, e.message.as_str()),
            ("buddy", "min_block must be a power of two, got 3000")
        );
        assert_eq!(
            bad(0, 1 << 30).message,
            "min_block must be at least 1, got 0"
        );
        assert_eq!(
            bad(512, 3 << 20).message,
            format!("segment must be a power of two, got {}", 3 << 20)
        );
        assert_eq!(
            bad(8192, 4096).message,
            "min_block (8192) must not exceed segment (4096)"
        );
        assert_eq!(
            bad(512, 1 << 41).message,
            format!("segment must be at most 2^40 bytes, got {}", 1u64 << 41)
        );
        assert!(BuddyOptions {
            min_block_bytes: 1,
            segment_bytes: 1 << 40
        }
        .validate()
        .is_ok());
        assert!(BuddyPolicy::new(BuddyOptions {
            min_block_bytes: 3,
            segment_bytes: 4
        })
        .is_err());
        assert!(PolicyConfig::new(BuddyOptions {
            min_block_bytes: 3,
            segment_bytes: 4
        })
        .build()
        .is_err());
        assert!(PolicyConfig::new(BuddyOptions::default()).build().is_ok());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc(u64),
        Free(usize),
        EmptyCache,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (1u64..=20_000).prop_map(Op::Alloc),
            1 => (1u64..=70_000).prop_map(Op::Alloc),
            5 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::EmptyCache),
        ]
    }

    #[derive(Clone, Debug)]
    enum SetOp {
        Insert(u64, u64),
        Remove(u64, u64),
        PopFirst,
    }

    fn set_op() -> impl Strategy<Value = SetOp> {
        prop_oneof![
            4 => (0u64..3, 0u64..64).prop_map(|(p, a)| SetOp::Insert(p, a)),
            2 => (0u64..3, 0u64..64).prop_map(|(p, a)| SetOp::Remove(p, a)),
            1 => Just(SetOp::PopFirst),
        ]
    }

    /// Freeing every other of 200 blocks leaves 100 free blocks of one order (a free list
    /// in its ordered-set form); they are reused lowest address first, and merge back.
    #[test]
    fn many_free_blocks_of_one_order() {
        let mut d = TestDevice::unbounded();
        let mut p = BuddyPolicy::new(BuddyOptions {
            min_block_bytes: 512,
            segment_bytes: 128 << 10,
        })
        .unwrap();
        let blocks: Vec<_> = (0..200)
            .map(|_| p.allocate(&mut d, req(512)).unwrap())
            .collect();
        let base = d.live_segments()[0].0;
        let mut kept = Vec::new();
        for (i, a) in blocks.into_iter().enumerate() {
            if i % 2 == 0 {
                p.free(&mut d, &a).unwrap();
            } else {
                kept.push(a);
            }
        }
        assert!(
            p.free_lists[0].rest.len() >= 96,
            "the ordered set is in use"
        );
        check_against_device(&p, &d);
        for i in 0..100 {
            let a = p.allocate(&mut d, req(300)).unwrap();
            assert_eq!(a.addr.0 - base, 1024 * i, "lowest free address first");
            kept.push(a);
            check_against_device(&p, &d);
        }
        for a in kept {
            p.free(&mut d, &a).unwrap();
        }
        check_against_device(&p, &d);
        assert_eq!(layout(&p, 0), vec![(0, 128 << 10, BlockState::Free)]);
    }

    proptest! {
        /// A free list answers as an ordered set of (position, address) does, in both of
        /// its forms and across the moves between them.
        #[test]
        fn order_set_is_an_ordered_set(ops in prop::collection::vec(set_op(), 1..400)) {
            let mut set = OrderSet::default();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    SetOp::Insert(p, a) => {
                        if model.insert((p, a)) {
                            set.insert((p, a));
                        }
                    }
                    SetOp::Remove(p, a) => prop_assert_eq!(set.remove((p, a)), model.remove(&(p, a))),
                    SetOp::PopFirst => prop_assert_eq!(set.pop_first(), model.pop_first()),
                }
                set.check();
                prop_assert_eq!(set.is_empty(), model.is_empty());
                prop_assert_eq!(set.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            }
        }

        /// Random alloc/free/empty_cache runs on a small device keep every invariant, and
        /// an OOM never changes live allocations.
        #[test]
        fn random_sequences_keep_invariants(ops in prop::collection::vec(op(), 1..120)) {
            let mut d = TestDevice::with_capacity(96 << 10);
            let mut p = BuddyPolicy::new(BuddyOptions { min_block_bytes: 512, segment_bytes: 16 << 10 }).unwrap();
            let mut live: Vec<Allocation> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(size) => {
                        let before = p.stats();
                        match p.allocate(&mut d, req(size)) {
                            Ok(a) => {
                                prop_assert_eq!(a.block_bytes, size.next_power_of_two().max(512));
                                live.push(a);
                            }
                            Err(AllocError::OutOfMemory { .. }) => {
                                let after = p.stats();
                                prop_assert_eq!(after.allocated_bytes, before.allocated_bytes);
                                prop_assert_eq!(after.allocation_count, before.allocation_count);
                            }
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let a = live.swap_remove(i % live.len());
                        p.free(&mut d, &a).unwrap();
                    }
                    Op::Free(_) => {}
                    Op::EmptyCache => p.empty_cache(&mut d).unwrap(),
                }
                check_against_device(&p, &d);
            }
            for a in live {
                p.free(&mut d, &a).unwrap();
            }
            p.empty_cache(&mut d).unwrap();
            check_against_device(&p, &d);
            prop_assert_eq!(p.stats(), PolicyStats::default());
        }
    }
}
