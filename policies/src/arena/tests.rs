use super::*;
use crate::registry::PolicyConfig;
use crate::testing::{check_against_device, NullDevice, TestDevice};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn on(stream: u64, size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(stream),
    }
}

/// 1 MiB superblocks, 4 MiB chunks, threshold 512 KiB.
fn small() -> ArenaPolicy {
    ArenaPolicy::new(ArenaOptions {
        superblock_bytes: MIB,
        growth_bytes: 4 * MIB,
        threshold_bytes: 512 * KIB,
    })
    .unwrap()
}

/// (pool, stream, offset from the first chunk, size) of every snapshot entry.
fn entries(p: &ArenaPolicy, base: u64) -> Vec<(&'static str, u64, u64, u64)> {
    p.snapshot()
        .iter()
        .map(|s| (s.pool, s.stream.0, s.addr.0 - base, s.size_bytes))
        .collect()
}

/// Sizes round up to 256 bytes; a small request takes a superblock at the front of a growth-sized chunk.
#[test]
fn rounding_and_first_superblock() {
    let mut d = TestDevice::unbounded();
    let mut p = ArenaPolicy::default();
    let a = p.allocate(&mut d, on(0, 1)).unwrap();
    let b = p.allocate(&mut d, on(0, 257)).unwrap();
    assert_eq!((a.block_bytes, b.block_bytes), (256, 512));
    let base = d.live_segments()[0].0;
    assert_eq!(d.live_segments(), vec![(base, 1 << 30)]);
    assert_eq!((a.addr.0, b.addr.0), (base, base + 256));
    assert_eq!(p.stats().allocated_bytes, 768);
    assert_eq!(
        entries(&p, base),
        vec![
            ("arena-superblock", 0, 0, MIB),
            ("arena-global", 0, MIB, (1 << 30) - MIB)
        ]
    );
    check_against_device(&p, &d);
}

/// Requests above the threshold go to the global arena, after the superblocks already taken.
#[test]
fn large_requests_go_to_the_global_arena() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let s = p.allocate(&mut d, on(0, 512 * KIB)).unwrap();
    let l = p.allocate(&mut d, on(0, 512 * KIB + 1)).unwrap();
    let base = d.live_segments()[0].0;
    assert_eq!(s.addr.0, base, "at the threshold: stream arena");
    assert_eq!(
        (l.addr.0, l.block_bytes),
        (base + MIB, 512 * KIB + 256),
        "above it: global arena"
    );
    check_against_device(&p, &d);
}

/// A chunk is growth_bytes, or the need rounded up to 2 MiB when that is larger.
#[test]
fn chunk_sizes() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let _a = p.allocate(&mut d, on(0, 5 * MIB + 1)).unwrap();
    let _b = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    let sizes: Vec<u64> = d.live_segments().iter().map(|s| s.1).collect();
    assert_eq!(sizes, vec![6 * MIB, 4 * MIB]);
    assert_eq!(p.chunk_bytes_for(MIB), 4 * MIB);
    check_against_device(&p, &d);
}

/// Each stream gets its own superblocks; an emptied superblock stays with its stream.
#[test]
fn superblocks_per_stream_and_cached() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let a = p.allocate(&mut d, on(1, 1000)).unwrap();
    let b = p.allocate(&mut d, on(2, 1000)).unwrap();
    let base = d.live_segments()[0].0;
    assert_eq!((a.addr.0 - base, b.addr.0 - base), (0, MIB));
    p.free(&mut d, &a).unwrap();
    assert_eq!(p.stats().reserved_bytes, 4 * MIB);
    assert_eq!(
        entries(&p, base),
        vec![
            ("arena-superblock", 1, 0, MIB),
            ("arena-superblock", 2, MIB, MIB),
            ("arena-global", 0, 2 * MIB, 2 * MIB)
        ]
    );
    let c = p.allocate(&mut d, on(3, 1000)).unwrap();
    assert_eq!(
        c.addr.0 - base,
        2 * MIB,
        "another stream does not take stream 1's empty superblock"
    );
    let e = p.allocate(&mut d, on(1, 1000)).unwrap();
    assert_eq!(e.addr.0 - base, 0, "stream 1 reuses it");
    check_against_device(&p, &d);
}

