//! Taking over PyTorch's state at the first entry of a trace that starts mid-run
//! ([`Policy::adopt`]): segments and expandable segments' mapped runs with their live
//! blocks, built directly into the pools, without a malloc.
//!
//! What the state does not say is decided as PyTorch's rules would have: a segment's
//! pool from its size when unknown (2 MiB: small; an expandable run that is not made of
//! large pages: small); the size of a block whose requested
//! size alone is known, as `round_size` of the request, or the whole room up to the
//! next block where PyTorch would not have split it off (a remainder too small to
//! split, or an oversize request, which is never split); an expandable segment's
//! address range from its lowest mapped run (one range per stream and pool, as large
//! as PyTorch reserves it).
//!
//! The device adopts each segment and range ([`Device::adopt_segment`],
//! [`crate::VirtualMemory::adopt_range`]) and says where: a simulated device at the
//! recorded address, a real GPU wherever its driver puts it; the blocks are built at
//! that address, their offsets in the segment as recorded.
//!
//! Private pools (CUDA graphs' pools, MemPools) are created first, with the uses,
//! flags and allocation under way the state gives them, and their segments built into
//! their own pool pairs (an expandable segment's range per stream, pool pair and
//! small/large pool, as PyTorch keeps one per pool); a pool's `cudaMalloc_count` is its
//! segments (for expandable runs, one per mapped run: the maps and unmaps that made
//! them are not in the state). A block of a `no_split` MemPool whose size is not known
//! takes the whole room up to the next block, as that pool never splits. A block
//! waiting for other streams in a pool being allocated to (a capture under way) whose
//! free completes while a capture is still under way was freed at once: PyTorch looks
//! at no event during a capture, so a free it completes then had no stream to wait for
//! and its request was the entry just before the trace (a capture defers only frees
//! that wait). Its free is not deferred.

use super::*;
use crate::policy::{AdoptBlock, AdoptError, AdoptPool, AdoptPrivatePool, AdoptSegment};

/// One piece of a segment or range while it is built: a gap or a live block.
struct Piece<'a> {
    addr: u64,
    size: u64,
    mapped: bool,
    live: Option<(usize, &'a AdoptBlock)>,
}

