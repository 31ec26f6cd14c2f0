//! What the int8 kernels on packed matrices prefetch while they read a row group's records.
//!
//! A group's records are read once per tile of tokens. The first tile streams them from
//! memory: the hardware prefetcher does not run far enough ahead of that single stream, so
//! each block fetches the record a few ahead into L1. The other full tiles read the group
//! from L1, and meanwhile bring the next group (contiguous after this one) into L2, a share
//! each, so that the next group's first tile does not wait for memory: with 8 to 16 tokens
//! the Q8_0 LM head of a 262,144-token vocabulary ran 1.1-1.4x faster than when every tile
//! prefetched its own records (`examples/matmul_bench.rs`, column `packed`). A remainder
//! tile, shorter, fetches nothing of the next group. Prefetches never fault, even past the
//! end of the matrix, and change no result.

use std::arch::x86_64::*;

use crate::packed::{PackedMatrix, RecordLayout, BLOCK};

/// How many records ahead of the one being read the first tile prefetches.
const RECORDS_AHEAD: usize = 4;

/// The bytes, counted from the start of the group a tile reads, that the tile prefetches
/// into L2, `per_block` of them with each block; `len` 0: none, the tile prefetches its own
/// stream into L1 instead.
#[derive(Clone, Copy)]
pub(super) struct GroupPrefetch {
    from: usize,
    len: usize,
    per_block: usize,
    /// Where the next group ends.
    next_end: usize,
}

impl GroupPrefetch {
    /// The group's own records, a few ahead (the first tile, a remainder tile).
    pub(super) const OWN: GroupPrefetch = GroupPrefetch {
        from: 0,
        len: 0,
        per_block: 0,
        next_end: 0,
    };

    /// The next group of `w` after `g` cut into the shares of the `tiles − 1` full tiles
    /// after the first, in whole lines; [`GroupPrefetch::tile`] picks a tile's.
    pub(super) fn plan(w: &PackedMatrix, g: usize, tiles: usize) -> GroupPrefetch {
        let bytes = w.group(g).len();
        if tiles < 2 || bytes == 0 {
            // (No block to pair the prefetches with: fewer than 32 columns.)
            return GroupPrefetch::OWN;
        }
        // The next group starts right after this one, at a half line (records are whole
        // half lines): its lines run from the one holding its first byte.
        let (from, next_end) = (bytes / 64 * 64, 2 * bytes);
        let len = (next_end - from).div_ceil(64).div_ceil(tiles - 1) * 64;
        let per_block = (len / 64).div_ceil(w.cols() / BLOCK) * 64;
        GroupPrefetch {
            from,
            len,
            per_block,
            next_end,
        }
    }

    /// What full tile `i` (from 0) prefetches.
    pub(super) fn tile(self, i: usize) -> GroupPrefetch {
        match i {
            0 => GroupPrefetch::OWN,
            _ => GroupPrefetch {
                from: self.from + (i - 1) * self.len,
                ..self
            },
        }
    }

    /// The prefetches that go with block `b` of the group at `records` (laid out as
    /// `layout`), whose record is at `at`.
    #[inline(always)]
    pub(super) fn fetch(self, records: *const u8, layout: RecordLayout, b: usize, at: usize) {
        if self.len == 0 {
            // The record a few ahead, and the header before it (which is not its super-block's
            // unless it is the super-block's first record: then those lines were fetched
            // already). The same number of lines every block: a count that varied with the
            // record's place would cost a branch miss a block (2x slower when the records
            // are in the cache).
            let ahead = records
                .wrapping_add(layout.record_after(at, b, RECORDS_AHEAD))
                .wrapping_sub(layout.header);
            for line in (0..layout.header + layout.record).step_by(64) {
                // SAFETY: a prefetch never faults, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast()) };
            }
        } else {
            // The last share stops at the next group's end (`from` starts at its start).
            let at = self.from + b * self.per_block;
            let end = (at + self.per_block)
                .min(self.from + self.len)
                .min(self.next_end);
            for at in (at..end).step_by(64) {
                // SAFETY: as above.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(records.wrapping_add(at).cast()) };
            }
        }
    }
}
