//! Expandable segments: one reserved address range per stream and pool, pages
//! mapped on demand and unmapped where a whole page is free.

use super::*;

/// The bytes of address space PyTorch reserves for one expandable segment on a device
/// of `total_bytes` whose pages are `page_bytes`: 1 1/8 of the device's memory, in whole
/// pages (`ExpandableSegment`'s constructor). The one owner of this rule: the policy
/// reserves it, adopting a recorded state rebuilds it, and recorded address hints
/// measure ranges with it. Computed wide: for a total near 2^64 the range is as large as
/// an address can express (the largest whole number of pages), and the device refuses
/// to reserve it (an error, as `cuMemAddressReserve`'s failure is in PyTorch), rather
/// than wrapping to a small one.
pub fn expandable_range_bytes(total_bytes: u64, page_bytes: u64) -> u64 {
    let page_bytes = page_bytes.max(1);
    let want = (u128::from(total_bytes) + u128::from(total_bytes / 8))
        .div_ceil(u128::from(page_bytes))
        * u128::from(page_bytes);
    u64::try_from(want).unwrap_or(u64::MAX / page_bytes * page_bytes)
}

impl CachingPolicy {
    /// `try_allocate_expandable_block`: maps just enough pages at the lowest place that
    /// can hold the request.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        device: &mut dyn Device,
        owner: u32,
        pool: PoolKind,
        stream: StreamId,
        slot: u32,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
        let mut candidate = self.find_expandable_block(device, owner, pool, stream, slot, size)?;
        if !self.block(candidate).mapped() {
            let len = self.block(candidate).size.min(size);
            if !self.map_block(device, candidate, len)? {
                return Ok(None);
            }
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self.block(candidate).next;
            let len = remaining.min(self.block(next).size);
            if !self.map_block(device, next, len)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.pools[owner as usize]
            .get_mut(pool)
            .blocks
            .remove(&mut self.blocks, candidate);
        Ok(Some(candidate))
    }

