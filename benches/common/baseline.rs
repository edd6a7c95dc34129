//! The benchmark baseline: a minimal caching allocator written with the standard
//! library only, as one would write it first. Best fit from one `BTreeMap` of free
//! blocks per pool keyed by (stream, size, address), blocks in a vector with
//! neighbour links, split on allocation, merge on free, segments from a bump pointer
//! (2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB, else rounded to 2 MiB),
//! requests rounded to 512 bytes, live allocations in a vector indexed by trace id
//! (the generated traces number their allocations 0, 1, 2, ...; other ids go to a
//! `HashMap`), peaks of allocated and reserved bytes after every event.
//!
//! It is what allocsim's caching policy is measured against (`docs/performance.md`):
//! the same kind of allocator, without PyTorch's other rules (oversize blocks,
//! retries, statistics, expandable segments, pools, delayed frees), without the
//! simulated device's page model and without the engine's observer and checks.

use std::collections::{BTreeMap, HashMap};

use workloads::{Event, Trace};

const NIL: u32 = u32::MAX;
const SMALL: u64 = 1 << 20;

#[derive(Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    stream: u64,
    small: bool,
    free: bool,
    prev: u32,
    next: u32,
}

/// Peaks after a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BaselineResult {
    /// Highest allocated bytes.
    pub allocated_peak: u64,
    /// Highest reserved bytes.
    pub reserved_peak: u64,
    /// Events replayed.
    pub events: u64,
}

#[derive(Default)]
struct Baseline {
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    small: BTreeMap<(u64, u64, u64), u32>,
    large: BTreeMap<(u64, u64, u64), u32>,
    next_addr: u64,
    allocated: u64,
    reserved: u64,
}

impl Baseline {
    fn new_block(&mut self, b: Block) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn pool(&mut self, small: bool) -> &mut BTreeMap<(u64, u64, u64), u32> {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn malloc(&mut self, size: u64, stream: u64) -> u32 {
        let size = size.div_ceil(512).max(1) * 512;
        let small = size <= SMALL;
        let found = self
            .pool(small)
            .range((stream, size, 0)..)
            .next()
            .filter(|(k, _)| k.0 == stream)
            .map(|(k, &id)| (*k, id));
        let id = match found {
            Some((key, id)) => {
                self.pool(small).remove(&key);
                id
            }
            None => {
                let seg = if small {
                    2 << 20
                } else if size < 10 << 20 {
                    20 << 20
                } else {
                    size.div_ceil(2 << 20) * (2 << 20)
                };
                let addr = self.next_addr;
                self.next_addr += seg;
                self.reserved += seg;
                self.new_block(Block {
                    addr,
                    size: seg,
                    stream,
                    small,
                    free: true,
                    prev: NIL,
                    next: NIL,
                })
            }
        };
        let b = self.blocks[id as usize];
        let rest = b.size - size;
        let split = if small { rest >= 512 } else { rest > SMALL };
        if split {
            let rest_id = self.new_block(Block {
                addr: b.addr + size,
                size: rest,
                stream,
                small,
                free: true,
                prev: id,
                next: b.next,
            });
            if b.next != NIL {
                self.blocks[b.next as usize].prev = rest_id;
            }
            let blk = &mut self.blocks[id as usize];
            blk.next = rest_id;
            blk.size = size;
            self.pool(small)
                .insert((stream, rest, b.addr + size), rest_id);
        }
        let blk = &mut self.blocks[id as usize];
        blk.free = false;
        self.allocated += blk.size;
        id
    }

    fn free(&mut self, id: u32) {
        let mut b = self.blocks[id as usize];
        self.allocated -= b.size;
        for neighbour in [b.prev, b.next] {
            if neighbour == NIL || !self.blocks[neighbour as usize].free {
                continue;
            }
            let n = self.blocks[neighbour as usize];
            self.pool(b.small).remove(&(n.stream, n.size, n.addr));
            if neighbour == b.prev {
                b.addr = n.addr;
                b.prev = n.prev;
                if n.prev != NIL {
                    self.blocks[n.prev as usize].next = id;
                }
            } else {
                b.next = n.next;
                if n.next != NIL {
                    self.blocks[n.next as usize].prev = id;
                }
            }
            b.size += n.size;
            self.free_slots.push(neighbour);
        }
        b.free = true;
        self.blocks[id as usize] = b;
        self.pool(b.small).insert((b.stream, b.size, b.addr), id);
    }
}

/// Replays `trace` (allocations and frees; other events are counted and ignored).
pub fn replay_baseline(trace: &Trace) -> BaselineResult {
    let mut a = Baseline::default();
    let dense_limit = (trace.events.len() as u64).saturating_mul(2);
    let mut dense: Vec<u32> = Vec::new();
    let mut sparse: HashMap<u64, u32> = HashMap::new();
    let mut result = BaselineResult::default();
    for event in &trace.events {
        match *event {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => {
                let block = a.malloc(size_bytes, stream);
                if id.0 < dense_limit {
                    let i = id.0 as usize;
                    if dense.len() <= i {
                        dense.resize(i + 1, NIL);
                    }
                    dense[i] = block;
                } else {
                    sparse.insert(id.0, block);
                }
            }
            Event::Free { id } => {
                let block = if id.0 < dense_limit {
                    dense
                        .get_mut(id.0 as usize)
                        .map(|b| std::mem::replace(b, NIL))
                } else {
                    sparse.remove(&id.0)
                };
                if let Some(block) = block.filter(|&b| b != NIL) {
                    a.free(block);
                }
            }
            _ => {}
        }
        result.allocated_peak = result.allocated_peak.max(a.allocated);
        result.reserved_peak = result.reserved_peak.max(a.reserved);
        result.events += 1;
    }
    result
}
