//! The simulated GPU: a capacity, deterministic addresses, and the bytes the CUDA
//! driver would charge for each allocation.
//!
//! The charge model comes from measurement on an H100 (`tests/data/oracle/
//! h100-driver-granularity.json`, `allocsim probe`, and the charged peaks observed by
//! `allocsim validate`, see `docs/validation.md`): the driver backs device memory with
//! 2 MiB pages. An allocation of a page or more takes whole pages of its own (`2 MiB + 1`
//! costs 4 MiB). A smaller one is packed into shared pages at 512-byte alignment, best
//! fit: the smallest free hole of any partly used page that holds it (ties to the oldest
//! page, then the lowest offset), else a new page (eight 1-byte allocations cost one
//! page; eight 1 MiB allocations cost four). A packed page is returned when its last
//! allocation is freed. Physical chunks of virtual memory management (the pages of
//! expandable segments) are charged in whole pages from creation to release, however
//! often they are mapped.
//! Policies that only ask for multiples of 2 MiB, as PyTorch's caching allocator does,
//! are charged exactly what they reserve.
//!
//! With this model the charged peak of the `immediate` policy (one `cudaMalloc` per
//! tensor) matched the H100 to the byte on all 18 traces measured; packing only
//! allocations up to 1 MiB, bump-allocated in the newest page, was off by up to 20 MiB.

use std::collections::{BTreeMap, VecDeque};

use crate::address::{Placed, VaSpace};
use crate::packing::PackedPages;
use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PageTable, PhysicalChunk, Segment,
    SegmentId, VirtualMemory,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The lowest address the simulated device hands out: 0 and the first 2 MiB are never
/// device addresses.
pub const ADDRESS_FLOOR: u64 = 2 * MIB;
/// The end of the simulated address space (2^64 − 2 MiB): nothing placed reaches past
/// it, so `address + size` never wraps.
pub const ADDRESS_END: u64 = u64::MAX - (2 * MIB - 1);
/// The most physical chunks (virtual-memory pages) the simulated driver holds at once;
/// creating one more is out of memory. 2^20 pages of 2 MiB are 2 TiB, far beyond any
/// GPU; the bound keeps a replay on a device of absurd capacity from spending hours
/// creating pages one by one.
pub const MAX_LIVE_CHUNKS: usize = 1 << 20;

/// Where the simulated device places new allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressModel {
    /// The CUDA driver's rules as the recorded runs show them: 32 MiB chunks stacked
    /// downward, allocations at the lowest free address of the newest chunk with room,
    /// released chunks reused from the top (see `sim/src/address.rs`). Address ranges
    /// of virtual memory (`cuMemAddressReserve`) are placed bottom-up from a low base,
    /// one after the other in whole chunks, as on the H100.
    #[default]
    Driver,
    /// Each new region goes just below the previous one (2 MiB aligned), never reusing
    /// addresses: newer segments always get lower addresses.
    TopDown,
    /// Each new region goes just above the previous one.
    BottomUp,
}

/// How the simulated device is built. Every field is set explicitly; the same options
/// give the same device, addresses included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDeviceOptions {
    /// A name for reports.
    pub name: String,
    /// Bytes the device can hand out in all (what is left after the CUDA context).
    pub capacity_bytes: u64,
    /// Total memory as `cuMemGetInfo` reports it (memory fractions use it).
    pub total_bytes: u64,
    /// The driver's page (2 MiB on current NVIDIA GPUs).
    pub page_bytes: u64,
    /// Allocations up to this size (and below a page) share pages: everything below a
    /// page on H100; 0 = no packing.
    pub small_alloc_max_bytes: u64,
    /// Alignment of packed small allocations (512 B measured).
    pub small_alloc_align_bytes: u64,
    /// Free memory (as `cuMemGetInfo` reports it) that the driver never hands out: a GPU
    /// showing `F` bytes free can allocate `F − unusable_free_bytes` (2 293 760 B, about
    /// 2.19 MiB, measured on H100). Used when a capacity comes from observed free memory.
    pub unusable_free_bytes: u64,
    /// Address placement.
    pub address_model: AddressModel,
    /// Granularity of the driver's address-space chunks (32 MiB measured on H100;
    /// [`AddressModel::Driver`] only).
    pub va_chunk_bytes: u64,
    /// How much the usable memory varies from one process to the next on this card (the
    /// driver's hold-back is not the same in every process: up to 4 MiB on the H200, 0
    /// on the H100). A run whose outcome changes within this band of the capacity is
    /// marginal ([`crate::boundary`]); 0 = one figure held in every process measured.
    pub usable_spread_bytes: u64,
}

impl Default for SimDeviceOptions {
    /// An 80 GiB device with the H100 page model.
    fn default() -> Self {
        SimDeviceOptions {
            name: "simulated 80 GiB".to_string(),
            capacity_bytes: 80 * GIB,
            total_bytes: 80 * GIB,
            page_bytes: 2 * MIB,
            small_alloc_max_bytes: 2 * MIB - 1,
            small_alloc_align_bytes: 512,
            unusable_free_bytes: 0,
            address_model: AddressModel::Driver,
            va_chunk_bytes: crate::address::DEFAULT_CHUNK_BYTES,
            usable_spread_bytes: 0,
        }
    }
}

impl SimDeviceOptions {
    /// The same device with another capacity (the total grows with it if needed).
    pub fn with_capacity(mut self, capacity_bytes: u64) -> SimDeviceOptions {
        self.capacity_bytes = capacity_bytes;
        self.total_bytes = self.total_bytes.max(capacity_bytes);
        self
    }

