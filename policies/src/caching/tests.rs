use super::*;
use crate::testing::{NullDevice, TestDevice};

const GIB: u64 = 1 << 30;

fn req(size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(0),
    }
}

fn on(stream: u64, size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(stream),
    }
}

fn policy(conf: &str) -> CachingPolicy {
    CachingPolicy::new(CachingConfig::from_alloc_conf(conf).unwrap())
}

/// The worked examples of the spec (§2.3): rounding, pool, segment size and split on an
/// empty cache.
#[test]
fn worked_examples_on_an_empty_cache() {
    // (request, block bytes, reserved bytes)
    let cases = [
        (4, 512, 2 * MIB),
        (MIB, MIB, 2 * MIB),
        (MIB + 1, MIB + 512, 20 * MIB),
        (19 * MIB, 20 * MIB, 20 * MIB),
        (10 * MIB, 10 * MIB, 10 * MIB),
        (100 * MIB + 1, 100 * MIB + 512, 102 * MIB),
        (101 * MIB, 102 * MIB, 102 * MIB),
    ];
    for (request, block, reserved) in cases {
        let mut d = TestDevice::unbounded();
        let mut p = CachingPolicy::default();
        let a = p.allocate(&mut d, req(request)).unwrap();
        assert_eq!(a.block_bytes, block, "block for {request}");
        assert_eq!(p.stats().reserved_bytes, reserved, "reserved for {request}");
        assert_eq!(p.stats().allocated_bytes, block, "allocated for {request}");
        p.check_invariants();
    }
}

/// A 9.99 MiB request gets a 20 MiB segment, a 10 MiB one a 10 MiB segment.
#[test]
fn ten_mib_step() {
    let p = CachingPolicy::default();
    assert_eq!(p.allocation_size(p.round_size(10 * MIB - 512)), 20 * MIB);
    assert_eq!(p.allocation_size(p.round_size(10 * MIB)), 10 * MIB);
}

/// A thousand 512-byte tensors share one 2 MiB small segment.
#[test]
fn thousand_small_requests_share_one_segment() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let live: Vec<_> = (0..1000)
        .map(|_| p.allocate(&mut d, req(512)).unwrap())
        .collect();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    assert_eq!(p.stats().allocated_bytes, 512 * 1000);
    for a in live {
        p.free(&mut d, &a).unwrap();
    }
    p.check_invariants();
    assert_eq!(p.caching_stats().inactive_split_bytes.all.current, 0);
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
}

/// The seed000 scenario: reassigning a 1 GiB tensor needs a third segment; reserved
/// peaks at 3 GiB.
#[test]
fn reassign_needs_two_live_copies() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, req(GIB)).unwrap();
    let b = p.allocate(&mut d, req(GIB)).unwrap();
    p.free(&mut d, &b).unwrap();
    let c = p.allocate(&mut d, req(GIB)).unwrap();
    let c2 = p.allocate(&mut d, req(GIB)).unwrap();
    p.free(&mut d, &c).unwrap();
    let dd = p.allocate(&mut d, req(GIB)).unwrap();
    p.free(&mut d, &dd).unwrap();
    let e = p.allocate(&mut d, req(GIB)).unwrap();
    assert_eq!(p.caching_stats().reserved_bytes.all.peak, 3 * GIB);
    assert_eq!(p.stats().allocated_bytes, 3 * GIB);
    for x in [a, c2, e] {
        p.free(&mut d, &x).unwrap();
    }
    p.check_invariants();
}

/// Best fit takes the smallest fitting block, and among equals the lowest address.
#[test]
fn best_fit_prefers_smallest_then_lowest_address() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let big = p.allocate(&mut d, req(40 * MIB)).unwrap();
    let first = p.allocate(&mut d, req(12 * MIB)).unwrap();
    let second = p.allocate(&mut d, req(12 * MIB)).unwrap();
    let (first_addr, big_addr) = (first.addr, big.addr);
    p.free(&mut d, &big).unwrap();
    p.free(&mut d, &second).unwrap();
    p.free(&mut d, &first).unwrap();
    let again = p.allocate(&mut d, req(12 * MIB)).unwrap();
    assert_eq!(
        again.addr, first_addr,
        "equal 12 MiB blocks: lowest address wins"
    );
    let bigger = p.allocate(&mut d, req(30 * MIB)).unwrap();
    assert_eq!(bigger.addr, big_addr, "only the 40 MiB block fits");
    p.check_invariants();
}

