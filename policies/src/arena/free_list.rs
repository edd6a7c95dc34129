//! The free ranges of one arena chunk or superblock: address-ordered first fit with
//! coalescing.

use std::collections::BTreeMap;

/// Free ranges of one chunk or superblock: address → length, coalesced.
#[derive(Debug, Default)]
pub(super) struct FreeList {
    pub(super) ranges: BTreeMap<u64, u64>,
    /// Sum of the range lengths (lets a search skip lists that cannot fit).
    pub(super) free_bytes: u64,
}

impl FreeList {
    /// A list with one free range.
    pub(super) fn whole(addr: u64, len: u64) -> FreeList {
        FreeList {
            ranges: BTreeMap::from([(addr, len)]),
            free_bytes: len,
        }
    }

    /// Whether the list is the single range `addr..addr + len`.
    pub(super) fn is_whole(&self, addr: u64, len: u64) -> bool {
        self.ranges.len() == 1 && self.ranges.get(&addr) == Some(&len)
    }

    /// Whether some free range holds `bytes` (RMM's `superblock::fits`).
    pub(super) fn fits(&self, bytes: u64) -> bool {
        self.free_bytes >= bytes && self.ranges.values().any(|&len| len >= bytes)
    }

    /// Address-ordered first fit: carves `bytes` from the front of the first range that
    /// holds them.
    pub(super) fn first_fit(&mut self, bytes: u64) -> Option<u64> {
        if self.free_bytes < bytes {
            return None;
        }
        let (&addr, &len) = self.ranges.iter().find(|(_, &len)| len >= bytes)?;
        self.ranges.remove(&addr);
        if len > bytes {
            self.ranges.insert(addr + bytes, len - bytes);
        }
        self.free_bytes -= bytes;
        Some(addr)
    }

    /// Returns a range, merging it with free neighbours.
    pub(super) fn insert(&mut self, addr: u64, len: u64) {
        let (mut start, mut end) = (addr, addr + len);
        if let Some((&p, &plen)) = self.ranges.range(..addr).next_back() {
            assert!(
                p + plen <= addr,
                "arena: freed range {addr:#x} overlaps a free range"
            );
            if p + plen == addr {
                self.ranges.remove(&p);
                start = p;
            }
        }
        if let Some((&n, &nlen)) = self.ranges.range(addr..).next() {
            assert!(
                n >= end,
                "arena: freed range {addr:#x} overlaps a free range"
            );
            if n == end {
                self.ranges.remove(&n);
                end = n + nlen;
            }
        }
        self.ranges.insert(start, end - start);
        self.free_bytes += len;
    }

    /// Panics unless the ranges lie in `lo..hi`, are non-empty, disjoint and coalesced,
    /// and sum to `free_bytes`.
    pub(super) fn check(&self, lo: u64, hi: u64, what: &str) {
        let mut prev_end = None;
        let mut sum = 0;
        for (&addr, &len) in &self.ranges {
            assert!(len > 0, "arena: empty free range in {what}");
            assert!(
                addr >= lo && addr + len <= hi,
                "arena: free range {addr:#x} outside its {what}"
            );
            if let Some(end) = prev_end {
                assert!(
                    addr > end,
                    "arena: free ranges in {what} overlap or were not coalesced at {addr:#x}"
                );
            }
            prev_end = Some(addr + len);
            sum += len;
        }
        assert_eq!(sum, self.free_bytes, "arena: free bytes of {what}");
    }
}