    /// Bytes of the total the program can never get: the CUDA context (and other
    /// processes) plus the free memory the driver never hands out. 0 for the default
    /// device; `total − usable` of a GPU profile.
    pub fn reserved_by_driver_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.capacity_bytes)
    }

    /// The same kind of device with `total_bytes` of memory, as `--capacity` means it: the
    /// total `cudaMemGetInfo` reports (what PyTorch's OOM message calls "total
    /// capacity"), of which the context and the driver's unusable tail keep the same
    /// bytes as on this device ([`SimDeviceOptions::reserved_by_driver_bytes`]: they
    /// depend on the driver and the chip, not on the memory size), the rest being the
    /// capacity. On the default device nothing is kept back: capacity = total.
    /// `None` when the total does not exceed what the driver keeps.
    pub fn with_total(self, total_bytes: u64) -> Option<SimDeviceOptions> {
        let kept = self.reserved_by_driver_bytes();
        let capacity_bytes = total_bytes.checked_sub(kept).filter(|&c| c > 0)?;
        let name = if self.name.starts_with("simulated ") {
            format!(
                "simulated {}",
                workloads::size::format_size_human(total_bytes)
            )
        } else {
            self.name.clone()
        };
        Some(SimDeviceOptions {
            name,
            capacity_bytes,
            total_bytes,
            ..self
        })
    }

    /// The same device as it would be with `free_bytes` reported free by the driver:
    /// capacity = free − [`SimDeviceOptions::unusable_free_bytes`].
    pub fn with_free_bytes(self, free_bytes: u64) -> SimDeviceOptions {
        let unusable = self.unusable_free_bytes;
        self.with_capacity(free_bytes.saturating_sub(unusable))
    }
}

/// Addresses a recorded run actually got, fed back so best-fit ties (lowest address
/// first) break as they did on the real device. A hint is used while the simulation
/// asks for the same sizes in the same order; at the first difference the device falls
/// back to its address model for good.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressHints {
    /// (size, address) of each `cudaMalloc`, in order.
    pub segments: VecDeque<(u64, u64)>,
    /// Base address of each expandable segment's reserved range, in order of creation.
    pub ranges: VecDeque<u64>,
}

impl AddressHints {
    /// Whether `size` bytes at `addr` lie inside the simulated address space
    /// (`ADDRESS_FLOOR` to `ADDRESS_END`), where a recorded address can be reused.
    pub fn fits(addr: u64, size: u64) -> bool {
        addr >= ADDRESS_FLOOR && addr.checked_add(size).is_some_and(|end| end <= ADDRESS_END)
    }

    /// The hints a replay under `config` follows. Recorded addresses describe where the
    /// CUDA driver put PyTorch's caching allocator's segments under the recorded
    /// settings, so only the caching policy follows them (under any configuration: a
    /// what-if keeps the recorded placement while it matches); every other policy gets
    /// none, and its prediction cannot depend on them.
    pub fn for_policy(&self, config: &policies::PolicyConfig) -> AddressHints {
        if config
            .options::<policies::caching::CachingConfig>()
            .is_some()
        {
            self.clone()
        } else {
            AddressHints::default()
        }
    }

    /// The usable prefix: hints up to the first that leaves the address space are kept
    /// (a later hint could only be reached past that one).
    fn usable(mut self) -> AddressHints {
        if let Some(bad) = self.segments.iter().position(|&(s, a)| !Self::fits(a, s)) {
            self.segments.truncate(bad);
        }
        if let Some(bad) = self.ranges.iter().position(|&a| !Self::fits(a, 0)) {
            self.ranges.truncate(bad);
        }
        self
    }

    fn lowest(&self) -> Option<u64> {
        self.segments
            .iter()
            .map(|&(_, a)| a)
            .chain(self.ranges.iter().copied())
            .min()
    }
}

/// No handle (a [`LiveSegment`] that is not packed, or not placed by the driver model).
const NONE: u32 = u32::MAX;

/// A live segment: 24 bytes. What it is charged follows from it: nothing of its own
/// when packed (its page is charged), else its size rounded up to whole pages
/// ([`SimDevice::charge_for`]).
#[derive(Debug)]
struct LiveSegment {
    addr: u64,
    size: u64,
    /// A packed allocation's handle in [`PackedPages`] (its page and the holes beside
    /// it are found through it), or [`NONE`].
    packed: u32,
    /// The slot of its chunk in the driver's address space ([`AddressModel::Driver`];
    /// its placement there is at `addr`, [`Placed::at`]), or [`NONE`] (a packed
    /// allocation's page holds the placement).
    va_chunk: u32,
}

impl LiveSegment {
    /// A segment that is not packed, placed as `va` (if anywhere in the driver model).
    fn whole(addr: u64, size: u64, va: Option<Placed>) -> LiveSegment {
        LiveSegment {
            addr,
            size,
            packed: NONE,
            va_chunk: va.map_or(NONE, |p| {
                debug_assert_eq!(p.addr, addr, "a segment is placed at its address");
                p.chunk()
            }),
        }
    }
}

