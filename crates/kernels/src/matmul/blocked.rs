//! The multi-token f32 path of [`super::matmul_with`]: cache blocking over weight rows and
//! tokens around a register-blocked micro-kernel.
//!
//! A task's rows are processed in blocks of [`Blocking::rows`] rows, each dequantized once into
//! the thread's scratch (`rows · cols · 4` bytes, sized to stay in the core's L2 cache). Each
//! block is dotted with the tokens one tile of [`Blocking::tokens`] token rows at a time; a
//! tile's activations (`tokens · cols · 4` bytes, also sized for L2) are fetched from memory
//! once per block and then reused by every 4-row group of the block, instead of being streamed
//! from memory once per 4 rows when all tokens do not fit in cache. Within a tile the
//! micro-kernel computes 4 rows × 4 tokens (16 accumulators) per pass over the columns.
//!
//! Blocking only changes *when* each (row, token) dot is computed, never *how*: each is still
//! one kernel call over all its columns in the fixed order of [`crate::dot16`], so the results
//! are bitwise identical to the unblocked loop, to the scalar reference, and across batch
//! sizes, tile sizes and thread counts.

use std::ops::Range;

use super::{ColumnsMut, WeightView, ROW_GROUP};
use crate::simd::Kernels;

/// Target bytes of one block of dequantized weight rows (f32).
const ROW_BLOCK_BYTES: usize = 128 * 1024;
/// Target bytes of one tile of activation rows (f32).
const TOKEN_TILE_BYTES: usize = 256 * 1024;
/// Tokens per micro-kernel call (the width of `dot_4x4`).
const TOKEN_GROUP: usize = 4;

/// Block sizes of the multi-token path (both positive; `rows` a multiple of [`ROW_GROUP`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Blocking {
    /// Weight rows dequantized together.
    pub(super) rows: usize,
    /// Token rows per tile.
    pub(super) tokens: usize,
}

impl Blocking {
    /// The blocking for rows of `cols` elements in tasks of `chunk` rows: row blocks of at
    /// most [`ROW_BLOCK_BYTES`] that split `chunk` evenly (in whole row groups), and token
    /// tiles of at most [`TOKEN_TILE_BYTES`] in whole token groups (at least one group).
    pub(super) fn for_shape(cols: usize, chunk: usize) -> Blocking {
        let row_bytes = cols.max(1) * std::mem::size_of::<f32>();
        let max_rows = (ROW_BLOCK_BYTES / row_bytes / ROW_GROUP).max(1) * ROW_GROUP;
        let n_blocks = chunk.max(1).div_ceil(max_rows);
        let rows = chunk.max(1).div_ceil(n_blocks).div_ceil(ROW_GROUP) * ROW_GROUP;
        let tokens = (TOKEN_TILE_BYTES / row_bytes / TOKEN_GROUP).max(1) * TOKEN_GROUP;
        Blocking { rows, tokens }
    }
}

/// Computes `out[t, r − rows.start] = W[r] · x[t]` for `r` in `rows` and every token.
/// `scratch` holds at least `blocking.rows · cols` floats.
#[allow(clippy::too_many_arguments)] // the matmul's operands plus the derived sizes
pub(super) fn matmul_rows(
    kernels: &Kernels,
    w: &WeightView<'_>,
    row_bytes: usize,
    x: &[f32], // [n_tokens, cols]
    rows: Range<usize>,
    out: &mut ColumnsMut<'_>,
    scratch: &mut [f32], // [blocking.rows, cols]
    blocking: Blocking,
) {
    let cols = w.cols;
    let tile_len = blocking.tokens * cols;
    let mut r = rows.start;
    while r < rows.end {
        let n = blocking.rows.min(rows.end - r);
        let block = &mut scratch[..n * cols]; // [n, cols]
        let src = &w.data[r * row_bytes..(r + n) * row_bytes];
        for (row, dst) in src
            .chunks_exact(row_bytes)
            .zip(block.chunks_exact_mut(cols))
        {
            kernels.dequantize_row(w.dtype, row, dst);
        }
        for (k, xs) in x.chunks(tile_len).enumerate() {
            let at = Pos {
                t: k * blocking.tokens,
                j: r - rows.start,
            };
            tile(kernels, block, xs, cols, at, out);
        }
        r += n;
    }
}

