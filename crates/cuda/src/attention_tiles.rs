//! How the attention kernel's thread blocks cover a batch (see `kernels/attention.cu`).
//!
//! A block stages a chunk of one kv head's key and value rows in shared memory and serves
//! every query head of the group from it; a *tile* of several consecutive tokens of one
//! sequence shares the same rows as well, so a prefill chunk reads its context once per
//! tile instead of once per token. Decode steps (one token per sequence) use tiles of one
//! token and no tile table. Tiles never cross a launch group: the attention runs in groups
//! of rows whose partial results fit the workspace's buffer, or, when its blocks fold their
//! partitions themselves (tensor cores, a prompt's tiles), in one launch of every row.
//!
//! The tiling changes no result: each warp computes its own token's attention with the
//! same arithmetic whatever tile, block shape or launch it is in.

use std::ops::Range;

/// Positions staged in shared memory at a time: one per lane of a warp (`ATTN_CHUNK` in
/// attention.cu).
pub(crate) const ATTN_CHUNK: usize = 32;

/// Warps a block aims at when tokens are tiled: enough query rows per staged chunk to keep
/// the arithmetic ahead of the copies, few enough for several blocks per multiprocessor.
const TARGET_WARPS: usize = 16;

/// Most threads in a block.
const MAX_BLOCK_THREADS: usize = 1024;

/// Bytes of dynamic shared memory a block of `tile_tokens` tokens takes: a query row of f32
/// per warp, then two stages of [`ATTN_CHUNK`] key rows and as many value rows, each row
/// padded by 16 bytes, then the cache offsets (i64) of two chunks' rows.
pub(crate) fn shared_bytes(group: usize, tile_tokens: usize, head_dim: usize, act: usize) -> usize {
    let warps = group * tile_tokens;
    let row = head_dim * act + 16;
    warps * head_dim * 4 + 2 * 2 * ATTN_CHUNK * row + 2 * ATTN_CHUNK * 8
}

/// Tokens per tile for prefill: about [`TARGET_WARPS`] warps per block, within the block
/// size and `shared_limit` bytes of shared memory; at least 1.
pub(crate) fn tokens_per_tile(group: usize, head_dim: usize, act: usize, limit: usize) -> usize {
    let mut t = (TARGET_WARPS / group)
        .min(MAX_BLOCK_THREADS / (32 * group))
        .max(1);
    while t > 1 && shared_bytes(group, t, head_dim, act) > limit {
        t -= 1;
    }
    t
}

/// The tiles of a batch, per launch group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttentionTiles {
    /// Most tokens in a tile (the block has this many times the group's warps).
    pub tile_tokens: usize,
    /// `(first token, count)` of every tile, flat; the first token counts from the start of
    /// the tile's launch group.
    pub pairs: Vec<i32>,
    /// For launch group `g` (tokens `[g * group_rows, (g + 1) * group_rows)`), the range of
    /// its tiles (indices of pairs).
    pub groups: Vec<Range<usize>>,
    /// Whether the blocks fold every partition of their tiles' contexts themselves
    /// (tensor-core attention, [`AttentionTiles::build_folded`]): they write no partial
    /// results, so the batch is one launch group whatever its size.
    pub folded: bool,
}

impl AttentionTiles {
    /// Cuts `n = token_seq.len()` tokens into tiles of at most `tile_tokens` consecutive
    /// tokens of one sequence at consecutive positions, none crossing a multiple of
    /// `group_rows`.
    pub fn build(
        token_seq: &[i32],
        positions: &[i32],
        tile_tokens: usize,
        group_rows: usize,
    ) -> AttentionTiles {
        let (tile_tokens, group_rows) = (tile_tokens.max(1), group_rows.max(1));
        let mut pairs = Vec::new();
        let mut groups = Vec::new();
        let mut group_start = 0; // first tile of the current group
        let mut len = 0; // tokens in the open tile
        for i in 0..token_seq.len() {
            let new_group = i % group_rows == 0;
            if new_group && i > 0 {
                groups.push(group_start..pairs.len() / 2);
                group_start = pairs.len() / 2;
            }
            let extends = !new_group
                && len < tile_tokens
                && token_seq[i] == token_seq[i - 1]
                && positions[i] == positions[i - 1] + 1;
            if extends {
                len += 1;
                let last = pairs.len() - 1;
                pairs[last] = len as i32;
            } else {
                len = 1;
                pairs.push((i % group_rows) as i32);
                pairs.push(1);
            }
        }
        if !token_seq.is_empty() {
            groups.push(group_start..pairs.len() / 2);
        }
        // Blocks are sized for the longest tile there is: a step whose sequences bring
        // one token each (or few) leaves no warps idle.
        let longest = pairs.chunks(2).map(|p| p[1] as usize).max().unwrap_or(1);
        AttentionTiles {
            tile_tokens: longest.min(tile_tokens),
            pairs,
            groups,
            folded: false,
        }
    }