/// The simulated device. See the module docs for the charge model.
#[derive(Debug)]
pub struct SimDevice {
    options: SimDeviceOptions,
    hints: AddressHints,
    next_low: u64,
    next_high: u64,
    next_id: u64,
    /// Live segments by slot: a segment's id is its slot.
    segments: Vec<Option<LiveSegment>>,
    /// Free slots of `segments`.
    free_segments: Vec<usize>,
    /// The pages small allocations share, and their holes.
    pages: PackedPages,
    vm: PageTable<()>,
    /// Every placed region (segment, packed page, address range) by address → length:
    /// where a new region may not go. Kept only once `regions_kept` (below).
    regions: BTreeMap<u64, u64>,
    /// Whether `regions` is kept. Until a region is placed otherwise than by the driver
    /// model's own rules (a recorded address, an adopted region, an address range, the
    /// lowest-gap fallback), every live region is a placement of [`VaSpace::place`],
    /// which never overlaps another, so nothing needs checking and `regions` is built
    /// only when that ends ([`SimDevice::keep_regions`]).
    regions_kept: bool,
    /// The driver's address space ([`AddressModel::Driver`]).
    va: VaSpace,
    /// Where the next virtual-memory range goes ([`AddressModel::Driver`]).
    next_range: u64,
    stats: DeviceStats,
}

/// Where the top-down model starts: below the canonical user address space top, like
/// the CUDA driver's allocations on Linux (0x7f...).
const TOP_DOWN_START: u64 = 0x7f00_0000_0000;
const BOTTOM_UP_START: u64 = 0x1000_0000_0000;
/// Where the driver model puts the first virtual-memory range: the base every
/// recorded H100 run with expandable segments got (12 GiB + 32 MiB).
const RANGE_START: u64 = 0x3_0200_0000;

impl SimDevice {
    /// A device with these options and no recorded addresses.
    pub fn new(options: SimDeviceOptions) -> SimDevice {
        SimDevice::with_hints(options, AddressHints::default())
    }

    /// A device that gives out recorded addresses while the requests match them. Hints
    /// outside the address space ([`AddressHints::fits`]) are not followed.
    pub fn with_hints(options: SimDeviceOptions, hints: AddressHints) -> SimDevice {
        let hints = hints.usable();
        // Fallback addresses stay clear of the recorded ones.
        let top = hints.lowest().map_or(TOP_DOWN_START, |low| {
            (low & !(2 * MIB - 1)).min(TOP_DOWN_START)
        });
        let stats = DeviceStats {
            capacity_bytes: options.capacity_bytes,
            total_bytes: options.total_bytes,
            ..DeviceStats::default()
        };
        let va = VaSpace::new(TOP_DOWN_START, options.va_chunk_bytes, ADDRESS_FLOOR);
        let pages = PackedPages::new(options.page_bytes, options.small_alloc_align_bytes);
        let driver_only = options.address_model == AddressModel::Driver
            && hints.segments.is_empty()
            && hints.ranges.is_empty();
        let mut device = SimDevice {
            options,
            hints,
            va,
            next_range: RANGE_START,
            next_low: top,
            next_high: BOTTOM_UP_START,
            next_id: 1,
            segments: Vec::new(),
            free_segments: Vec::new(),
            pages,
            vm: PageTable::new("SimDevice"),
            regions: BTreeMap::new(),
            regions_kept: true,
            stats,
        };
        device.regions_kept = !driver_only;
        device
    }

    /// Builds `regions` from the live regions if it is not kept yet, and keeps it from
    /// now on. While it was not kept, every live region was placed by
    /// [`SimDevice::place`] through [`VaSpace::place`]: a segment or a packed page,
    /// each taking its size rounded up to 2 MiB, as `place` records it.
    fn keep_regions(&mut self) {
        if self.regions_kept {
            return;
        }
        self.regions_kept = true;
        let span = |size: u64| size.max(1).next_multiple_of(2 * MIB);
        for s in self.segments.iter().flatten() {
            if s.packed == NONE {
                self.regions.insert(s.addr, span(s.size));
            }
        }
        let page = span(self.options.page_bytes);
        for base in self.pages.bases() {
            self.regions.insert(base, page);
        }
    }

    /// The options it was built with.
    pub fn options(&self) -> &SimDeviceOptions {
        &self.options
    }