/// Freed neighbours inside a superblock coalesce and first fit reuses the merged range.
#[test]
fn coalescing_inside_a_superblock() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let a = p.allocate(&mut d, on(0, 256)).unwrap();
    let b = p.allocate(&mut d, on(0, 1000)).unwrap();
    let _c = p.allocate(&mut d, on(0, 256)).unwrap();
    let sb = a.addr.0;
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &b).unwrap();
    let s = &p.snapshot()[0];
    let layout: Vec<_> = s
        .blocks
        .iter()
        .map(|b| (b.addr.0 - sb, b.size_bytes, b.state))
        .collect();
    use BlockState::{Allocated as A, Free as F};
    assert_eq!(
        layout,
        vec![(0, 1280, F), (1280, 256, A), (1536, MIB - 1536, F)]
    );
    let e = p.allocate(&mut d, on(0, 1200)).unwrap();
    assert_eq!(e.addr.0, sb, "first fit takes the merged range");
    check_against_device(&p, &d);
}

/// Freed neighbours in the global arena coalesce and first fit reuses the merged range.
#[test]
fn coalescing_in_the_global_arena() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let a = p.allocate(&mut d, on(0, MIB)).unwrap();
    let b = p.allocate(&mut d, on(0, MIB)).unwrap();
    let _c = p.allocate(&mut d, on(0, MIB)).unwrap();
    let at = a.addr;
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &b).unwrap();
    let e = p.allocate(&mut d, on(0, 2 * MIB)).unwrap();
    assert_eq!(e.addr, at);
    assert_eq!(d.live_segments().len(), 1);
    check_against_device(&p, &d);
}

/// Under memory pressure empty superblocks return to the global arena and the retry fits.
#[test]
fn pressure_returns_empty_superblocks() {
    let mut d = TestDevice::with_capacity(4 * MIB);
    let mut p = small();
    let s = p.allocate(&mut d, on(1, 1000)).unwrap();
    p.free(&mut d, &s).unwrap();
    let big = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    let base = d.live_segments()[0].0;
    assert_eq!(big.addr.0 - base, MIB);
    let l = p.allocate(&mut d, on(0, MIB)).unwrap();
    assert_eq!(l.addr.0, base, "the empty superblock of stream 1 made room");
    assert_eq!(entries(&p, base), vec![("arena-global", 0, 0, 4 * MIB)]);
    check_against_device(&p, &d);
}

/// Under memory pressure wholly free chunks go back to the device so a larger one can grow.
#[test]
fn pressure_releases_free_chunks() {
    let mut d = TestDevice::with_capacity(10 * MIB);
    let mut p = small();
    let _a = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    let b = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    p.free(&mut d, &b).unwrap();
    assert_eq!(p.stats().reserved_bytes, 8 * MIB);
    let c = p.allocate(&mut d, on(0, 5 * MIB)).unwrap();
    assert_eq!(c.block_bytes, 5 * MIB);
    assert_eq!(p.stats().reserved_bytes, 10 * MIB);
    assert_eq!(d.stats().free_count, 1);
    check_against_device(&p, &d);
}