    /// `find_expandable_block`: the lowest address where free and unmapped space of the
    /// stream's expandable segments adds up to `size`; a new segment if there is none.
    fn find_expandable_block(
        &mut self,
        device: &mut dyn Device,
        owner: u32,
        pool_kind: PoolKind,
        stream: StreamId,
        slot: u32,
        size: u64,
    ) -> Result<u32, DeviceError> {
        let allocatable = |blocks: &DenseSlab<Block>, id: u32| {
            id != NIL && blocks.get(id).is_some_and(|b| b.state == State::Free)
        };
        let unmapped: Vec<u32> = self
            .pool(owner, pool_kind)
            .unmapped
            .range((stream.0, 0)..)
            .take_while(|(k, _)| k.0 == stream.0)
            .map(|(_, &id)| id)
            .collect();
        for id in unmapped {
            let mut c = id;
            let prev = self.block(c).prev;
            if allocatable(&self.blocks, prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < size && allocatable(&self.blocks, b) {
                bytes += self.block(b).size;
                b = self.block(b).next;
            }
            if bytes >= size {
                return Ok(c);
            }
        }
        let page_bytes = match pool_kind {
            PoolKind::Small => SMALL_BUFFER_BYTES,
            PoolKind::Large => self.config.large_segment_size_bytes,
        };
        let stats = device.stats();
        let total = if stats.total_bytes > 0 {
            stats.total_bytes
        } else {
            stats.capacity_bytes
        };
        let range_bytes = expandable_range_bytes(total, page_bytes);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        let range = vm.reserve_range(range_bytes)?;
        let (addr, va_size) = (range.addr.0, range.size_bytes);
        self.expandables.push(Some(ExpandableSegment {
            range,
            page_bytes,
            handles: Vec::new(),
            mapped_bytes: 0,
        }));
        let es = (self.expandables.len() - 1) as u32;
        let id = self.insert_block(Block::whole(
            addr, va_size, slot, pool_kind, owner, es, true, false,
        ));
        self.pool_mut(owner, pool_kind).got_segment(page_bytes);
        self.pool_mut(owner, pool_kind)
            .unmapped
            .insert((stream.0, addr), id);
        Ok(id)
    }

    /// `map_block`: maps the pages under the first `size` bytes of an unmapped block and
    /// merges them with free neighbours. `Ok(false)` when the device is out of memory.
    fn map_block(
        &mut self,
        device: &mut dyn Device,
        id: u32,
        size: u64,
    ) -> Result<bool, DeviceError> {
        let b = *self.block(id);
        debug_assert!(!b.mapped() && size <= b.size);
        let es = self.expandable_mut(b.segment);
        let page = es.page_bytes;
        let base = es.range.addr.0;
        let begin = (b.addr - base) / page;
        let end = (b.addr + size - base).div_ceil(page);
        debug_assert_eq!(base + begin * page, b.addr);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        let was_mapped = es.mapped_bytes > 0;
        if !es.map(vm, begin, end)? {
            return Ok(false);
        }
        let now_mapped = es.mapped_bytes > 0;
        self.mapped_expandables += u64::from(!was_mapped && now_mapped);
        let mapped_size = (end - begin) * page;
        let stream = self.stream_id(b.stream).0;
        self.pool_mut(b.owner, b.pool())
            .unmapped
            .remove(&(stream, b.addr));
        self.block_mut(id).set_mapped(true);
        if mapped_size < b.size {
            let rest = self.insert_block(b.piece(
                b.addr + mapped_size,
                b.size - mapped_size,
                false,
                id,
                b.next,
            ));
            if b.next != NIL {
                self.block_mut(b.next).prev = rest;
            }
            self.block_mut(id).next = rest;
            self.pool_mut(b.owner, b.pool())
                .unmapped
                .insert((stream, b.addr + mapped_size), rest);
            self.block_mut(id).size = mapped_size;
        }
        let prev = self.block(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.block(id).next;
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        self.total_allocated += mapped_size;
        self.stats.reserved_bytes.increase(b.pool(), mapped_size);
        self.stats.num_device_alloc += 1;
        Ok(true)
    }

    /// `unmap_block`: unmaps every page lying wholly inside a free expandable block.
    pub(super) fn unmap_block(
        &mut self,
        device: &mut dyn Device,
        id: u32,
    ) -> Result<(), DeviceError> {
        let b = *self.block(id);
        let es = self.expandable_mut(b.segment);
        let page = es.page_bytes;
        let base = es.range.addr.0;
        let begin = (b.addr - base).div_ceil(page);
        let end = (b.addr + b.size - base) / page;
        if begin >= end {
            return Ok(());
        }
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        es.unmap(vm, begin, end)?;
        self.mapped_expandables -= u64::from(es.mapped_bytes == 0);
        let unmapped_addr = base + begin * page;
        let unmapped_size = (end - begin) * page;
        self.pools[b.owner as usize]
            .get_mut(b.pool())
            .blocks
            .remove(&mut self.blocks, id);
        let before_size = unmapped_addr - b.addr;
        if before_size > 0 {
            let before = self.insert_block(b.piece(b.addr, before_size, true, b.prev, id));
            if b.prev != NIL {
                self.block_mut(b.prev).next = before;
            }
            self.block_mut(id).prev = before;
            self.insert_into_blocks(before);
        }
        let after_size = b.size - (before_size + unmapped_size);
        if after_size > 0 {
            let after = self.insert_block(b.piece(
                unmapped_addr + unmapped_size,
                after_size,
                true,
                id,
                b.next,
            ));
            if b.next != NIL {
                self.block_mut(b.next).prev = after;
            }
            self.block_mut(id).next = after;
            self.insert_into_blocks(after);
        }
        {
            let blk = self.block_mut(id);
            blk.addr = unmapped_addr;
            blk.size = unmapped_size;
            blk.set_mapped(false);
        }
        let prev = self.block(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.block(id).next;
        self.try_merge_blocks(id, next);
        let blk = self.block(id);
        let key = (self.stream_id(blk.stream).0, blk.addr);
        self.pool_mut(b.owner, b.pool()).unmapped.insert(key, id);
        self.total_allocated -= unmapped_size;
        self.count_pool_segment(b.owner, false, true);
        self.stats.reserved_bytes.decrease(b.pool(), unmapped_size);
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// `release_expandable_segment`: drops a segment whose every page is unmapped.
    pub(super) fn release_expandable_segment(
        &mut self,
        device: &mut dyn Device,
        id: u32,
    ) -> Result<(), DeviceError> {
        let b = *self.block(id);
        let es = self.expandables[b.segment as usize]
            .take()
            .expect("dead expandable segment");
        self.mapped_expandables -= u64::from(es.mapped_bytes > 0);
        assert!(
            !b.mapped() && b.size == es.range.size_bytes,
            "block disagrees with segment"
        );
        let stream = self.stream_id(b.stream).0;
        self.pool_mut(b.owner, b.pool())
            .unmapped
            .remove(&(stream, b.addr));
        self.delete_block(id);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        vm.release_range(es.range)
    }
}

impl ExpandableSegment {
    /// Whether page `p` is mapped.
    pub(super) fn is_mapped(&self, p: u64) -> bool {
        self.handles.get(p as usize).is_some_and(Option::is_some)
    }

    /// Pages up to the highest mapped one: every later page is unmapped.
    pub(super) fn handle_count(&self) -> u64 {
        self.handles.len() as u64
    }

    /// Mapped pages.
    pub(super) fn mapped_page_count(&self) -> u64 {
        self.handles.iter().flatten().count() as u64
    }

    /// `ExpandableSegment::map`: creates one physical chunk per page of `begin..end`, one
    /// by one; if the device runs out of memory, releases the chunks this call created
    /// and returns `false`. Then maps them all in one call.
    pub(super) fn map(
        &mut self,
        vm: &mut dyn VirtualMemory,
        begin: u64,
        end: u64,
    ) -> Result<bool, DeviceError> {
        // Reserved as the pages come: a request of an exabyte must not reserve room for
        // 2^35 handles before the device refuses the first few thousand.
        let mut created = Vec::with_capacity((end - begin).min(1 << 10) as usize);
        for p in begin..end {
            assert!(!self.is_mapped(p), "expandable segment page mapped twice");
            match vm.create_physical(self.page_bytes) {
                Ok(chunk) => created.push(chunk),
                Err(DeviceError::OutOfMemory { .. }) => {
                    for chunk in created {
                        vm.release_physical(chunk)?;
                    }
                    return Ok(false);
                }
                Err(e) => {
                    // A driver failure stops the run; what this call created goes back
                    // first, so the device holds what the policy counts.
                    for chunk in created {
                        vm.release_physical(chunk)?;
                    }
                    return Err(e);
                }
            }
        }
        if let Err(e) = vm.map(&self.range, begin * self.page_bytes, &created) {
            for chunk in created {
                vm.release_physical(chunk)?;
            }
            return Err(e);
        }
        if self.handles.len() < end as usize {
            self.handles.resize_with(end as usize, || None);
        }
        for (slot, chunk) in self.handles[begin as usize..end as usize]
            .iter_mut()
            .zip(created)
        {
            *slot = Some(chunk);
        }
        self.mapped_bytes += (end - begin) * self.page_bytes;
        Ok(true)
    }

    /// `ExpandableSegment::unmapHandles`: unmaps pages `begin..end` and releases their
    /// chunks. (PyTorch unmaps and releases page by page; the device sees one unmap of
    /// the span, then the releases. No figure depends on that order.)
    fn unmap(
        &mut self,
        vm: &mut dyn VirtualMemory,
        begin: u64,
        end: u64,
    ) -> Result<(), DeviceError> {
        let chunks: Vec<PhysicalChunk> = self.handles[begin as usize..end as usize]
            .iter_mut()
            .map(|h| h.take().expect("unmapping an unmapped expandable page"))
            .collect();
        vm.unmap(&self.range, begin * self.page_bytes, &chunks)?;
        for chunk in chunks {
            vm.release_physical(chunk)?;
        }
        while self.handles.last().is_some_and(Option::is_none) {
            self.handles.pop();
        }
        self.mapped_bytes -= (end - begin) * self.page_bytes;
        Ok(())
    }
}