    /// Live segments and mapped chunks as (address, size), in address order; for the
    /// engine's overlap checks.
    pub fn live_regions(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .segments
            .iter()
            .flatten()
            .map(|s| (s.addr, s.size))
            .collect();
        out.extend(self.vm.mapped_regions());
        out.sort_unstable();
        out
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A new 2 MiB-aligned region from the address model, recorded as placed; `None`
    /// when the address space has no room for it. When the model's next address is
    /// taken or the model has run out of address space (after about 127 TiB of
    /// allocations on the top-down model, addresses are never reused), the lowest free
    /// gap is taken instead.
    /// In the driver model, the placement in its address space comes with the address.
    fn place(&mut self, size: u64) -> Option<(u64, Option<Placed>)> {
        let span = size.max(1).checked_next_multiple_of(2 * MIB)?;
        if self.options.address_model == AddressModel::Driver {
            let (addr, placed) = match self.va.place(size) {
                // Not kept: nothing but the model's own placements, which never overlap.
                Some(p) if !self.regions_kept || !self.overlaps(p.addr, span) => (p.addr, Some(p)),
                other => {
                    if let Some(p) = other {
                        self.va.release(p);
                    }
                    self.keep_regions();
                    let a = self.lowest_gap(span)?;
                    (a, self.va.place_at(a, size))
                }
            };
            if self.regions_kept {
                self.regions.insert(addr, span);
            }
            return Some((addr, placed));
        }
        let next = match self.options.address_model {
            AddressModel::TopDown => self
                .next_low
                .checked_sub(span)
                .filter(|&a| a >= ADDRESS_FLOOR),
            AddressModel::BottomUp => self
                .next_high
                .checked_add(span)
                .filter(|&end| end <= ADDRESS_END)
                .map(|_| self.next_high),
            AddressModel::Driver => None,
        };
        let addr = match next {
            Some(a) if !self.overlaps(a, span) => {
                match self.options.address_model {
                    AddressModel::TopDown => self.next_low = a,
                    AddressModel::BottomUp => self.next_high = a + span,
                    AddressModel::Driver => {}
                }
                a
            }
            _ => self.lowest_gap(span)?,
        };
        self.regions.insert(addr, span);
        Some((addr, None))
    }

    /// The address space a virtual-memory range of `size` bytes takes in the driver
    /// model: whole address-space chunks (32 MiB on the H100). Every recorded H100 run
    /// with two expandable segments had the second this far above the first: 91 232 MiB
    /// above a range of 91 213.875 MiB on an 80 GB card.
    fn range_span(&self, size: u64) -> Option<u64> {
        size.max(1).checked_next_multiple_of(self.va.chunk_bytes())
    }

    /// A virtual-memory range of the driver model: right after the last one (the first
    /// at [`RANGE_START`]), or the lowest free gap when that is taken.
    fn place_range(&mut self, size: u64) -> Option<u64> {
        self.keep_regions();
        let span = self.range_span(size)?;
        let addr = match self.next_range.checked_add(span) {
            Some(end) if end <= ADDRESS_END && !self.overlaps(self.next_range, span) => {
                self.next_range
            }
            _ => self.lowest_gap(span)?,
        };
        self.next_range = addr + span;
        self.regions.insert(addr, span);
        Some(addr)
    }

    /// The lowest 2 MiB-aligned address where `span` bytes touch no placed region.
    fn lowest_gap(&self, span: u64) -> Option<u64> {
        debug_assert!(self.regions_kept);
        let mut cursor = ADDRESS_FLOOR;
        for (&a, &len) in &self.regions {
            if cursor.checked_add(span).is_some_and(|end| end <= a) {
                return Some(cursor);
            }
            cursor = cursor.max(a.saturating_add(len).checked_next_multiple_of(2 * MIB)?);
        }
        cursor
            .checked_add(span)
            .filter(|&end| end <= ADDRESS_END)
            .map(|_| cursor)
    }

    fn take_hint(&mut self, size: u64) -> Option<(u64, Option<Placed>)> {
        if self.hints.segments.is_empty() {
            return None;
        }
        self.keep_regions();
        match self.hints.segments.front() {
            Some(&(s, a)) if s == size && !self.overlaps(a, size) => {
                self.hints.segments.pop_front();
                self.regions.insert(a, size);
                Some((a, self.va.place_at(a, size)))
            }
            Some(_) => {
                // The simulation left the recorded path: no more hints.
                self.hints.segments.clear();
                None
            }
            None => None,
        }
    }

    /// Whether `addr..addr + size` touches a placed region.
    fn overlaps(&self, addr: u64, size: u64) -> bool {
        debug_assert!(self.regions_kept);
        let end = addr.saturating_add(size);
        self.regions
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &len)| a.saturating_add(len) > addr)
    }

    /// Returns a packed allocation's bytes (its handle `packed`) to its page, merging
    /// holes; returns the bytes released to the driver (the page, if it became empty).
    fn unpack(&mut self, packed: u32, addr: u64, size: u64) -> u64 {
        match self.pages.give_back(packed, addr, size) {
            Some((base, placed)) => {
                if self.regions_kept {
                    self.regions.remove(&base);
                }
                if let Some(p) = placed {
                    self.va.release(p);
                }
                self.options.page_bytes
            }
            None => 0,
        }
    }

    /// Records a live segment; its id is its slot.
    fn insert_segment(&mut self, live: LiveSegment) -> u64 {
        match self.free_segments.pop() {
            Some(slot) => {
                self.segments[slot] = Some(live);
                slot as u64
            }
            None => {
                self.segments.push(Some(live));
                (self.segments.len() - 1) as u64
            }
        }
    }

    fn charge_for(&self, size: u64) -> u64 {
        let page = self.options.page_bytes.max(1);
        match size.checked_add(page - 1) {
            // A mask, not a division, for the usual power-of-two page.
            Some(up) if page.is_power_of_two() => up & !(page - 1),
            _ => size.div_ceil(page).saturating_mul(page),
        }
    }

    fn refuse(&self, charge: u64, size: u64) -> Result<(), DeviceError> {
        if charge
            > self
                .options
                .capacity_bytes
                .saturating_sub(self.stats.charged_bytes)
        {
            Err(DeviceError::OutOfMemory {
                requested_bytes: size,
            })
        } else {
            Ok(())
        }
    }
}