/// A block cached for one stream is never handed to another.
#[test]
fn no_cross_stream_reuse() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, on(7, 64 * MIB)).unwrap();
    p.free(&mut d, &a).unwrap();
    let _b = p.allocate(&mut d, on(9, 64 * MIB)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 128 * MIB);
    let _c = p.allocate(&mut d, on(7, 64 * MIB)).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        128 * MIB,
        "stream 7 reuses its own block"
    );
    p.check_invariants();
}

/// With more streams than are scanned (the slots then come from a map), each stream
/// still gets back the block it freed, at its address, and no other stream's.
#[test]
fn many_streams_reuse_their_own_blocks() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let streams = (SCANNED_STREAMS as u64) * 3;
    let first: Vec<Allocation> = (0..streams)
        .map(|s| p.allocate(&mut d, on(1000 + s, 4 * MIB)).unwrap())
        .collect();
    p.check_invariants();
    for a in &first {
        p.free(&mut d, a).unwrap();
    }
    let reserved = p.stats().reserved_bytes;
    // In another order: a slot handed to the wrong stream would give it another
    // stream's block (or none cached, and a new segment).
    for s in (0..streams).rev() {
        let b = p.allocate(&mut d, on(1000 + s, 4 * MIB)).unwrap();
        assert_eq!(
            b.addr, first[s as usize].addr,
            "stream {s} got another block"
        );
    }
    assert_eq!(p.stats().reserved_bytes, reserved, "no new segment");
    p.check_invariants();
}

/// A large remainder of exactly 1 MiB stays attached; small remainders of 512 B split.
#[test]
fn split_thresholds() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, req(19 * MIB)).unwrap();
    assert_eq!(a.block_bytes, 20 * MIB);
    let s = p.allocate(&mut d, req(2 * MIB - 512)).unwrap();
    assert_eq!(
        s.block_bytes,
        2 * MIB - 512,
        "rounded size 2 MiB - 512 is large pool"
    );
    let mut small = CachingPolicy::default();
    let t = small.allocate(&mut d, req(MIB + MIB / 2)).unwrap();
    assert_eq!(t.block_bytes, MIB + MIB / 2);
    let u = small.allocate(&mut d, req(MIB - 512)).unwrap();
    // Small pool: 2 MiB segment, rest 1 MiB + 512 >= 512, split.
    assert_eq!(u.block_bytes, MIB - 512);
    small.check_invariants();
    p.check_invariants();
}

/// Inactive-split bookkeeping follows PyTorch through split, reuse and merge.
#[test]
fn inactive_split_accounting() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, req(512)).unwrap();
    let st = p.caching_stats();
    assert_eq!(
        (
            st.inactive_split.all.current,
            st.inactive_split_bytes.all.current
        ),
        (1, 2 * MIB - 512)
    );
    let b = p.allocate(&mut d, req(1024)).unwrap();
    assert_eq!(
        p.caching_stats().inactive_split_bytes.all.current,
        2 * MIB - 1536
    );
    p.free(&mut d, &a).unwrap();
    let st = p.caching_stats();
    assert_eq!(
        (
            st.inactive_split.all.current,
            st.inactive_split_bytes.all.current
        ),
        (2, 2 * MIB - 1024)
    );
    p.free(&mut d, &b).unwrap();
    let st = p.caching_stats();
    assert_eq!(
        (
            st.inactive_split.all.current,
            st.inactive_split_bytes.all.current
        ),
        (0, 0)
    );
    p.check_invariants();
}

/// Out of memory: every whole cached segment is released (all streams), the third
/// attempt is counted, and live allocations survive.
#[test]
fn oom_retry_releases_cache_then_fails() {
    let mut d = TestDevice::with_capacity(GIB);
    let mut p = CachingPolicy::default();
    let keep = p.allocate(&mut d, req(400 * MIB)).unwrap();
    let cached = p.allocate(&mut d, on(3, 400 * MIB)).unwrap();
    p.free(&mut d, &cached).unwrap();
    // 400 live + 400 cached (other stream); 300 more does not fit without the cache.
    let got = p.allocate(&mut d, req(300 * MIB)).unwrap();
    assert_eq!(p.caching_stats().num_alloc_retries, 1);
    assert_eq!(p.stats().reserved_bytes, 700 * MIB);
    let before = p.stats();
    let err = p.allocate(&mut d, req(500 * MIB)).unwrap_err();
    match err {
        AllocError::OutOfMemory {
            tried_bytes,
            requested_bytes,
            stats,
        } => {
            assert_eq!((tried_bytes, requested_bytes), (500 * MIB, 500 * MIB));
            assert_eq!(stats.allocated_bytes, before.allocated_bytes);
        }
        other => panic!("unexpected {other:?}"),
    }
    let s = p.caching_stats();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (2, 1));
    assert_eq!(p.stats().allocated_bytes, 700 * MIB);
    p.free(&mut d, &keep).unwrap();
    p.free(&mut d, &got).unwrap();
    p.check_invariants();
}

