//! PyTorch's `DeviceStats`, field for field, so `torch.cuda.memory_stats()` can be
//! compared key by key with a simulated run.

/// One statistic: PyTorch's `Stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Present value.
    pub current: u64,
    /// Highest value since the start (or the last peak reset).
    pub peak: u64,
    /// Sum of all increases.
    pub allocated: u64,
    /// Sum of all decreases.
    pub freed: u64,
}

impl Stat {
    /// `current += amount`, raising the peak.
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount;
        // A branch, not a conditional store: the peak rarely moves.
        if self.current > self.peak {
            self.peak = self.current;
        }
        self.allocated += amount;
    }

    /// `current -= amount`.
    ///
    /// # Panics
    /// If the statistic would go negative (an accounting bug).
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current = self
            .current
            .checked_sub(amount)
            .expect("caching allocator statistic went negative");
        self.freed += amount;
    }
}

/// Which pool a statistic update is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolKind {
    /// Rounded requests up to 1 MiB, in 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// PyTorch's name for the pool in `memory_stats()` keys.
    pub fn stat_name(self) -> &'static str {
        match self {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        }
    }
}

/// A statistic kept for all pools together and for each pool, PyTorch's `StatArray`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray {
    /// Both pools (`.all.`).
    pub all: Stat,
    /// The small pool (`.small_pool.`).
    pub small_pool: Stat,
    /// The large pool (`.large_pool.`).
    pub large_pool: Stat,
}

impl StatArray {
    /// Increases `all` and the pool's statistic.
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    /// Decreases `all` and the pool's statistic.
    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    /// Applies a signed change.
    #[inline]
    pub fn change(&mut self, pool: PoolKind, delta: i64) {
        if delta > 0 {
            self.increase(pool, delta.unsigned_abs());
        } else if delta < 0 {
            self.decrease(pool, delta.unsigned_abs());
        }
    }

    #[inline]
    fn pool_mut(&mut self, pool: PoolKind) -> &mut Stat {
        match pool {
            PoolKind::Small => &mut self.small_pool,
            PoolKind::Large => &mut self.large_pool,
        }
    }

    fn reset_accumulated(&mut self) {
        for s in [&mut self.all, &mut self.small_pool, &mut self.large_pool] {
            s.allocated = 0;
            s.freed = 0;
        }
    }

    fn reset_peak(&mut self) {
        for s in [&mut self.all, &mut self.small_pool, &mut self.large_pool] {
            s.peak = s.current;
        }
    }
}

/// PyTorch's per-device allocator statistics (`DeviceStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachingStats {
    /// Live allocations (`allocation`).
    pub allocation: StatArray,
    /// Live device segments (`segment`); expandable segments do not count.
    pub segment: StatArray,
    /// Allocated or pending-free blocks (`active`).
    pub active: StatArray,
    /// Free blocks that are part of a split segment (`inactive_split`).
    pub inactive_split: StatArray,
    /// Bytes of live allocations, block sizes (`allocated_bytes`).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device (`reserved_bytes`).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks (`active_bytes`).
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: StatArray,
    /// Bytes requested by active blocks' tenants (`requested_bytes`).
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Stat,
    /// Third `cudaMalloc` attempts, after releasing the cache (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Out-of-memory errors raised (`num_ooms`).
    pub num_ooms: u64,
    /// Synchronizations of all outstanding events (`num_sync_all_streams`).
    pub num_sync_all_streams: u64,
    /// `cudaMalloc` calls and expandable-segment mappings (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// `cudaFree` calls and page unmappings (`num_device_free`).
    pub num_device_free: u64,
}