/// Where a tile's results go: token `t` and view column `j` of its first row and token.
#[derive(Clone, Copy)]
struct Pos {
    t: usize,
    j: usize,
}

/// `out[at.t + t, at.j + i] = block[i] · xs[t]` for every row `i` of `block` and token `t` of
/// `xs`, four rows at a time (then one).
fn tile(
    kernels: &Kernels,
    block: &[f32], // [n, cols]
    xs: &[f32],    // [tile tokens, cols]
    cols: usize,
    at: Pos,
    out: &mut ColumnsMut<'_>,
) {
    let mut groups = block.chunks_exact(ROW_GROUP * cols);
    let mut j = at.j;
    for g in groups.by_ref() {
        let wr: [&[f32]; ROW_GROUP] = std::array::from_fn(|i| &g[i * cols..(i + 1) * cols]);
        row_group(kernels, wr, xs, Pos { t: at.t, j }, out);
        j += ROW_GROUP;
    }
    for wi in groups.remainder().chunks_exact(cols) {
        for (t, xt) in xs.chunks_exact(cols).enumerate() {
            out.set(at.t + t, j, kernels.dot_1(wi, xt));
        }
        j += 1;
    }
}

/// `out[at.t + t, at.j + i] = w[i] · xs[t]` for the four rows and every token of `xs`: four
/// tokens at a time, then two, then one.
fn row_group(
    kernels: &Kernels,
    w: [&[f32]; ROW_GROUP],
    xs: &[f32], // [tile tokens, cols]
    at: Pos,
    out: &mut ColumnsMut<'_>,
) {
    let cols = w[0].len();
    let mut put = |t: usize, vals: [f32; ROW_GROUP]| {
        for (i, v) in vals.into_iter().enumerate() {
            out.set(t, at.j + i, v);
        }
    };
    let mut quads = xs.chunks_exact(TOKEN_GROUP * cols);
    let mut t = at.t;
    for q in quads.by_ref() {
        let x4: [&[f32]; TOKEN_GROUP] = std::array::from_fn(|k| &q[k * cols..(k + 1) * cols]);
        for vals in kernels.dot_4x4(w, x4) {
            put(t, vals);
            t += 1;
        }
    }
    let mut pairs = quads.remainder().chunks_exact(2 * cols);
    for p in pairs.by_ref() {
        let (x0, x1) = p.split_at(cols);
        for vals in kernels.dot_4x2(w, [x0, x1]) {
            put(t, vals);
            t += 1;
        }
    }
    if !pairs.remainder().is_empty() {
        put(t, kernels.dot_4(w, pairs.remainder()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_whole_groups_within_their_budgets() {
        for cols in [1, 16, 64, 576, 1536, 8192, 100_000] {
            for chunk in [1, 4, 24, 72, 192, 6144] {
                let b = Blocking::for_shape(cols, chunk);
                assert!(
                    b.rows > 0 && b.rows.is_multiple_of(ROW_GROUP),
                    "{cols} {chunk}"
                );
                assert!(b.tokens > 0 && b.tokens.is_multiple_of(TOKEN_GROUP));
                let row_bytes = cols * 4;
                if ROW_GROUP * row_bytes <= ROW_BLOCK_BYTES {
                    assert!(
                        b.rows * row_bytes <= ROW_BLOCK_BYTES,
                        "{cols} {chunk}: {b:?}"
                    );
                }
                if TOKEN_GROUP * row_bytes <= TOKEN_TILE_BYTES {
                    assert!(b.tokens * row_bytes <= TOKEN_TILE_BYTES);
                }
                // Blocks split the chunk evenly: never a last block of a few rows.
                assert!(b.rows < chunk + ROW_GROUP);
            }
        }
    }
}