/// The memory limit is checked with the segment size against total reserved bytes,
/// before the device is asked.
#[test]
fn memory_limit_uses_segment_size() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    p.set_memory_limit(MemoryLimit::Bytes(30 * MIB));
    let _a = p.allocate(&mut d, req(15 * MIB)).unwrap(); // 16 MiB segment
                                                         // A 2 MiB request needs a 20 MiB segment: 16 + 20 > 30.
    let err = p.allocate(&mut d, req(2 * MIB)).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { tried_bytes, .. } if tried_bytes == 20 * MIB));
    // A small one needs 2 MiB: fits.
    p.allocate(&mut d, req(1000)).unwrap();
    let msg = p.oom_message(20 * MIB, &d);
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 GiB"), "{msg}");
    assert!(msg.contains("30.00 MiB allowed; Of the allocated memory 16.00 MiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated."), "{msg}");
}

/// Rule A: a normal request does not take an oversize cached block; rule B: an
/// oversize request takes one only within the rounding tolerance.
#[test]
fn oversize_rules() {
    let mut d = TestDevice::unbounded();
    let mut p = policy("max_split_size_mb:64");
    let big = p.allocate(&mut d, req(100 * MIB)).unwrap();
    assert_eq!(big.block_bytes, 100 * MIB);
    p.free(&mut d, &big).unwrap();
    let _normal = p.allocate(&mut d, req(30 * MIB)).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        130 * MIB,
        "rule A: no reuse of the 100 MiB block"
    );
    let within = p.allocate(&mut d, req(90 * MIB)).unwrap();
    assert_eq!(
        within.block_bytes,
        100 * MIB,
        "rule B: 100 < 90 + 20, taken whole, unsplit"
    );
    p.free(&mut d, &within).unwrap();
    let _beyond = p.allocate(&mut d, req(70 * MIB)).unwrap();
    // 100 >= 70 + 20: not taken; a 70 MiB segment is needed. cudaMalloc succeeds first.
    assert_eq!(p.stats().reserved_bytes, 200 * MIB);
    assert_eq!(p.caching_stats().oversize_segments.current, 2);
    p.check_invariants();
}

/// With `max_split_size_mb`, an OOM first frees one oversize cached block that covers
/// the request before falling back to freeing everything.
#[test]
fn release_available_cached_blocks_frees_one_oversize_block() {
    let mut d = TestDevice::with_capacity(300 * MIB);
    let mut p = policy("max_split_size_mb:64");
    let a = p.allocate(&mut d, req(100 * MIB)).unwrap();
    let b = p.allocate(&mut d, req(150 * MIB)).unwrap();
    let small = p.allocate(&mut d, req(20 * MIB)).unwrap();
    p.free(&mut d, &small).unwrap();
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &b).unwrap();
    // Cached: 100 and 150 (oversize) and 20. A 120 MiB request: 100 MiB block is below
    // 120 (no reuse), rule A/B: smallest fitting is 150 >= 120 + 20 → no. cudaMalloc of
    // 120 fails (270 used of 300); release_available frees the 150 MiB block.
    let c = p.allocate(&mut d, req(120 * MIB)).unwrap();
    assert_eq!(c.block_bytes, 120 * MIB);
    assert_eq!(
        p.caching_stats().num_alloc_retries,
        0,
        "no full release needed"
    );
    assert_eq!(p.stats().reserved_bytes, 240 * MIB);
    p.check_invariants();
}

/// Garbage collection frees old whole large segments once reserved passes the
/// threshold of the limit, before asking the device.
#[test]
fn garbage_collection_frees_old_segments() {
    let mut d = TestDevice::unbounded();
    let mut p = policy("garbage_collection_threshold:0.5");
    p.set_memory_limit(MemoryLimit::Bytes(100 * MIB));
    let a = p.allocate(&mut d, req(30 * MIB)).unwrap();
    let b = p.allocate(&mut d, req(24 * MIB)).unwrap();
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &b).unwrap();
    // 54 MiB reserved > 50 MiB threshold. A 40 MiB request finds no block, GC runs:
    // both blocks have age 0 = mean, both are freed (a pass does not stop midway).
    let _c = p.allocate(&mut d, req(40 * MIB)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 40 * MIB);
    assert_eq!(p.caching_stats().num_device_free, 2);
    p.check_invariants();
}