impl CachingStats {
    /// `torch.cuda.reset_peak_memory_stats()`: every peak becomes the current value.
    pub fn reset_peaks(&mut self) {
        for a in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            a.reset_peak();
        }
        self.oversize_allocations.peak = self.oversize_allocations.current;
        self.oversize_segments.peak = self.oversize_segments.current;
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`: every `allocated` and `freed`
    /// total and every counter (`num_alloc_retries`, `num_ooms`, ...) becomes 0.
    pub fn reset_accumulated(&mut self) {
        for a in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            a.reset_accumulated();
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.allocated = 0;
            s.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The statistics flattened as `torch.cuda.memory_stats()` flattens them
    /// (`allocated_bytes.all.peak`, `num_ooms`, ...), sorted by key.
    /// `max_split_size` is the configured value, −1 when unlimited.
    pub fn flatten(&self, max_split_size_bytes: u64) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        let mut push_stat = |prefix: String, s: &Stat| {
            out.push((format!("{prefix}.current"), s.current as i64));
            out.push((format!("{prefix}.peak"), s.peak as i64));
            out.push((format!("{prefix}.allocated"), s.allocated as i64));
            out.push((format!("{prefix}.freed"), s.freed as i64));
        };
        for (name, a) in arrays {
            push_stat(format!("{name}.all"), &a.all);
            push_stat(format!("{name}.small_pool"), &a.small_pool);
            push_stat(format!("{name}.large_pool"), &a.large_pool);
        }
        push_stat("oversize_allocations".into(), &self.oversize_allocations);
        push_stat("oversize_segments".into(), &self.oversize_segments);
        out.push(("num_alloc_retries".into(), self.num_alloc_retries as i64));
        out.push(("num_ooms".into(), self.num_ooms as i64));
        out.push((
            "num_sync_all_streams".into(),
            self.num_sync_all_streams as i64,
        ));
        out.push(("num_device_alloc".into(), self.num_device_alloc as i64));
        out.push(("num_device_free".into(), self.num_device_free as i64));
        let max_split = if max_split_size_bytes == u64::MAX {
            -1
        } else {
            max_split_size_bytes as i64
        };
        out.push(("max_split_size".into(), max_split));
        out.sort();
        out
    }
}

/// One pool's figures of a [`Tally`]: PyTorch's `Stat` without `freed`, which is
/// `base + allocated - current` (`base`: the current value when the accumulated figures
/// were last reset, or 0), so a decrease writes one figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PoolTally {
    current: u64,
    peak: u64,
    allocated: u64,
    base: u64,
}

impl PoolTally {
    fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.allocated,
            freed: self.base + self.allocated - self.current,
        }
    }
}

/// A [`StatArray`] as the caching policy keeps it: each pool's figures, and of the
/// two pools together only the current value and its peak (their `allocated` and
/// `freed` are the pools' sums, added where read). An increase writes five figures
/// and a decrease two, where PyTorch's layout writes six and four; every figure read
/// through [`Tally::array`] is PyTorch's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Tally {
    all_current: u64,
    all_peak: u64,
    /// By [`PoolKind`] (small, large).
    pools: [PoolTally; 2],
}

impl Tally {
    /// Increases both pools' figure and the pool's.
    #[inline(always)]
    pub(super) fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.all_current += amount;
        // A branch, not a conditional store: the peak rarely moves.
        if self.all_current > self.all_peak {
            self.all_peak = self.all_current;
        }
        let p = &mut self.pools[pool as usize];
        p.current += amount;
        if p.current > p.peak {
            p.peak = p.current;
        }
        p.allocated += amount;
    }

    /// Decreases both pools' figure and the pool's.
    ///
    /// # Panics
    /// If the pool's figure would go negative (an accounting bug).
    #[inline(always)]
    pub(super) fn decrease(&mut self, pool: PoolKind, amount: u64) {
        let p = &mut self.pools[pool as usize];
        let (current, negative) = p.current.overflowing_sub(amount);
        if negative {
            went_negative();
        }
        p.current = current;
        // Never below the pool's figure, which is not negative.
        self.all_current -= amount;
    }

    /// Applies a signed change: [`Tally::increase`] or [`Tally::decrease`] by its size
    /// (nothing when 0), computed without branching on its sign (a free's change of
    /// `inactive_split` goes either way, as the trace's neighbours fall).
    #[inline(always)]
    pub(super) fn change(&mut self, pool: PoolKind, delta: i64) {
        let up = delta.max(0) as u64;
        let down = delta.min(0).unsigned_abs();
        // The pool's figure first, as in `decrease`: a change past zero is named as
        // such, before the sum of both pools could wrap.
        let p = &mut self.pools[pool as usize];
        let (current, negative) = (p.current + up).overflowing_sub(down);
        if negative {
            went_negative();
        }
        p.current = current;
        // A decrease leaves the peaks: they are at least the figures before it.
        p.peak = p.peak.max(current);
        p.allocated += up;
        // Never below the pool's figure, which is not negative.
        self.all_current = self.all_current + up - down;
        self.all_peak = self.all_peak.max(self.all_current);
    }

    /// The current value, both pools together (`.all.current`).
    #[inline(always)]
    pub(super) fn current(&self) -> u64 {
        self.all_current
    }

    /// PyTorch's `StatArray`, every figure exact.
    pub(super) fn array(&self) -> StatArray {
        let [small, large] = self.pools.map(|p| p.stat());
        StatArray {
            all: Stat {
                current: self.all_current,
                peak: self.all_peak,
                allocated: small.allocated + large.allocated,
                freed: small.freed + large.freed,
            },
            small_pool: small,
            large_pool: large,
        }
    }

    fn reset_accumulated(&mut self) {
        for p in &mut self.pools {
            p.allocated = 0;
            p.base = p.current;
        }
    }

    fn reset_peak(&mut self) {
        self.all_peak = self.all_current;
        for p in &mut self.pools {
            p.peak = p.current;
        }
    }
}

#[cold]
#[inline(never)]
fn went_negative() -> ! {
    panic!("caching allocator statistic went negative")
}

/// [`CachingStats`] as the caching policy keeps them: each `StatArray` a [`Tally`]
/// (read them through [`Tallies::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Tallies {
    pub(super) allocation: Tally,
    pub(super) segment: Tally,
    pub(super) active: Tally,
    pub(super) inactive_split: Tally,
    pub(super) allocated_bytes: Tally,
    pub(super) reserved_bytes: Tally,
    pub(super) active_bytes: Tally,
    pub(super) inactive_split_bytes: Tally,
    pub(super) requested_bytes: Tally,
    pub(super) oversize_allocations: Stat,
    pub(super) oversize_segments: Stat,
    pub(super) num_alloc_retries: u64,
    pub(super) num_ooms: u64,
    pub(super) num_sync_all_streams: u64,
    pub(super) num_device_alloc: u64,
    pub(super) num_device_free: u64,
}

impl Tallies {
    /// PyTorch's statistics, every figure exact.
    pub(super) fn stats(&self) -> CachingStats {
        CachingStats {
            allocation: self.allocation.array(),
            segment: self.segment.array(),
            active: self.active.array(),
            inactive_split: self.inactive_split.array(),
            allocated_bytes: self.allocated_bytes.array(),
            reserved_bytes: self.reserved_bytes.array(),
            active_bytes: self.active_bytes.array(),
            inactive_split_bytes: self.inactive_split_bytes.array(),
            requested_bytes: self.requested_bytes.array(),
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
        }
    }