impl Device for SimDevice {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        if size_bytes == 0 || size_bytes >= 1 << 60 {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: size_bytes,
            });
        }
        let small = size_bytes <= self.options.small_alloc_max_bytes
            && size_bytes < self.options.page_bytes;
        let (live, charge) = if small {
            let (packed, addr, charge) = match self.pages.take(size_bytes) {
                Some((p, addr)) => (p, addr, 0),
                None => {
                    let page = self.options.page_bytes;
                    self.refuse(page, size_bytes)?;
                    let (base, placed) = self.place(page).ok_or(DeviceError::OutOfMemory {
                        requested_bytes: size_bytes,
                    })?;
                    (self.pages.open(base, size_bytes, placed), base, page)
                }
            };
            let live = LiveSegment {
                addr,
                size: size_bytes,
                packed,
                va_chunk: NONE,
            };
            (live, charge)
        } else {
            let charge = self.charge_for(size_bytes);
            self.refuse(charge, size_bytes)?;
            let (addr, placed) = match self.take_hint(size_bytes) {
                Some(a) => a,
                // No room in the address space: cudaMalloc fails as out of memory.
                None => self.place(size_bytes).ok_or(DeviceError::OutOfMemory {
                    requested_bytes: size_bytes,
                })?,
            };
            (LiveSegment::whole(addr, size_bytes, placed), charge)
        };
        let addr = live.addr;
        let id = self.insert_segment(live);
        let s = &mut self.stats;
        s.reserved_bytes += size_bytes;
        s.charged_bytes += charge;
        s.segment_count += 1;
        s.allocate_count += 1;
        Ok(Segment {
            id: SegmentId(id),
            addr: DeviceAddr(addr),
            size_bytes,
        })
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        // One lookup: the slot its id names, holding a segment at its address and of
        // its size.
        let slot = usize::try_from(segment.id.0).unwrap_or(usize::MAX);
        let live = match self.segments.get_mut(slot) {
            Some(entry)
                if entry
                    .as_ref()
                    .is_some_and(|l| l.addr == segment.addr.0 && l.size == segment.size_bytes) =>
            {
                entry.take()
            }
            _ => None,
        };
        let Some(live) = live else {
            not_handed_out(&segment)
        };
        self.free_segments.push(slot);
        // A packed allocation's page is charged once, to the page; it is returned with
        // the page's last allocation.
        let released = if live.packed == NONE {
            if self.regions_kept {
                self.regions.remove(&segment.addr.0);
            }
            if live.va_chunk != NONE {
                self.va.release(Placed::at(live.addr, live.va_chunk));
            }
            self.charge_for(live.size)
        } else {
            self.unpack(live.packed, segment.addr.0, live.size)
        };
        let s = &mut self.stats;
        s.reserved_bytes -= live.size;
        s.charged_bytes -= released;
        s.segment_count -= 1;
        s.free_count += 1;
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }

    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.keep_regions();
        if size_bytes == 0
            || !AddressHints::fits(addr.0, size_bytes)
            || self.overlaps(addr.0, size_bytes)
        {
            return Err(overlap_error(addr, size_bytes));
        }
        let charge = self.charge_for(size_bytes);
        self.refuse(charge, size_bytes)?;
        let va = self.va.place_at(addr.0, size_bytes);
        let id = self.insert_segment(LiveSegment::whole(addr.0, size_bytes, va));
        self.regions.insert(addr.0, size_bytes);
        let s = &mut self.stats;
        s.reserved_bytes += size_bytes;
        s.charged_bytes += charge;
        s.segment_count += 1;
        Ok(Segment {
            id: SegmentId(id),
            addr,
            size_bytes,
        })
    }
}

/// The panic of a segment freed that the device did not hand out (or freed twice), out
/// of line.
#[cold]
#[inline(never)]
fn not_handed_out(segment: &Segment) -> ! {
    panic!(
        "SimDevice: freeing segment {:?} it did not hand out",
        segment
    )
}

/// A recorded segment or range that cannot be placed where the recording says.
fn overlap_error(addr: DeviceAddr, size_bytes: u64) -> DeviceError {
    DeviceError::Driver {
        code: 0,
        message: format!(
            "the recorded region at {addr} ({size_bytes} bytes) is empty, wraps or overlaps memory already placed"
        ),
    }
}