/// Without a memory limit the GC threshold is ignored.
#[test]
fn garbage_collection_needs_a_limit() {
    let mut d = TestDevice::unbounded();
    let mut p = policy("garbage_collection_threshold:0.5");
    let a = p.allocate(&mut d, req(30 * MIB)).unwrap();
    p.free(&mut d, &a).unwrap();
    let _c = p.allocate(&mut d, req(40 * MIB)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 70 * MIB);
}

/// `roundup_power2_divisions` rounds to the next division of the power-of-two interval,
/// but not below 512 × divisions.
#[test]
fn power2_division_rounding() {
    let p = policy("roundup_power2_divisions:4");
    assert_eq!(p.round_size(1200), 1536, "small sizes ignore divisions");
    assert_eq!(p.round_size(5 * MIB + 1), 6 * MIB);
    assert_eq!(p.round_size(1 << 25), 1 << 25);
    assert_eq!(p.round_size(33 * MIB), 40 * MIB);
    assert_eq!(p.round_size(2049), 2560, "2049 > 2048 = 512 x 4: step 512");
    let q = policy("roundup_power2_divisions:[256:1,512:2,>:8]");
    assert_eq!(q.round_size(700 * MIB), 768 * MIB);
    assert_eq!(q.round_size(300 * MIB), 300 * MIB);
    assert_eq!(q.round_size(1100 * MIB), 1152 * MIB);
}

/// Expandable segments grow by pages (20 MiB in the large pool, 2 MiB in the small one)
/// instead of new segments, and `empty_cache` unmaps whole free pages only.
#[test]
fn expandable_segments_map_and_unmap_pages() {
    let mut d = TestDevice::unbounded();
    let mut p = policy("expandable_segments:True");
    let a = p.allocate(&mut d, req(30 * MIB)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 40 * MIB, "two 20 MiB pages");
    let b = p.allocate(&mut d, req(5 * MIB)).unwrap();
    assert_eq!(
        b.addr.0,
        a.addr.0 + 30 * MIB,
        "packed after a in the same segment"
    );
    assert_eq!(p.stats().reserved_bytes, 40 * MIB);
    let c = p.allocate(&mut d, req(10 * MIB)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 60 * MIB);
    assert_eq!(
        p.caching_stats().segment.all.current,
        0,
        "expandable segments do not count"
    );
    let s = p.allocate(&mut d, req(4096)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 62 * MIB);
    p.check_invariants();
    p.free(&mut d, &a).unwrap();
    p.empty_cache(&mut d).unwrap();
    // a occupied [0, 30) MiB: page 0 is wholly free, page 1 is shared with b.
    assert_eq!(p.stats().reserved_bytes, 42 * MIB);
    p.check_invariants();
    for x in [b, c, s] {
        p.free(&mut d, &x).unwrap();
    }
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
    assert_eq!(
        p.stats().segment_count,
        0,
        "fully unmapped segments are released"
    );
    p.check_invariants();
}

/// A block freed while other streams use it keeps its memory until its free completes,
/// but leaves `allocated_bytes` at once; a cache release completes it early.
#[test]
fn pending_free_blocks() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, req(64 * MIB)).unwrap();
    p.free_requested(&a);
    assert_eq!(p.stats().allocated_bytes, 0);
    assert_eq!(p.caching_stats().active_bytes.all.current, 64 * MIB);
    let b = p.allocate(&mut d, req(64 * MIB)).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        128 * MIB,
        "pending block is not reusable"
    );
    p.check_invariants();
    p.empty_cache(&mut d).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        64 * MIB,
        "release completed the pending free"
    );
    p.free(&mut d, &a).unwrap(); // the late completion is a no-op
    p.free(&mut d, &b).unwrap();
    p.check_invariants();
    assert_eq!(p.caching_stats().active.all.current, 0);
}