    fn tallies_mut(&mut self) -> [&mut Tally; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// [`CachingStats::reset_peaks`].
    pub(super) fn reset_peaks(&mut self) {
        for t in self.tallies_mut() {
            t.reset_peak();
        }
        self.oversize_allocations.peak = self.oversize_allocations.current;
        self.oversize_segments.peak = self.oversize_segments.current;
    }

    /// [`CachingStats::reset_accumulated`].
    pub(super) fn reset_accumulated(&mut self) {
        for t in self.tallies_mut() {
            t.reset_accumulated();
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.allocated = 0;
            s.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Increases move the peak and the running total; decreases only the freed total.
    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(2);
        assert_eq!(
            s,
            Stat {
                current: 8,
                peak: 10,
                allocated: 12,
                freed: 4
            }
        );
    }

    /// A peak reset makes every peak equal its current value.
    #[test]
    fn reset_peaks_sets_peak_to_current() {
        let mut st = CachingStats::default();
        st.reserved_bytes.increase(PoolKind::Large, 100);
        st.reserved_bytes.decrease(PoolKind::Large, 60);
        st.reset_peaks();
        assert_eq!(st.reserved_bytes.all.peak, 40);
        assert_eq!(st.reserved_bytes.large_pool.peak, 40);
    }

    /// A [`Tally`] reads as the [`StatArray`] that PyTorch's layout keeps, every figure
    /// after every step: increases, decreases and signed changes of either pool, peak
    /// resets and accumulated resets in any order.
    #[test]
    fn tally_reads_as_pytorchs_stat_array() {
        use proptest::prelude::*;
        let op = (0u8..5, any::<bool>(), 0u64..1000);
        proptest!(|(ops in proptest::collection::vec(op, 0..200))| {
            let (mut reference, mut tally) = (StatArray::default(), Tally::default());
            for (kind, large, amount) in ops {
                let pool = if large { PoolKind::Large } else { PoolKind::Small };
                let held = reference.pool_mut(pool).current;
                match kind {
                    0 => {
                        reference.increase(pool, amount);
                        tally.increase(pool, amount);
                    }
                    1 => {
                        let amount = amount.min(held);
                        reference.decrease(pool, amount);
                        tally.decrease(pool, amount);
                    }
                    2 => {
                        let delta = amount as i64 - held.min(500) as i64;
                        reference.change(pool, delta);
                        tally.change(pool, delta);
                    }
                    3 => {
                        reference.reset_peak();
                        tally.reset_peak();
                    }
                    _ => {
                        reference.reset_accumulated();
                        tally.reset_accumulated();
                    }
                }
                prop_assert_eq!(tally.array(), reference);
                prop_assert_eq!(tally.current(), reference.all.current);
            }
        });
    }

    /// A decrease below zero panics, as PyTorch's layout did.
    #[test]
    #[should_panic(expected = "went negative")]
    fn tally_refuses_negative() {
        let mut t = Tally::default();
        t.increase(PoolKind::Small, 3);
        t.decrease(PoolKind::Large, 1);
    }

    /// Flattened keys follow PyTorch's naming and `max_split_size` is −1 when unlimited.
    #[test]
    fn flatten_uses_pytorch_keys() {
        let flat = CachingStats::default().flatten(u64::MAX);
        let keys: Vec<&str> = flat.iter().map(|(k, _)| k.as_str()).collect();
        assert!(keys.contains(&"allocated_bytes.all.peak"));
        assert!(keys.contains(&"inactive_split_bytes.small_pool.current"));
        assert!(flat.contains(&("max_split_size".to_string(), -1)));
    }
}