/// A failed request leaves live allocations and allocated bytes as they were.
#[test]
fn oom_leaves_allocations_unchanged() {
    let mut d = TestDevice::with_capacity(4 * MIB);
    let mut p = small();
    let _a = p.allocate(&mut d, on(1, 1000)).unwrap();
    let _b = p.allocate(&mut d, on(0, 2 * MIB)).unwrap();
    let before = p.stats();
    let snapshot = p.snapshot();
    let err = p.allocate(&mut d, on(0, 1536 * KIB)).unwrap_err();
    let AllocError::OutOfMemory {
        requested_bytes,
        tried_bytes,
        stats,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!((requested_bytes, tried_bytes), (1536 * KIB, 4 * MIB));
    assert_eq!(stats, before);
    assert_eq!(p.stats(), before);
    // The blocks are where they were; RMM's defragment before the retry gave stream 1's
    // superblock to the global arena (reported on stream 0), and that stays.
    let mut moved = snapshot.clone();
    moved[0].stream = StreamId(0);
    assert_eq!(p.snapshot(), moved);
    check_against_device(&p, &d);
    let err = p.allocate(&mut NullDevice, on(2, 2 * MIB)).unwrap_err();
    assert!(
        matches!(err, AllocError::OutOfMemory { tried_bytes, .. } if tried_bytes == 4 * MIB),
        "{err:?}"
    );
    assert_eq!(p.stats(), before);
}

/// RMM's `do_allocate` under pressure: when no superblock can be had, `defragment()`
/// gives every stream's superblocks, non-empty ones too, to the global arena, and the
/// retry's superblock acquisition (global first fit over superblocks that fit) takes
/// another stream's partly used superblock instead of running out of memory.
#[test]
fn pressure_lends_partly_used_superblocks_to_other_streams() {
    let mut d = TestDevice::with_capacity(4 * MIB);
    let mut p = small();
    let a = p.allocate(&mut d, on(1, 1000)).unwrap();
    let base = d.live_segments()[0].0;
    let _big = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    // Stream 2 has no superblock and the chunk is full: the device refuses a new one.
    let b = p.allocate(&mut d, on(2, 1000)).unwrap();
    assert_eq!(
        b.addr.0,
        base + 1024,
        "first fit in stream 1's former superblock"
    );
    assert_eq!(
        entries(&p, base),
        vec![
            ("arena-superblock", 2, 0, MIB),
            ("arena-global", 0, MIB, 3 * MIB)
        ]
    );
    check_against_device(&p, &d);
    // A block goes back to whichever arena holds its superblock now (RMM's
    // deallocate_from_other_arena).
    p.free(&mut d, &a).unwrap();
    check_against_device(&p, &d);
    let c = p.allocate(&mut d, on(2, 1000)).unwrap();
    assert_eq!(
        c.addr.0, base,
        "stream 2 reuses the freed front of its superblock"
    );
    assert_eq!(d.stats().segment_count, 1, "no chunk was added");
}

/// An orphan superblock (given to the global arena with live blocks) that becomes empty
/// coalesces into its chunk (RMM's `global_arena::deallocate`), and a later large
/// request can use the whole chunk again.
#[test]
fn an_emptied_orphan_superblock_coalesces() {
    let mut d = TestDevice::with_capacity(4 * MIB);
    let mut p = small();
    let a = p.allocate(&mut d, on(1, 1000)).unwrap();
    let base = d.live_segments()[0].0;
    let big = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    // A large request that cannot fit triggers the defragment, then fails.
    assert!(p.allocate(&mut d, on(0, 2 * MIB)).is_err());
    assert_eq!(entries(&p, base)[0], ("arena-superblock", 0, 0, MIB));
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &big).unwrap();
    assert_eq!(entries(&p, base), vec![("arena-global", 0, 0, 4 * MIB)]);
    let whole = p.allocate(&mut d, on(0, 4 * MIB)).unwrap();
    assert_eq!(whole.addr.0, base);
    check_against_device(&p, &d);
}

/// empty_cache returns empty superblocks to the global arena and every wholly free chunk to the device.
#[test]
fn empty_cache_returns_every_free_chunk() {
    let mut d = TestDevice::unbounded();
    let mut p = small();
    let x = p.allocate(&mut d, on(1, 1000)).unwrap();
    let y = p.allocate(&mut d, on(2, 1000)).unwrap();
    let l = p.allocate(&mut d, on(0, 3 * MIB)).unwrap();
    let base = d.live_segments()[0].0;
    assert_eq!(
        l.addr.0 - base,
        4 * MIB,
        "3 MiB does not fit after two superblocks: a second chunk"
    );
    p.free(&mut d, &y).unwrap();
    p.free(&mut d, &l).unwrap();
    assert_eq!(p.stats().segment_count, 2);
    p.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_segments(), vec![(base, 4 * MIB)]);
    assert_eq!(
        entries(&p, base),
        vec![
            ("arena-superblock", 1, 0, MIB),
            ("arena-global", 0, MIB, 3 * MIB)
        ]
    );
    check_against_device(&p, &d);
    p.free(&mut d, &x).unwrap();
    p.empty_cache(&mut d).unwrap();
    assert!(d.live_segments().is_empty());
    check_against_device(&p, &d);
}