/// `active` and `active_bytes`, copied from `allocation` and `allocated_bytes` until
/// a free waits for other streams, carry every field over when they start being kept
/// (peaks and totals from before, the pending block after) and follow them from then on.
#[test]
fn active_stats_mirror_allocation_until_a_free_waits() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let a = p.allocate(&mut d, req(64 * MIB)).unwrap();
    let b = p.allocate(&mut d, req(4 * MIB)).unwrap();
    p.free(&mut d, &b).unwrap();
    let st = p.caching_stats();
    assert_eq!(st.active, st.allocation, "mirrored before a pending free");
    assert_eq!(st.active_bytes, st.allocated_bytes);
    assert_eq!(st.active.all.freed, 1);
    p.free_requested(&a);
    let st = p.caching_stats();
    assert_eq!(st.allocation.all.current, 0);
    assert_eq!(
        st.active.all.current, 1,
        "the pending block is still active"
    );
    assert_eq!(st.active.all.peak, 2, "the peak from before the copy");
    assert_eq!(st.active_bytes.large_pool.allocated, 68 * MIB);
    assert_eq!(st.active_bytes.large_pool.freed, 4 * MIB);
    p.free(&mut d, &a).unwrap();
    let st = p.caching_stats();
    assert_eq!((st.active.all.current, st.active.all.freed), (0, 2));
    assert_eq!(st.active_bytes.all.freed, 68 * MIB);
    let flat = p.detailed_stats();
    assert!(flat.contains(&("active.all.peak".to_string(), 2)));
    p.check_invariants();
}

/// A device with no memory makes every request an OOM without touching state.
#[test]
fn null_device_always_oom() {
    let mut d = NullDevice;
    let mut p = CachingPolicy::default();
    assert!(matches!(
        p.allocate(&mut d, req(1)),
        Err(AllocError::OutOfMemory { .. })
    ));
    assert_eq!(p.stats(), PolicyStats::default());
    let mut e = policy("expandable_segments:True");
    assert!(matches!(
        e.allocate(&mut d, req(1)),
        Err(AllocError::OutOfMemory { .. })
    ));
    e.check_invariants();
}

/// Zero-byte and ≥ 1 EiB requests never reach the allocator.
#[test]
fn degenerate_sizes() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    assert_eq!(p.allocate(&mut d, req(0)), Err(AllocError::ZeroSize));
    assert!(matches!(
        p.allocate(&mut d, req(1 << 60)),
        Err(AllocError::OutOfMemory { .. })
    ));
    assert_eq!(p.caching_stats().num_ooms, 0);
    assert_eq!(p.stats(), PolicyStats::default());
}

/// PyTorch's `format_size`.
#[test]
fn format_size_matches_pytorch() {
    assert_eq!(format_size(0), "0 bytes");
    assert_eq!(format_size(1024), "1024 bytes");
    assert_eq!(format_size(1536), "1.50 KiB");
    assert_eq!(format_size(GIB), "1024.00 MiB");
    assert_eq!(format_size(85_017_493_504), "79.18 GiB");
}

/// A private pool whose expandable segments were given back passes the invariant check:
/// its `cudaMalloc_count` (one per mapping got, one off per unmapping, as PyTorch
/// counts) is compared with its segments only while it never had an expandable one.
#[test]
fn private_pool_count_after_its_expandable_segments_go() {
    let mut d = TestDevice::unbounded();
    let mut p = policy("expandable_segments:True");
    let pool = PoolId(0, 1);
    let all = PoolStreams::All;
    p.call(
        &mut d,
        &AllocatorCall::BeginAllocateToPool {
            pool,
            streams: &all,
        },
    )
    .unwrap();
    // Two mappings of one segment, later unmapped in one span.
    let a = p.allocate(&mut d, req(20 * MIB)).unwrap();
    let b = p.allocate(&mut d, req(20 * MIB)).unwrap();
    p.call(&mut d, &AllocatorCall::EndAllocateToPool { pool })
        .unwrap();
    p.check_invariants();
    p.free(&mut d, &a).unwrap();
    p.free(&mut d, &b).unwrap();
    p.call(&mut d, &AllocatorCall::ReleasePool { pool })
        .unwrap();
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.stats().reserved_bytes, 0, "every page unmapped");
    p.check_invariants();
}

