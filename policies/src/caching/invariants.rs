//! The caching policy's invariants, checked from the blocks up (`Policy::check_invariants`).

use super::*;

impl CachingPolicy {
    /// Every structural and statistical fact the policy keeps, checked from scratch.
    pub(super) fn check_all_invariants(&self) {
        let mut allocated = (0u64, 0u64);
        let mut active = (0u64, 0u64, 0u64);
        let mut inactive_split = (0u64, 0u64);
        let mut free_mapped = 0usize;
        let mut unmapped = 0usize;
        let mut reserved = 0u64;
        self.blocks.check("caching blocks");
        if self.streams.len() > SCANNED_STREAMS {
            assert_eq!(
                self.stream_slots.len(),
                self.streams.len(),
                "the stream map misses streams"
            );
            for (slot, stream) in self.streams.iter().enumerate() {
                assert_eq!(
                    self.stream_slots.get(stream),
                    Some(&(slot as u32)),
                    "the stream map gives another slot"
                );
            }
        } else {
            assert!(self.stream_slots.is_empty(), "a stream map for few streams");
        }
        assert_eq!(
            self.power2_divisions,
            CachingPolicy::rounds_to_divisions(&self.config),
            "the power-of-two rounding flag disagrees with the settings"
        );
        assert_eq!(
            self.gc_threshold_set,
            CachingPolicy::collects_garbage(&self.config),
            "the garbage collection flag disagrees with the settings"
        );
        for (id, b) in self.blocks.iter() {
            assert_eq!(
                b.in_free_set(),
                b.state == State::Free && b.mapped(),
                "a block is in a free set exactly while it is free and mapped"
            );
            // The cache releases read no free block below the pool's bound: none there
            // is a whole segment, and none covers an expandable segment's page.
            let bound = self.pool(b.owner, b.pool()).smallest_release;
            let least = if b.expandable() {
                self.expandable(b.segment).page_bytes
            } else if b.prev == NIL && b.next == NIL {
                b.size
            } else {
                u64::MAX
            };
            assert!(
                least >= bound,
                "a block that a cache release could give back ({least} bytes at once) \
                 below its pool's bound, {bound}: the releases would pass over it"
            );
            assert!(
                b.size > 0 && b.size % MIN_BLOCK_BYTES == 0,
                "block size {} not a positive multiple of 512",
                b.size
            );
            for (n, forward) in [(b.prev, false), (b.next, true)] {
                if n == NIL {
                    continue;
                }
                let nb = self.block(n);
                assert_eq!(
                    if forward { nb.prev } else { nb.next },
                    id,
                    "broken block links"
                );
                let (lo, hi) = if forward { (b, nb) } else { (nb, b) };
                assert_eq!(
                    lo.addr + lo.size,
                    hi.addr,
                    "neighbouring blocks do not touch"
                );
                assert!(
                    nb.segment == b.segment
                        && nb.expandable() == b.expandable()
                        && nb.stream == b.stream
                        && nb.pool() == b.pool()
                        && nb.owner == b.owner,
                    "neighbours in different segments"
                );
                if forward && b.state == State::Free && nb.state == State::Free {
                    assert_ne!(
                        b.mapped(),
                        nb.mapped(),
                        "two free neighbours were not merged"
                    );
                }
            }
            match (b.state, b.mapped()) {
                (State::Free, true) => {
                    free_mapped += 1;
                    assert_eq!(
                        self.pool(b.owner, b.pool())
                            .blocks
                            .get(&self.blocks, b.stream, b.size, b.addr)
                            .as_ref(),
                        Some(&id),
                        "free block missing from its pool"
                    );
                    if !b.expandable() && (b.prev != NIL || b.next != NIL) {
                        inactive_split.0 += 1;
                        inactive_split.1 += b.size;
                    }
                }
                (State::Free, false) => {
                    assert!(
                        b.expandable(),
                        "unmapped block outside an expandable segment"
                    );
                    unmapped += 1;
                    assert_eq!(
                        self.pool(b.owner, b.pool())
                            .unmapped
                            .get(&(self.stream_id(b.stream).0, b.addr)),
                        Some(&id),
                        "unmapped block missing from its pool"
                    );
                }
                (State::Allocated, _) | (State::Pending, _) => {
                    assert!(b.mapped(), "allocated block is not mapped");
                    assert!(b.stamp > 0, "allocated block without a tenant");
                    if b.state == State::Allocated {
                        allocated.0 += 1;
                        allocated.1 += b.size;
                    } else {
                        assert!(self.pending.contains(&id), "pending block not tracked");
                    }
                    active.0 += 1;
                    active.1 += b.size;
                    active.2 += b.requested;
                }
                (State::Vacant, _) => unreachable!("the block table lists no vacant slot"),
            }
            if b.prev == NIL && !b.expandable() {
                let seg = self
                    .segments
                    .get(b.segment)
                    .expect("block of a freed segment");
                assert_eq!(
                    seg.addr.0, b.addr,
                    "segment head is not at the segment base"
                );
                let mut covered = 0;
                let mut cur = id;
                while cur != NIL {
                    covered += self.block(cur).size;
                    cur = self.block(cur).next;
                }
                assert_eq!(covered, seg.size_bytes, "blocks do not tile their segment");
                reserved += seg.size_bytes;
            }
            if b.prev == NIL && b.expandable() {
                let es = self.expandable(b.segment);
                assert_eq!(
                    es.range.addr.0, b.addr,
                    "expandable head is not at the range base"
                );
                let mut covered = 0;
                let mut cur = id;
                while cur != NIL {
                    let c = self.block(cur);
                    let first_page = (c.addr - es.range.addr.0) / es.page_bytes;
                    let last_page = (c.addr + c.size - 1 - es.range.addr.0) / es.page_bytes;
                    if c.mapped() {
                        for p in first_page..=last_page {
                            assert!(es.is_mapped(p), "mapped block over an unmapped page");
                        }
                    } else {
                        assert_eq!(
                            (c.addr - es.range.addr.0) % es.page_bytes,
                            0,
                            "unmapped block not page aligned"
                        );
                        assert_eq!(c.size % es.page_bytes, 0, "unmapped block not whole pages");
                        // Pages past the last handle are unmapped by construction: the
                        // check costs the mapped pages, not the range (which may span
                        // 1 1/8 of an absurdly large device).
                        for p in first_page..=last_page.min(es.handle_count()) {
                            assert!(!es.is_mapped(p), "unmapped block over a mapped page");
                        }
                    }
                    covered += c.size;
                    cur = c.next;
                }
                assert_eq!(
                    covered, es.range.size_bytes,
                    "blocks do not tile their expandable segment"
                );
                let mapped = es.mapped_page_count() * es.page_bytes;
                assert_eq!(mapped, es.mapped_bytes, "expandable segment mapped bytes");
                reserved += es.mapped_bytes;
            }
        }
        let s = &self.caching_stats();
        assert_eq!(
            free_mapped,
            self.pools
                .iter()
                .map(|p| p.small.blocks.len() + p.large.blocks.len())
                .sum::<usize>(),
            "pool holds stale blocks"
        );
        assert_eq!(
            unmapped,
            self.pools
                .iter()
                .map(|p| p.small.unmapped.len() + p.large.unmapped.len())
                .sum::<usize>(),
            "unmapped set holds stale blocks"
        );
        self.check_pool_invariants();
        assert_eq!(
            self.mapped_expandables,
            self.expandables
                .iter()
                .flatten()
                .filter(|e| e.mapped_bytes > 0)
                .count() as u64,
            "count of expandable segments holding memory"
        );
        let mut uncached = UncachedTotals::default();
        for (_, (seg, requested)) in self.uncached.iter() {
            uncached.add(seg.size_bytes, *requested);
        }
        assert_eq!(
            self.uncached_totals, uncached,
            "sums of uncached allocations"
        );
        assert_eq!(
            reserved, s.reserved_bytes.all.current,
            "reserved_bytes disagrees with the segments"
        );
        assert_eq!(
            reserved, self.total_allocated,
            "total_allocated_memory disagrees with the segments"
        );
        assert_eq!(
            allocated,
            (s.allocation.all.current, s.allocated_bytes.all.current),
            "allocated stats"
        );
        assert_eq!(
            active,
            (
                s.active.all.current,
                s.active_bytes.all.current,
                s.requested_bytes.all.current
            ),
            "active stats"
        );
        assert_eq!(
            inactive_split,
            (
                s.inactive_split.all.current,
                s.inactive_split_bytes.all.current
            ),
            "inactive_split stats"
        );
        for a in [
            &s.allocation,
            &s.segment,
            &s.active,
            &s.inactive_split,
            &s.allocated_bytes,
            &s.reserved_bytes,
            &s.active_bytes,
            &s.inactive_split_bytes,
            &s.requested_bytes,
        ] {
            assert_eq!(
                a.all.current,
                a.small_pool.current + a.large_pool.current,
                "pool stats do not add up"
            );
        }
    }
}
