//! Hash maps keyed by allocation ids and device addresses on the per-event
//! paths: the live table's ids from `id_map::DENSE_LIMIT` up (traces that number their
//! allocations by address), the RMM reader's pointers and the snapshot reader's block
//! addresses.
//!
//! They hash with foldhash, seeded at random in each process as std's `RandomState`
//! is (a file cannot be made to collide without knowing the seed), where std's
//! SipHash-1-3 took 340 of the 1 158 instructions per event of a caching replay of a
//! CSV trace whose ids were addresses (docs/performance.md, "Ids that are addresses").
//! Nothing iterates them into an output unsorted: their order was random before too.

/// A hash map of the per-event paths (see the module docs).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