impl VirtualMemory for SimDevice {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        self.keep_regions();
        let addr = match self.hints.ranges.pop_front() {
            Some(a) if AddressHints::fits(a, size_bytes) && !self.overlaps(a, size_bytes) => {
                self.regions.insert(a, size_bytes);
                // The model goes on above the recorded ranges, as the driver would have.
                if let Some(end) = self.range_span(size_bytes).and_then(|s| a.checked_add(s)) {
                    self.next_range = self.next_range.max(end);
                }
                a
            }
            _ => {
                self.hints.ranges.clear();
                let placed = if self.options.address_model == AddressModel::Driver {
                    self.place_range(size_bytes)
                } else {
                    self.place(size_bytes).map(|(a, _)| a)
                };
                // As cuMemAddressReserve, which PyTorch does not expect to fail: an
                // error that stops the run, not an out-of-memory.
                placed.ok_or_else(|| DeviceError::Driver {
                    code: 2,
                    message: format!(
                        "CUDA_ERROR_OUT_OF_MEMORY from cuMemAddressReserve of {size_bytes} bytes: \
                         the simulated device's address space has no room for it"
                    ),
                })?
            }
        };
        let id = self.fresh_id();
        self.stats.segment_count += 1;
        Ok(self
            .vm
            .add_range(SegmentId(id), DeviceAddr(addr), size_bytes))
    }

    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        self.keep_regions();
        if size_bytes == 0
            || !AddressHints::fits(addr.0, size_bytes)
            || self.overlaps(addr.0, size_bytes)
        {
            return Err(overlap_error(addr, size_bytes));
        }
        let id = self.fresh_id();
        self.stats.segment_count += 1;
        self.regions.insert(addr.0, size_bytes);
        let end = self
            .range_span(size_bytes)
            .and_then(|span| addr.0.checked_add(span))
            .unwrap_or(ADDRESS_END);
        self.next_range = self.next_range.max(end);
        Ok(self.vm.add_range(SegmentId(id), addr, size_bytes))
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        if size_bytes == 0 || self.vm.chunk_count() >= MAX_LIVE_CHUNKS {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: size_bytes,
            });
        }
        let charge = self.charge_for(size_bytes);
        self.refuse(charge, size_bytes)?;
        let s = &mut self.stats;
        s.reserved_bytes += size_bytes;
        s.charged_bytes += charge;
        Ok(self.vm.add_chunk(size_bytes, ()))
    }

    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm.map(range, offset_bytes, chunks);
        self.stats.allocate_count += 1;
        Ok(())
    }

    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm.unmap(range, offset_bytes, chunks);
        self.stats.free_count += 1;
        Ok(())
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        let size = chunk.size_bytes;
        let charge = self.charge_for(size);
        self.vm.remove_chunk(chunk);
        let s = &mut self.stats;
        s.reserved_bytes -= size;
        s.charged_bytes -= charge;
        Ok(())
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        self.regions.remove(&range.addr.0);
        self.vm.remove_range(range);
        self.stats.segment_count -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(d: &mut SimDevice, size: u64) -> Segment {
        d.allocate_segment(size).unwrap()
    }

    /// The measured H100 charges: whole 2 MiB pages above 1 MiB, packing at or below.
    #[test]
    fn charges_follow_the_h100_measurements() {
        // (size, charge of 8 live allocations), from h100-driver-granularity.json.
        let cases = [
            (1, 2 * MIB),
            (512, 2 * MIB),
            (4096, 2 * MIB),
            (65536, 2 * MIB),
            (MIB, 8 * MIB),
            (2 * MIB - 1, 16 * MIB),
            (2 * MIB, 16 * MIB),
            (2 * MIB + 1, 32 * MIB),
            (3 * MIB, 32 * MIB),
            (20 * MIB, 160 * MIB),
            (20 * MIB + 512, 176 * MIB),
            (64 * MIB + 1, 528 * MIB),
            (GIB, 8 * GIB),
        ];
        for (size, charge8) in cases {
            let mut d = SimDevice::new(SimDeviceOptions::default());
            let segs: Vec<_> = (0..8).map(|_| alloc(&mut d, size)).collect();
            assert_eq!(d.stats().charged_bytes, charge8, "8 x {size}");
            assert_eq!(d.stats().reserved_bytes, 8 * size);
            for s in segs {
                d.free_segment(s).unwrap();
            }
            assert_eq!(d.stats().charged_bytes, 0, "everything returned for {size}");
        }
    }

    /// Freed holes in packed pages are reused best-fit, before any new page is opened.
    #[test]
    fn packed_holes_are_reused_best_fit() {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let a = alloc(&mut d, MIB); // page 1: [a 1 MiB][hole 1 MiB]
        let b = alloc(&mut d, 3 * MIB / 2); // page 2: [b 1.5 MiB][hole 0.5 MiB]
        let c = alloc(&mut d, MIB / 2); // best fit: page 2's 0.5 MiB hole
        assert_eq!(c.addr.0, b.addr.0 + 3 * MIB / 2);
        assert_eq!(d.stats().charged_bytes, 4 * MIB);
        d.free_segment(a).unwrap(); // page 1 empty: returned
        assert_eq!(d.stats().charged_bytes, 2 * MIB);
        d.free_segment(c).unwrap();
        let e = alloc(&mut d, MIB / 4); // page 2's merged 0.5 MiB hole
        assert_eq!(e.addr.0, b.addr.0 + 3 * MIB / 2);
        assert_eq!(d.stats().charged_bytes, 2 * MIB);
        d.free_segment(b).unwrap();
        d.free_segment(e).unwrap();
        assert_eq!(d.stats().charged_bytes, 0);
    }

    /// Capacity is enforced on charged bytes, and an allocation that does not fit
    /// changes nothing.
    #[test]
    fn capacity_refuses_without_side_effects() {
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(10 * MIB));
        let _a = alloc(&mut d, 7 * MIB); // charged 8 MiB
        let before = d.stats();
        assert_eq!(
            d.allocate_segment(3 * MIB),
            Err(DeviceError::OutOfMemory {
                requested_bytes: 3 * MIB
            })
        );
        assert_eq!(d.stats(), before);
        let _b = alloc(&mut d, 2 * MIB);
        assert_eq!(d.stats().free_bytes(), 0);
    }

    /// The top-down model places each new region below the last, 2 MiB aligned, and is
    /// deterministic.
    #[test]
    fn top_down_addresses_are_deterministic() {
        let top_down = SimDeviceOptions {
            address_model: AddressModel::TopDown,
            ..SimDeviceOptions::default()
        };
        let mut d = SimDevice::new(top_down.clone());
        let a = alloc(&mut d, 20 * MIB);
        let b = alloc(&mut d, 3 * MIB);
        assert_eq!(a.addr.0, TOP_DOWN_START - 20 * MIB);
        assert_eq!(b.addr.0, a.addr.0 - 4 * MIB);
        let mut e = SimDevice::new(top_down);
        assert_eq!(alloc(&mut e, 20 * MIB).addr, a.addr);
    }

    /// The driver model (the default) places segments by the driver's rules: a
    /// 20 MiB segment at the bottom of a 32 MiB chunk, a 3 MiB one in the chunk's
    /// leftover just above it, a freed one's place taken again; packed pages are
    /// placements too, released with their last allocation.
    #[test]
    fn driver_addresses_follow_the_driver_rules() {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let a = alloc(&mut d, 20 * MIB);
        let b = alloc(&mut d, 3 * MIB);
        assert_eq!(a.addr.0, TOP_DOWN_START - 32 * MIB);
        assert_eq!(b.addr.0, a.addr.0 + 20 * MIB);
        let c = alloc(&mut d, 512);
        assert_eq!(
            c.addr.0,
            a.addr.0 + 24 * MIB,
            "a packed page in the leftover"
        );
        let c_addr = c.addr;
        d.free_segment(c).unwrap();
        assert_eq!(alloc(&mut d, 4096).addr, c_addr, "the page was released");
        let b_addr = b.addr;
        d.free_segment(b).unwrap();
        assert_eq!(alloc(&mut d, 2 * MIB).addr, b_addr);
        let mut e = SimDevice::new(SimDeviceOptions::default());
        assert_eq!(alloc(&mut e, 20 * MIB).addr, a.addr, "deterministic");
    }

    /// The driver model puts virtual-memory ranges bottom-up from the base the H100
    /// gave every recorded run, one after the other in whole 32 MiB chunks (the H100's
    /// second range lay 91 232 MiB above a first of 91 213.875 MiB).
    #[test]
    fn driver_ranges_go_bottom_up() {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r1 = d.reserve_range(90 * GIB).unwrap();
        let r2 = d.reserve_range(GIB + 1).unwrap();
        assert_eq!(r1.addr.0, RANGE_START);
        assert_eq!(r2.addr.0, RANGE_START + 90 * GIB);
        let r3 = d.reserve_range(GIB).unwrap();
        assert_eq!(r3.addr.0, r2.addr.0 + GIB + 32 * MIB);
        let r4 = d.reserve_range(95_644_811_264).unwrap();
        let r5 = d.reserve_range(GIB).unwrap();
        assert_eq!(r5.addr.0 - r4.addr.0, 91_232 * MIB);
        for r in [r1, r2, r3, r4, r5] {
            d.release_range(r).unwrap();
        }
    }

    /// Recorded addresses are used while sizes match, then abandoned for good.
    #[test]
    fn hints_are_followed_until_the_first_mismatch() {
        let hints = AddressHints {
            segments: [
                (20 * MIB, 0x7fc0_0000_0000),
                (2 * MIB, 0x7fc1_0000_0000),
                (4 * MIB, 0x7fc2_0000_0000),
            ]
            .into(),
            ranges: VecDeque::new(),
        };
        let top_down = SimDeviceOptions {
            address_model: AddressModel::TopDown,
            ..SimDeviceOptions::default()
        };
        let mut d = SimDevice::with_hints(top_down, hints.clone());
        assert_eq!(alloc(&mut d, 20 * MIB).addr.0, 0x7fc0_0000_0000);
        let off = alloc(&mut d, 6 * MIB);
        assert!(
            off.addr.0 < 0x7fc0_0000_0000,
            "fallback stays below recorded addresses"
        );
        assert_ne!(
            alloc(&mut d, 4 * MIB).addr.0,
            0x7fc2_0000_0000,
            "hints abandoned"
        );
        // The driver model adopts the recorded address and goes on from it: the 6 MiB
        // segment lands in the leftover of the recorded segment's chunk.
        let mut d = SimDevice::with_hints(SimDeviceOptions::default(), hints);
        assert_eq!(alloc(&mut d, 20 * MIB).addr.0, 0x7fc0_0000_0000);
        assert_eq!(alloc(&mut d, 6 * MIB).addr.0, 0x7fc0_0000_0000 + 20 * MIB);
        assert_ne!(alloc(&mut d, 4 * MIB).addr.0, 0x7fc2_0000_0000);
    }

    /// Physical chunks are charged in whole pages from creation to release; mapping and
    /// unmapping only move them in the address space.
    #[test]
    fn virtual_memory_pages() {
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(100 * MIB));
        let r = d.reserve_range(GIB).unwrap();
        assert_eq!(d.stats().charged_bytes, 0);
        let pages: Vec<PhysicalChunk> = (0..3)
            .map(|_| d.create_physical(20 * MIB).unwrap())
            .collect();
        assert_eq!(d.stats().reserved_bytes, 60 * MIB);
        assert_eq!(d.stats().charged_bytes, 60 * MIB);
        d.map(&r, 0, &pages).unwrap();
        assert_eq!(d.stats().charged_bytes, 60 * MIB, "mapping charges nothing");
        assert_eq!(
            d.create_physical(41 * MIB),
            Err(DeviceError::OutOfMemory {
                requested_bytes: 41 * MIB
            }),
            "42 MiB charged do not fit in the 40 MiB left"
        );
        let odd = d.create_physical(MIB + 1).unwrap();
        assert_eq!(d.stats().charged_bytes, 62 * MIB, "whole pages");
        d.release_physical(odd).unwrap();
        d.unmap(&r, 20 * MIB, &pages[1..]).unwrap();
        assert_eq!(d.live_regions(), vec![(r.addr.0, 20 * MIB)]);
        let [a, b, c] = <[PhysicalChunk; 3]>::try_from(pages).unwrap();
        d.unmap(&r, 0, std::slice::from_ref(&a)).unwrap();
        for chunk in [a, b, c] {
            d.release_physical(chunk).unwrap();
        }
        d.release_range(r).unwrap();
        assert_eq!(d.stats().charged_bytes, 0);
        assert_eq!(d.stats().segment_count, 0);
        assert_eq!((d.stats().allocate_count, d.stats().free_count), (1, 2));
    }

    /// The regions a device builds only when a region is first placed otherwise than by
    /// the driver model (here an address range, then an adopted segment) are those a
    /// device keeping them from the start holds, and both place everything alike.
    #[test]
    fn regions_built_late_match_regions_kept_throughout() {
        let mut late = SimDevice::new(SimDeviceOptions::default());
        let mut kept = SimDevice::new(SimDeviceOptions::default());
        assert!(!late.regions_kept);
        kept.keep_regions();
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut live: Vec<(Segment, Segment)> = Vec::new();
        let mut ranges = Vec::new();
        for step in 0..4000 {
            if step == 1500 {
                ranges.push((
                    late.reserve_range(GIB).unwrap(),
                    kept.reserve_range(GIB).unwrap(),
                ));
                assert!(late.regions_kept);
                assert_eq!(late.regions, kept.regions);
            }
            if step == 2500 {
                let at = DeviceAddr(0x10_0000_0000);
                live.push((
                    late.adopt_segment(at, 40 * MIB).unwrap(),
                    kept.adopt_segment(at, 40 * MIB).unwrap(),
                ));
            }
            if live.is_empty() || next() % 100 < 55 {
                let size = 1 + ((next() % (64 * MIB)) >> (next() % 16));
                let a = late.allocate_segment(size).unwrap();
                let b = kept.allocate_segment(size).unwrap();
                assert_eq!(a.addr, b.addr, "step {step}: {size} bytes");
                live.push((a, b));
            } else {
                let i = (next() % live.len() as u64) as usize;
                let (a, b) = live.swap_remove(i);
                late.free_segment(a).unwrap();
                kept.free_segment(b).unwrap();
            }
            assert_eq!(late.stats(), kept.stats());
        }
        assert_eq!(late.regions, kept.regions);
        assert_eq!(late.live_regions(), kept.live_regions());
    }

    /// Stitching is expressible on the simulated device.
    #[test]
    fn stitching() {
        policies::testing::check_stitching(&mut SimDevice::new(SimDeviceOptions::default()));
    }

    /// Hints near 0 or near 2^64 are not followed (the device falls back to its model),
    /// and no address it hands out wraps.
    #[test]
    fn hints_outside_the_address_space_are_not_followed() {
        for bad in [0, 1, ADDRESS_END - MIB, u64::MAX - 4095] {
            let hints = AddressHints {
                segments: [(2 * MIB, bad), (2 * MIB, 0x7fc0_0000_0000)].into(),
                ranges: [bad].into(),
            };
            let mut d = SimDevice::with_hints(SimDeviceOptions::default(), hints);
            let a = alloc(&mut d, 2 * MIB);
            let model = alloc(&mut SimDevice::new(SimDeviceOptions::default()), 2 * MIB);
            assert_eq!(a.addr, model.addr, "hint {bad:#x}");
            let r = d.reserve_range(GIB).unwrap();
            assert!(
                AddressHints::fits(r.addr.0, GIB),
                "range at {:#x}",
                r.addr.0
            );
            d.release_range(r).unwrap();
            d.free_segment(a).unwrap();
        }
    }

    /// Once the top-down model has used up its address space (addresses are never
    /// reused by the model), new regions go to the lowest free gap; when no gap holds a
    /// region, a segment is out of memory and an address range a driver error.
    #[test]
    fn placement_never_wraps() {
        let huge = (1u64 << 60) - 2 * MIB;
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(u64::MAX));
        // 127 TiB of top-down room cannot hold one; gaps above it hold sixteen.
        let mut live = Vec::new();
        while let Ok(s) = d.allocate_segment(huge) {
            assert!(AddressHints::fits(s.addr.0, huge), "{:#x}", s.addr.0);
            live.push(s);
        }
        assert_eq!(live.len(), 16);
        let regions = d.live_regions();
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
        match d.reserve_range(1 << 62) {
            Err(DeviceError::Driver { code: 2, message }) => {
                assert!(message.contains("cuMemAddressReserve"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // Freed space is found again.
        let s = live.swap_remove(3);
        let addr = s.addr.0;
        d.free_segment(s).unwrap();
        assert_eq!(alloc(&mut d, huge).addr.0, addr);
    }

    /// A range as large as an address can express is refused as a driver error, and
    /// the page bound turns a runaway of physical chunks into out of memory.
    #[test]
    fn absurd_virtual_memory_is_refused() {
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(1 << 63));
        assert!(matches!(
            d.reserve_range(u64::MAX / (2 * MIB) * (2 * MIB)),
            Err(DeviceError::Driver { code: 2, .. })
        ));
        let chunks: Vec<_> = (0..MAX_LIVE_CHUNKS)
            .map(|_| d.create_physical(1).unwrap())
            .collect();
        assert_eq!(
            d.create_physical(1),
            Err(DeviceError::OutOfMemory { requested_bytes: 1 })
        );
        for c in chunks {
            d.release_physical(c).unwrap();
        }
        assert_eq!(d.stats().charged_bytes, 0);
    }
}