/// A checkpoint restore's request takes the pool's free block at the address named,
/// exactly its bytes, splitting the block where it is larger and keeping it in its
/// small pool, where malloc would have made a large segment; a request whose block is
/// not there is served from the pool being restored.
#[test]
fn a_restore_block_takes_the_named_block() {
    let mut d = TestDevice::unbounded();
    let mut p = CachingPolicy::default();
    let pool = PoolId(0, 1);
    let all = PoolStreams::All;
    let begin = AllocatorCall::BeginAllocateToPool {
        pool,
        streams: &all,
    };
    p.call(&mut d, &begin).unwrap();
    let x = p.allocate(&mut d, req(256 * 1024)).unwrap();
    let y = p.allocate(&mut d, req(512 * 1024)).unwrap();
    p.call(&mut d, &AllocatorCall::EndAllocateToPool { pool })
        .unwrap();
    let base = x.addr;
    p.free(&mut d, &x).unwrap();
    p.free(&mut d, &y).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB, "one small segment");
    let restore = |addr: u64| AllocatorCall::RestoreBlock {
        pool,
        addr: DeviceAddr(addr),
    };
    p.call(&mut d, &restore(base.0)).unwrap();
    let a = p.allocate(&mut d, req(1536 * 1024)).unwrap();
    assert_eq!((a.addr, a.block_bytes), (base, 1536 * 1024));
    assert_eq!(p.stats().reserved_bytes, 2 * MIB, "no new segment");
    assert_eq!(
        p.caching_stats().inactive_split_bytes.all.current,
        512 * 1024
    );
    p.call(&mut d, &restore(base.0 + 1536 * 1024)).unwrap();
    let b = p.allocate(&mut d, req(512 * 1024)).unwrap();
    assert_eq!(b.addr.0, base.0 + 1536 * 1024);
    assert_eq!(p.caching_stats().inactive_split_bytes.all.current, 0);
    assert_eq!(p.private_pools()[0].active_bytes, 2 * MIB);
    p.check_invariants();
    // Nothing free there: served from the pool, as usual.
    p.call(&mut d, &restore(base.0)).unwrap();
    let c = p.allocate(&mut d, req(4096)).unwrap();
    assert_ne!(c.addr, base);
    assert_eq!(p.private_pools()[0].segments, 2, "{:?}", p.private_pools());
    p.check_invariants();
    for alloc in [a, b, c] {
        p.free(&mut d, &alloc).unwrap();
    }
    p.check_invariants();
}

/// Random work in a private pool with checkpoint restores aimed at its free blocks (any
/// free block, any size up to it in 512-byte steps, as a checkpoint's block sizes are)
/// keeps every invariant under the default, expandable and rounding settings, and each
/// restore takes exactly the block it names.
#[test]
fn restores_keep_the_invariants() {
    use crate::policy::BlockState;
    use proptest::prelude::*;
    let op = (0u8..5, 1u64..(48 << 20), any::<u32>());
    let config = ProptestConfig::with_cases(256);
    proptest!(config, |(ops in proptest::collection::vec(op, 1..120), conf in 0usize..3)| {
        let confs = ["", "expandable_segments:True", "roundup_power2_divisions:4"];
        let mut d = TestDevice::unbounded();
        let mut p = policy(confs[conf]);
        let pool = PoolId(0, 1);
        let all = PoolStreams::All;
        let begin = AllocatorCall::BeginAllocateToPool { pool, streams: &all };
        p.call(&mut d, &begin).unwrap();
        let mut live = Vec::new();
        for (kind, size, pick) in ops {
            let pick = pick as usize;
            match kind {
                0 | 1 => live.push(p.allocate(&mut d, req(size)).unwrap()),
                2 if !live.is_empty() => {
                    let a = live.swap_remove(pick % live.len());
                    p.free(&mut d, &a).unwrap();
                }
                _ => {
                    let free: Vec<(u64, u64)> = p
                        .snapshot()
                        .iter()
                        .flat_map(|s| &s.blocks)
                        .filter(|b| b.state == BlockState::Free)
                        .map(|b| (b.addr.0, b.size_bytes))
                        .collect();
                    if free.is_empty() {
                        continue;
                    }
                    let (addr, block) = free[pick % free.len()];
                    let want = 512 * (1 + (size / 512) % (block / 512));
                    let restore = AllocatorCall::RestoreBlock { pool, addr: DeviceAddr(addr) };
                    p.call(&mut d, &restore).unwrap();
                    let a = p.allocate(&mut d, req(want)).unwrap();
                    prop_assert_eq!((a.addr.0, a.block_bytes), (addr, want));
                    prop_assert_eq!(p.restores_missed(), 0);
                    live.push(a);
                }
            }
            p.check_invariants();
        }
        for a in live {
            p.free(&mut d, &a).unwrap();
        }
        p.check_invariants();
    });
}
