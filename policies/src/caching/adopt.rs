//! Taking over PyTorch's state at the first entry of a trace that starts mid-run
//! ([`Policy::adopt`]): segments and expandable segments' mapped runs with their live
//! blocks, built directly into the pools, without a malloc.
//!
//! What the state does not say is decided as PyTorch's rules would have: a segment's
//! pool from its size when unknown (2 MiB: small); the size of a block whose requested
//! size alone is known, as `round_size` of the request, or the whole room up to the
//! next block where PyTorch would not have split it off (a remainder too small to
//! split, or an oversize request, which is never split); an expandable segment's
//! address range from its lowest mapped run (one range per stream and pool, as large
//! as PyTorch reserves it). Everything is adopted into the default pools: a state with
//! private pools' segments is refused before it gets here.

use super::*;
use crate::policy::{AdoptBlock, AdoptError, AdoptPool, AdoptSegment};

/// One piece of a segment or range while it is built: a gap or a live block.
struct Piece<'a> {
    addr: u64,
    size: u64,
    mapped: bool,
    live: Option<(usize, &'a AdoptBlock)>,
}

impl CachingPolicy {
    /// See [`Policy::adopt`] and the module docs.
    pub(super) fn adopt_state(
        &mut self,
        device: &mut dyn Device,
        segments: &[AdoptSegment],
    ) -> Result<Vec<Allocation>, AdoptError> {
        if self.blocks.iter().next().is_some() {
            return Err(AdoptError::Invalid(
                "the policy already holds memory; a state is adopted before the first request"
                    .into(),
            ));
        }
        // Adopted blocks whose free is pending are active but not allocated.
        self.keep_active_stats();
        let invalid = AdoptError::Invalid;
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
            let (addr, size) = (seg.addr.0, seg.size_bytes);
            if size == 0 || size % MIN_BLOCK_BYTES != 0 {
                return Err(invalid(format!(
                    "segment at {} has {size} bytes, not a positive multiple of 512",
                    seg.addr
                )));
            }
            let pieces = self.pieces(addr, size, &seg.blocks, pool, false, firsts[i])?;
            let segment = device.adopt_segment(seg.addr, size)?;
            let slot = self.segments.insert(segment);
            self.total_allocated += size;
            self.stats.segment.increase(pool, 1);
            self.stats.reserved_bytes.increase(pool, size);
            if size >= self.config.max_split_size_bytes {
                self.stats.oversize_segments.increase(1);
            }
            self.build(pieces, seg.stream, pool, slot, false, &mut result);
        }

        // Expandable runs: one address range per (stream, pool), from the lowest run.
        let mut groups: BTreeMap<(u64, bool), Vec<usize>> = BTreeMap::new();
        for (i, seg) in segments.iter().enumerate().filter(|(_, s)| s.expandable) {
            let small = self.pool_of(seg) == PoolKind::Small;
            groups.entry((seg.stream.0, small)).or_default().push(i);
        }
        for ((stream, small), mut runs) in groups {
            runs.sort_by_key(|&i| segments[i].addr);
            let pool = if small {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let page = match pool {
                PoolKind::Small => SMALL_BUFFER_BYTES,
                PoolKind::Large => self.config.large_segment_size_bytes,
            };
            let stats = device.stats();
            let total = if stats.total_bytes > 0 {
                stats.total_bytes
            } else {
                stats.capacity_bytes
            };
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
                pieces.extend(self.pieces(addr, size, &run.blocks, pool, true, firsts[i])?);
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
            let mut es = ExpandableSegment {
                range,
                page_bytes: page,
                handles: Vec::new(),
                mapped_bytes: 0,
            };
            for (begin, end) in mapped {
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
            self.build(pieces, StreamId(stream), pool, slot, true, &mut result);
        }
        Ok(result
            .into_iter()
            .map(|a| a.expect("every block was built"))
            .collect())
    }

    /// The pool a segment belongs to: as given, else small for a 2 MiB segment.
    fn pool_of(&self, seg: &AdoptSegment) -> PoolKind {
        match seg.pool {
            Some(AdoptPool::Small) => PoolKind::Small,
            Some(AdoptPool::Large) => PoolKind::Large,
            None if !seg.expandable && seg.size_bytes == SMALL_BUFFER_BYTES => PoolKind::Small,
            None => PoolKind::Large,
        }
    }

    /// `[addr, addr + size)` cut into free gaps and live blocks (sizes decided).
    fn pieces<'a>(
        &self,
        addr: u64,
        size: u64,
        blocks: &'a [AdoptBlock],
        pool: PoolKind,
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
                None => self.decided_size(b, room, pool, expandable)?,
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
        let split = if pool == PoolKind::Small || expandable {
            remaining >= MIN_BLOCK_BYTES
        } else {
            rounded < self.config.max_split_size_bytes && remaining > SMALL_SIZE_BYTES
        };
        Ok(if split { rounded } else { room })
    }

    /// Creates the blocks of one segment or range from its pieces, linked in order,
    /// with their statistics; live blocks' allocations go to `result`.
    fn build(
        &mut self,
        pieces: Vec<Piece<'_>>,
        stream: StreamId,
        pool: PoolKind,
        segment: u32,
        expandable: bool,
        result: &mut [Option<Allocation>],
    ) {
        let max_split = self.config.max_split_size_bytes;
        let stream_slot = self.stream_slot(stream);
        let split = pieces.len() > 1;
        let mut prev = NIL;
        let mut ids = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let mut block = Block::whole(
                p.addr,
                p.size,
                stream_slot,
                pool,
                0,
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
                    self.pool_mut(0, pool)
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