/// Invalid options are refused with a message naming the problem.
#[test]
fn option_validation() {
    let bad = |superblock_bytes, growth_bytes, threshold_bytes| {
        ArenaOptions {
            superblock_bytes,
            growth_bytes,
            threshold_bytes,
        }
        .validate()
        .unwrap_err()
    };
    let e = bad(1000, MIB, 0);
    assert_eq!(
        (e.policy, e.message.as_str()),
        (
            "arena",
            "superblock must be a positive multiple of 256, got 1000"
        )
    );
    assert_eq!(
        bad(0, MIB, 0).message,
        "superblock must be a positive multiple of 256, got 0"
    );
    assert_eq!(
        bad(MIB, MIB - 256, 0).message,
        format!("growth ({}) must be at least superblock ({MIB})", MIB - 256)
    );
    assert_eq!(
        bad(MIB, MIB, MIB + 1).message,
        format!("threshold ({}) must not exceed superblock ({MIB})", MIB + 1)
    );
    assert!(ArenaOptions {
        superblock_bytes: 256,
        growth_bytes: 256,
        threshold_bytes: 256
    }
    .validate()
    .is_ok());
    let invalid = ArenaOptions {
        superblock_bytes: 100,
        ..ArenaOptions::default()
    };
    assert!(ArenaPolicy::new(invalid.clone()).is_err());
    assert!(PolicyConfig::new(invalid).build().is_err());
    assert!(PolicyConfig::new(ArenaOptions::default()).build().is_ok());
}

/// The free blocks of the snapshot's entries of `pool` and `stream`, as (address,
/// size, the entry's address), by address.
fn free_blocks(p: &ArenaPolicy, pool: &str, stream: u64) -> Vec<(u64, u64, u64)> {
    let mut free: Vec<(u64, u64, u64)> = p
        .snapshot()
        .iter()
        .filter(|s| s.pool == pool && s.stream == StreamId(stream))
        .flat_map(|s| {
            s.blocks
                .iter()
                .filter(|b| b.state == BlockState::Free)
                .map(move |b| (b.addr.0, b.size_bytes, s.addr.0))
        })
        .collect();
    free.sort_unstable();
    free
}

/// A xorshift64 sequence from `seed` (not 0).
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// With hundreds of superblocks in one stream's arena, each small request lands where
/// first fit over the superblocks' free blocks (the snapshot's, in address order: one
/// chunk, so arena order) puts it: the superblocks passed over by their bound (at least
/// their widest free range) are exactly those that cannot hold it, including bounds
/// left high by carves and brought down by a search that failed, and the runs of 64
/// superblocks passed over by theirs (raised by frees, brought down by a search).
#[test]
fn many_superblocks_take_the_first_that_fits() {
    let mut d = TestDevice::unbounded();
    let mut p = ArenaPolicy::new(ArenaOptions {
        superblock_bytes: 64 * KIB,
        growth_bytes: 64 * MIB,
        threshold_bytes: 32 * KIB,
    })
    .unwrap();
    // First fit over the free blocks of stream 0's superblocks, by address.
    let expected = |p: &ArenaPolicy, bytes: u64| -> Option<u64> {
        let free = free_blocks(p, "arena-superblock", 0);
        free.iter()
            .find(|&&(_, len, _)| len >= bytes)
            .map(|&(a, _, _)| a)
    };
    let mut live: Vec<Allocation> = Vec::new();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut superblocks_most = 0;
    for step in 0..6000 {
        // Allocations outnumber frees two to one until 3000 steps, then the reverse.
        let alloc = live.is_empty() || (next() % 3 != 0) == (step < 3000);
        if alloc {
            let size = 256 + next() % (32 * KIB - 256);
            let bytes = size.div_ceil(256) * 256;
            let want = expected(&p, bytes);
            let a = p.allocate(&mut d, on(0, size)).unwrap();
            if let Some(want) = want {
                assert_eq!(a.addr.0, want, "step {step}: {bytes} bytes");
            }
            live.push(a);
        } else {
            let i = (next() % live.len() as u64) as usize;
            let a = live.swap_remove(i);
            p.free(&mut d, &a).unwrap();
        }
        superblocks_most =
            superblocks_most.max(p.arenas.first().map_or(0, |a| a.superblocks.len()));
        if step % 500 == 0 {
            p.check_invariants();
        }
    }
    assert!(
        superblocks_most > 200,
        "only {superblocks_most} superblocks"
    );
    p.check_invariants();
}