/// Moves `pieces` laid out from the recorded address `from` to the address `to` the
/// device adopted their segment or range at: the same on a simulated device, which
/// places memory where the recording says; where the driver put it on a real GPU.
fn move_pieces(pieces: &mut [Piece<'_>], from: u64, to: u64) {
    if from != to {
        for p in pieces {
            p.addr = p.addr - from + to;
        }
    }
}

impl CachingPolicy {
    /// See [`Policy::adopt`] and the module docs.
    pub(super) fn adopt_state(
        &mut self,
        device: &mut dyn Device,
        segments: &[AdoptSegment],
        pools: &[AdoptPrivatePool],
    ) -> Result<Vec<Allocation>, AdoptError> {
        if self.blocks.iter().next().is_some() || !self.private.is_empty() {
            return Err(AdoptError::Invalid(
                "the policy already holds memory; a state is adopted before the first request"
                    .into(),
            ));
        }
        // Adopted blocks whose free is pending are active but not allocated.
        self.keep_active_stats();
        let invalid = AdoptError::Invalid;
        self.adopt_pools(pools)?;
        // The index of each block in the flattened input, for the result's order.
        let mut firsts = Vec::with_capacity(segments.len());
        let mut n = 0usize;
        for s in segments {
            firsts.push(n);
            n += s.blocks.len();
        }
        let mut result: Vec<Option<Allocation>> = (0..n).map(|_| None).collect();

        for (i, seg) in segments.iter().enumerate().filter(|(_, s)| !s.expandable) {
            let pool = self.pool_of(seg);
            let owner = self.owner_of(seg)?;
            let (addr, size) = (seg.addr.0, seg.size_bytes);
            if size == 0 || size % MIN_BLOCK_BYTES != 0 {
                return Err(invalid(format!(
                    "segment at {} has {size} bytes, not a positive multiple of 512",
                    seg.addr
                )));
            }
            let mut pieces = self.pieces(addr, size, &seg.blocks, pool, owner, false, firsts[i])?;
            let segment = device.adopt_segment(seg.addr, size)?;
            // A real GPU puts the segment where its driver does: the state is built there.
            move_pieces(&mut pieces, addr, segment.addr.0);
            let slot = self.segments.insert(segment);
            self.total_allocated += size;
            self.count_pool_segment(owner, true, false);
            self.stats.segment.increase(pool, 1);
            self.stats.reserved_bytes.increase(pool, size);
            if size >= self.config.max_split_size_bytes {
                self.stats.oversize_segments.increase(1);
            }
            self.build(pieces, seg.stream, pool, owner, slot, false, &mut result);
        }

        // Expandable runs: one address range per (stream, pool pair, pool), from the
        // lowest run.
        let mut groups: BTreeMap<(u64, u32, bool), Vec<usize>> = BTreeMap::new();
        for (i, seg) in segments.iter().enumerate().filter(|(_, s)| s.expandable) {
            let small = self.pool_of(seg) == PoolKind::Small;
            let owner = self.owner_of(seg)?;
            groups
                .entry((seg.stream.0, owner, small))
                .or_default()
                .push(i);
        }
        let stats = device.stats();
        let total = if stats.total_bytes > 0 {
            stats.total_bytes
        } else {
            stats.capacity_bytes
        };
        let large_page = self.config.large_segment_size_bytes;
        let page_of = |small: bool| {
            if small {
                SMALL_BUFFER_BYTES
            } else {
                large_page
            }
        };
        // Runs past one range from the lowest start another range: runs of several
        // pools' segments whose pool the state did not say, adopted into one.
        let mut ranges: Vec<((u64, u32, bool), Vec<usize>)> = Vec::new();
        for (key, mut runs) in groups {
            runs.sort_by_key(|&i| segments[i].addr);
            let range_size = expandable_range_bytes(total, page_of(key.2));
            let mut first = 0;
            for k in 1..=runs.len() {
                let past = runs.get(k).is_some_and(|&i| {
                    let (run, base) = (&segments[i], segments[runs[first]].addr.0);
                    run.addr.0.saturating_add(run.size_bytes) > base.saturating_add(range_size)
                });
                if k == runs.len() || past {
                    ranges.push((key, runs[first..k].to_vec()));
                    first = k;
                }
            }
        }
        for ((stream, owner, small), runs) in ranges {
            let pool = if small {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let page = page_of(small);
            let range_size = expandable_range_bytes(total, page);
            let base = segments[runs[0]].addr.0;
            let mut pieces = Vec::new();
            let mut cursor = base;
            let mut mapped = Vec::new();
            for &i in &runs {
                let run = &segments[i];
                let (addr, size) = (run.addr.0, run.size_bytes);
                if (addr - base) % page != 0 || size % page != 0 || size == 0 {
                    return Err(invalid(format!(
                        "the expandable segment's mapped run at {} ({size} bytes) is not made of \
                         whole {page}-byte pages from {base:#x}",
                        run.addr
                    )));
                }
                // A run larger than one range (the device's total memory and an
                // eighth) cannot be held on this device: it is too small for the state.
                if addr >= cursor && size > range_size {
                    return Err(AdoptError::Device(DeviceError::OutOfMemory {
                        requested_bytes: size,
                    }));
                }
                if addr < cursor || addr + size > base + range_size {
                    return Err(invalid(format!(
                        "the expandable segment's mapped run at {} does not fit one address range \
                         of {range_size} bytes from {base:#x}",
                        run.addr
                    )));
                }
                if addr > cursor {
                    pieces.push(Piece {
                        addr: cursor,
                        size: addr - cursor,
                        mapped: false,
                        live: None,
                    });
                }
                pieces.extend(self.pieces(
                    addr,
                    size,
                    &run.blocks,
                    pool,
                    owner,
                    true,
                    firsts[i],
                )?);
                mapped.push(((addr - base) / page, (addr + size - base) / page));
                cursor = addr + size;
            }
            if cursor < base + range_size {
                pieces.push(Piece {
                    addr: cursor,
                    size: base + range_size - cursor,
                    mapped: false,
                    live: None,
                });
            }
            let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
                what: "virtual memory management (needed by expandable segments)",
            })?;
            let range = vm.adopt_range(DeviceAddr(base), range_size)?;
            move_pieces(&mut pieces, base, range.addr.0);
            let mut es = ExpandableSegment {
                range,
                page_bytes: page,
                handles: Vec::new(),
                mapped_bytes: 0,
            };
            for (begin, end) in mapped {
                self.count_pool_segment(owner, true, true);
                if !es.map(vm, begin, end)? {
                    return Err(AdoptError::Device(DeviceError::OutOfMemory {
                        requested_bytes: (end - begin) * page,
                    }));
                }
            }
            let mapped_bytes = es.mapped_bytes;
            self.mapped_expandables += u64::from(mapped_bytes > 0);
            self.expandables.push(Some(es));
            let slot = (self.expandables.len() - 1) as u32;
            self.total_allocated += mapped_bytes;
            self.stats.reserved_bytes.increase(pool, mapped_bytes);
            self.build(
                pieces,
                StreamId(stream),
                pool,
                owner,
                slot,
                true,
                &mut result,
            );
        }
        Ok(result
            .into_iter()
            .map(|a| a.expect("every block was built"))
            .collect())
    }

    /// Creates the private pools of a state (see [`Policy::adopt`]), in the order
    /// given: slots, uses, flags and allocations under way.
    fn adopt_pools(&mut self, pools: &[AdoptPrivatePool]) -> Result<(), AdoptError> {
        for p in pools {
            if p.id.is_default() {
                return Err(AdoptError::Invalid(
                    "the pool (0, 0) is the default pools, not a private pool".into(),
                ));
            }
            if self.private.contains_key(&p.id) {
                return Err(AdoptError::Invalid(format!(
                    "the private pool {} is listed twice",
                    p.id
                )));
            }
            if p.routing.is_some() && p.uses == 0 {
                return Err(AdoptError::Invalid(format!(
                    "allocation to the private pool {} is under way, but the pool has no use",
                    p.id
                )));
            }
            let slot = self.pools.len() as u32;
            self.pools.push(PoolPair {
                id: p.id,
                ..PoolPair::default()
            });
            self.private.insert(
                p.id,
                PrivatePool {
                    slot,
                    use_count: p.uses,
                    cuda_malloc_count: 0,
                    had_expandable: false,
                },
            );
            if p.uses == 0 {
                self.freeable.insert(p.id);
            }
            if p.use_on_oom {
                self.use_on_oom.insert(p.id);
            }
            if p.no_split {
                self.no_split.insert(p.id);
            }
            if let Some(streams) = &p.routing {
                self.captures.push((p.id, streams.clone()));
            }
        }
        Ok(())
    }

    /// The pool pair a segment belongs to: 0 for the default pools, else its private
    /// pool's slot.
    fn owner_of(&self, seg: &AdoptSegment) -> Result<u32, AdoptError> {
        if seg.pool_id.is_default() {
            return Ok(0);
        }
        self.private
            .get(&seg.pool_id)
            .map(|p| p.slot)
            .ok_or_else(|| {
                AdoptError::Invalid(format!(
                    "the segment at {} belongs to the private pool {}, which the state does not list",
                    seg.addr, seg.pool_id
                ))
            })
    }

    /// The pool a segment belongs to: as given, else small for a 2 MiB segment.
    fn pool_of(&self, seg: &AdoptSegment) -> PoolKind {
        match seg.pool {
            Some(AdoptPool::Small) => PoolKind::Small,
            Some(AdoptPool::Large) => PoolKind::Large,
            None if !seg.expandable && seg.size_bytes == SMALL_BUFFER_BYTES => PoolKind::Small,
            // Large pages are larger: a run not made of them is the small pool's.
            None if seg.expandable
                && seg.size_bytes % self.config.large_segment_size_bytes != 0 =>
            {
                PoolKind::Small
            }
            None => PoolKind::Large,
        }
    }

    /// `[addr, addr + size)` cut into free gaps and live blocks (sizes decided).
    #[allow(clippy::too_many_arguments)]
    fn pieces<'a>(
        &self,
        addr: u64,
        size: u64,
        blocks: &'a [AdoptBlock],
        pool: PoolKind,
        owner: u32,
        expandable: bool,
        first: usize,
    ) -> Result<Vec<Piece<'a>>, AdoptError> {
        let end = addr + size;
        let mut out = Vec::with_capacity(2 * blocks.len() + 1);
        let mut cursor = addr;
        for (k, b) in blocks.iter().enumerate() {
            let at = b.addr.0;
            if at < cursor || at >= end {
                return Err(AdoptError::Invalid(format!(
                    "the block at {} lies outside its segment {addr:#x}..{end:#x} or overlaps the one before it",
                    b.addr
                )));
            }
            let room = blocks.get(k + 1).map_or(end, |n| n.addr.0.clamp(at, end)) - at;
            let block_size = match b.size_bytes {
                Some(s) => s,
                None => self.decided_size(b, room, pool, owner, expandable)?,
            };
            if block_size == 0 || block_size % MIN_BLOCK_BYTES != 0 || block_size > room {
                return Err(AdoptError::Invalid(format!(
                    "the block at {} of {block_size} bytes does not fit the {room} bytes up to the next block or the segment's end",
                    b.addr
                )));
            }
            if b.requested_bytes > block_size {
                return Err(AdoptError::Invalid(format!(
                    "the block at {} holds {block_size} bytes but {} were requested",
                    b.addr, b.requested_bytes
                )));
            }
            if at > cursor {
                out.push(Piece {
                    addr: cursor,
                    size: at - cursor,
                    mapped: true,
                    live: None,
                });
            }
            out.push(Piece {
                addr: at,
                size: block_size,
                mapped: true,
                live: Some((first + k, b)),
            });
            cursor = at + block_size;
        }
        if cursor < end {
            out.push(Piece {
                addr: cursor,
                size: end - cursor,
                mapped: true,
                live: None,
            });
        }
        Ok(out)
    }

    /// The size PyTorch gave a block of which only the request is known (module docs).
    fn decided_size(
        &self,
        b: &AdoptBlock,
        room: u64,
        pool: PoolKind,
        owner: u32,
        expandable: bool,
    ) -> Result<u64, AdoptError> {
        let rounded = self.round_size(b.requested_bytes.max(1));
        if rounded > room {
            return Err(AdoptError::Invalid(format!(
                "the block at {} was asked for {} bytes ({rounded} rounded), more than the {room} bytes up to the next block or the segment's end",
                b.addr, b.requested_bytes
            )));
        }
        let remaining = room - rounded;
        let split = if owner != 0 && self.no_split.contains(&self.pools[owner as usize].id) {
            false
        } else if pool == PoolKind::Small || expandable {
            remaining >= MIN_BLOCK_BYTES
        } else {
            rounded < self.config.max_split_size_bytes && remaining > SMALL_SIZE_BYTES
        };
        Ok(if split { rounded } else { room })
    }

    /// Creates the blocks of one segment or range from its pieces, linked in order,
    /// with their statistics; live blocks' allocations go to `result`.
    #[allow(clippy::too_many_arguments)]
    fn build(
        &mut self,
        pieces: Vec<Piece<'_>>,
        stream: StreamId,
        pool: PoolKind,
        owner: u32,
        segment: u32,
        expandable: bool,
        result: &mut [Option<Allocation>],
    ) {
        let max_split = self.config.max_split_size_bytes;
        let stream_slot = self.stream_slot(stream);
        let split = pieces.len() > 1;
        let release = if expandable {
            self.expandable(segment).page_bytes
        } else {
            pieces.iter().map(|p| p.size).sum()
        };
        self.pool_mut(owner, pool).got_segment(release);
        let mut prev = NIL;
        let mut ids = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let mut block = Block::whole(
                p.addr,
                p.size,
                stream_slot,
                pool,
                owner,
                segment,
                expandable,
                p.mapped,
            );
            block.prev = prev;
            if let Some((_, b)) = p.live {
                block.state = State::Allocated;
                block.requested = b.requested_bytes;
                block.stamp = self.next_serial;
                self.next_serial += 1;
            }
            let id = self.insert_block(block);
            if prev != NIL {
                self.block_mut(prev).next = id;
            }
            prev = id;
            ids.push(id);
        }
        for (p, &id) in pieces.iter().zip(&ids) {
            match p.live {
                None if !p.mapped => {
                    self.pool_mut(owner, pool)
                        .unmapped
                        .insert((stream.0, p.addr), id);
                }
                None => {
                    self.insert_into_blocks(id);
                    if split && !expandable {
                        self.stats.inactive_split.increase(pool, 1);
                        self.stats.inactive_split_bytes.increase(pool, p.size);
                    }
                }
                Some((index, b)) => {
                    let s = &mut self.stats;
                    s.allocation.increase(pool, 1);
                    s.allocated_bytes.increase(pool, p.size);
                    s.active.increase(pool, 1);
                    s.active_bytes.increase(pool, p.size);
                    s.requested_bytes.increase(pool, b.requested_bytes);
                    if p.size >= max_split {
                        s.oversize_allocations.increase(1);
                    }
                    if b.pending_free {
                        self.mark_free_requested(id);
                        self.pending.insert(id);
                        // In a pool being allocated to: see the module docs.
                        if owner != 0
                            && self
                                .captures
                                .iter()
                                .any(|(c, _)| self.private[c].slot == owner)
                        {
                            self.adopted_frees.insert(self.block(id).stamp);
                        }
                    }
                    let serial = self.block(id).stamp;
                    result[index] = Some(Allocation {
                        addr: DeviceAddr(p.addr),
                        requested_bytes: b.requested_bytes,
                        block_bytes: p.size,
                        stream,
                        block: id,
                        serial,
                    });
                }
            }
        }
    }
}