    /// [`AttentionTiles::build`] for blocks that fold their partitions themselves: one
    /// launch group of every token.
    pub fn build_folded(
        token_seq: &[i32],
        positions: &[i32],
        tile_tokens: usize,
    ) -> AttentionTiles {
        AttentionTiles {
            folded: true,
            ..AttentionTiles::build(token_seq, positions, tile_tokens, token_seq.len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiles(
        seq: &[i32],
        pos: &[i32],
        t: usize,
        rows: usize,
    ) -> (Vec<(i32, i32)>, Vec<Range<usize>>) {
        let a = AttentionTiles::build(seq, pos, t, rows);
        let pairs = a.pairs.chunks(2).map(|p| (p[0], p[1])).collect();
        (pairs, a.groups)
    }

    #[test]
    fn tiles_cut_at_sequences_sizes_and_gaps() {
        // Sequence 0: positions 5..11 (7 tokens); sequence 1: 0..2; sequence 2: one token.
        let seq = [0, 0, 0, 0, 0, 0, 0, 1, 1, 2];
        let pos = [5, 6, 7, 8, 9, 10, 11, 0, 1, 40];
        let (pairs, groups) = tiles(&seq, &pos, 3, 100);
        assert_eq!(pairs, vec![(0, 3), (3, 3), (6, 1), (7, 2), (9, 1)]);
        assert_eq!(groups, vec![0..5]);
        let short = AttentionTiles::build(&[0, 1, 1], &[9, 4, 5], 8, 64);
        assert_eq!(
            short.tile_tokens, 2,
            "blocks sized by the longest tile built"
        );
    }

    #[test]
    fn tiles_never_cross_a_launch_group_and_count_from_its_start() {
        let seq = [0; 10];
        let pos: Vec<i32> = (0..10).collect();
        let (pairs, groups) = tiles(&seq, &pos, 4, 6);
        assert_eq!(pairs, vec![(0, 4), (4, 2), (0, 4)]);
        assert_eq!(groups, vec![0..2, 2..3]);
    }

    #[test]
    fn folding_blocks_take_the_batch_in_one_launch_group() {
        let seq = [0; 10];
        let pos: Vec<i32> = (0..10).collect();
        let a = AttentionTiles::build_folded(&seq, &pos, 4);
        assert!(a.folded);
        assert_eq!(a.groups, vec![0..3]);
        assert_eq!(a.pairs, vec![0, 4, 4, 4, 8, 2]);
        assert!(!AttentionTiles::build(&seq, &pos, 4, 6).folded);
    }

    #[test]
    fn one_launch_group_cut_either_way_is_the_same_table() {
        let seq = [0, 0, 0, 1, 1, 2, 2, 2, 2];
        let pos = [4, 5, 6, 0, 1, 7, 8, 9, 10];
        let folded = AttentionTiles::build_folded(&seq, &pos, 3);
        let grouped = AttentionTiles::build(&seq, &pos, 3, seq.len());
        assert_eq!(
            AttentionTiles {
                folded: false,
                ..folded
            },
            grouped
        );
    }

    #[test]
    fn a_position_gap_starts_a_new_tile() {
        let (pairs, _) = tiles(&[0, 0, 0], &[0, 1, 3], 8, 64);
        assert_eq!(pairs, vec![(0, 2), (2, 1)]);
    }

    #[test]
    fn every_token_is_in_exactly_one_tile() {
        let seq: Vec<i32> = (0..50).map(|i| i / 7).collect();
        let pos: Vec<i32> = (0..50).map(|i| i % 7 + 100).collect();
        for t in 1..9 {
            for rows in [1, 5, 13, 64] {
                let a = AttentionTiles::build(&seq, &pos, t, rows);
                let mut covered = vec![0; seq.len()];
                for (g, range) in a.groups.iter().enumerate() {
                    for k in range.clone() {
                        let (first, count) = (a.pairs[2 * k] as usize, a.pairs[2 * k + 1] as usize);
                        assert!(count >= 1 && count <= t);
                        assert!(first + count <= rows);
                        let abs = g * rows + first;
                        for c in &mut covered[abs..abs + count] {
                            *c += 1;
                        }
                        assert!(seq[abs..abs + count].iter().all(|&s| s == seq[abs]));
                    }
                }
                assert!(covered.iter().all(|&c| c == 1), "t {t} rows {rows}");
            }
        }
        assert!(AttentionTiles::build(&[], &[], 4, 8).groups.is_empty());
    }

    #[test]
    fn tile_size_follows_the_group_and_the_shared_memory() {
        assert_eq!(tokens_per_tile(4, 64, 2, 48 << 10), 4);
        assert_eq!(tokens_per_tile(3, 64, 2, 48 << 10), 5);
        assert_eq!(tokens_per_tile(32, 64, 2, 48 << 10), 1);
        assert_eq!(tokens_per_tile(1, 64, 2, 227 << 10), 16);
        // f32 rows of 256 dimensions: two stages alone take 133 KiB.
        let big = shared_bytes(4, 1, 256, 4);
        assert!(big > 48 << 10);
        assert_eq!(tokens_per_tile(4, 256, 4, big), 1);
        let t = tokens_per_tile(4, 128, 2, 64 << 10);
        assert!(shared_bytes(4, t, 128, 2) <= 64 << 10 && t >= 1);
    }
}