/// With hundreds of superblocks, so many runs of them, that `empty_cache` hands back
/// and memory pressure gives to the global arena as orphans (the orders emptied and
/// refilled), each small request still lands where first fit over its stream's
/// superblocks puts it, or in the first orphan that holds it when that comes before
/// the global arena's first room for a superblock, and every order, run and bound
/// stays sound.
#[test]
fn many_superblocks_survive_releases_and_defragmenting() {
    // 64 superblocks of 64 KiB to a chunk (one run); three chunks at most.
    let mut d = TestDevice::with_capacity(12 * MIB);
    let mut p = ArenaPolicy::new(ArenaOptions {
        superblock_bytes: 64 * KIB,
        growth_bytes: 4 * MIB,
        threshold_bytes: 32 * KIB,
    })
    .unwrap();
    // Where a request of `bytes` lands, and whether an orphan takes it: first fit over
    // the free blocks of stream 1's superblocks; else the first orphan (they report
    // stream 0) whose free blocks hold it, unless a free range of the global arena that
    // holds a new superblock comes first (the device hands out ascending addresses, so
    // arena order is address order); else a new chunk (not predicted).
    let expected = |p: &ArenaPolicy, bytes: u64| -> Option<(u64, bool)> {
        let free_of = |pool: &str, stream: u64| free_blocks(p, pool, stream);
        let first = |free: &[(u64, u64, u64)], bytes: u64| {
            free.iter().find(|&&(_, len, _)| len >= bytes).copied()
        };
        if let Some((addr, _, _)) = first(&free_of("arena-superblock", 1), bytes) {
            return Some((addr, false));
        }
        let orphan = first(&free_of("arena-superblock", 0), bytes);
        let fresh = first(&free_of("arena-global", 0), 64 * KIB);
        match (orphan, fresh) {
            (Some((addr, _, sb)), Some((f, _, _))) if sb < f => Some((addr, true)),
            (Some((addr, _, _)), None) => Some((addr, true)),
            (_, Some((f, _, _))) => Some((f, false)),
            (None, None) => None,
        }
    };
    let mut live: Vec<Allocation> = Vec::new();
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let (mut ooms, mut releases, mut superblocks_most, mut adopted) = (0, 0, 0, 0);
    for step in 0..9000 {
        // Allocations outnumber frees two to one for 2000 steps, then the reverse for
        // 1000, three times over: the live set grows past what the device holds.
        let alloc = live.is_empty() || (next() % 3 != 0) == (step % 3000 < 2000);
        if alloc {
            let size = 256 + next() % (32 * KIB - 256);
            let bytes = size.div_ceil(256) * 256;
            let want = expected(&p, bytes);
            match p.allocate(&mut d, on(1, size)) {
                Ok(a) => {
                    if let Some((want, orphan)) = want {
                        assert_eq!(a.addr.0, want, "step {step}: {bytes} bytes");
                        adopted += usize::from(orphan);
                    }
                    live.push(a);
                }
                Err(AllocError::OutOfMemory { .. }) => ooms += 1,
                Err(e) => panic!("step {step}: {e:?}"),
            }
        } else {
            let i = (next() % live.len() as u64) as usize;
            let a = live.swap_remove(i);
            p.free(&mut d, &a).unwrap();
        }
        if step % 1000 == 999 {
            p.empty_cache(&mut d).unwrap();
            releases += 1;
        }
        superblocks_most =
            superblocks_most.max(p.arenas.first().map_or(0, |a| a.superblocks.len()));
        if step % 250 == 0 {
            p.check_invariants();
        }
    }
    assert!(
        superblocks_most > 2 * regions::RUN && ooms > 0 && releases > 0 && adopted > 0,
        "{superblocks_most} superblocks at most, {ooms} out of memory, {adopted} orphans taken"
    );
    check_against_device(&p, &d);
    p.check_invariants();
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64, u64),
    Free(usize),
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..3, 1u64..=32 * KIB).prop_map(|(s, n)| Op::Alloc(s, n)),
        2 => (0u64..3, 1u64..=3 * MIB).prop_map(|(s, n)| Op::Alloc(s, n)),
        6 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
    ]
}

proptest! {
    /// Random alloc/free/empty_cache runs over three streams on a small device keep every
    /// invariant, and an OOM never changes live allocations.
    #[test]
    fn random_sequences_keep_invariants(ops in prop::collection::vec(op(), 1..120)) {
        let mut d = TestDevice::with_capacity(8 * MIB);
        let mut p = ArenaPolicy::new(ArenaOptions {
            superblock_bytes: 64 * KIB,
            growth_bytes: 2 * MIB,
            threshold_bytes: 32 * KIB,
        })
        .unwrap();
        let mut live: Vec<Allocation> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(stream, size) => {
                    let before = p.stats();
                    match p.allocate(&mut d, on(stream, size)) {
                        Ok(a) => {
                            prop_assert_eq!(a.block_bytes, size.div_ceil(256) * 256);
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
