//! The tile kernel's working buffers: set up once for a tile of query rows and reused for
//! every partition of their contexts, so that a long context costs no more set-up per
//! position than a short one.

use super::{POS_BLOCK, TILE_HEAD_DIM_MAX, TILE_ROWS};
use crate::dot16::LANES;

/// Buffers of the tile kernel, on cache-line boundaries (every field is a whole number of
/// 64-byte lines, so that no vector load of one straddles two lines).
#[repr(C, align(64))]
pub(crate) struct TileWork {
    /// The queries transposed: `qt[c · TILE_ROWS + i] = q[i][c]`, lanes past the tile's
    /// rows 0.
    pub qt: [f32; TILE_HEAD_DIM_MAX * TILE_ROWS],
    /// A block's keys widened to f32, `[POS_BLOCK, head_dim]`.
    pub kt: [f32; POS_BLOCK * TILE_HEAD_DIM_MAX],
    /// A block's values widened to f32, `[POS_BLOCK, head_dim]`.
    pub vt: [f32; POS_BLOCK * TILE_HEAD_DIM_MAX],
    /// Scores, then probabilities: `s[j][i]` for position `j` of the block and row `i`.
    pub s: [[f32; TILE_ROWS]; POS_BLOCK],
    /// The partial sums of the dots: `part[t · POS_BLOCK + j]` (lane `i`) for the columns
    /// `c ≡ t (mod 16)`.
    pub part: [[f32; TILE_ROWS]; LANES * POS_BLOCK],
}

impl TileWork {
    /// Buffers for the query rows `q` (`[n, head_dim]`, at most [`TILE_ROWS`] rows of at most
    /// [`TILE_HEAD_DIM_MAX`]).
    pub(crate) fn new(q: &[f32], head_dim: usize) -> TileWork {
        assert!(
            head_dim > 0
                && head_dim <= TILE_HEAD_DIM_MAX
                && q.len().is_multiple_of(head_dim)
                && q.len() / head_dim <= TILE_ROWS,
            "TileWork: {} query elements of head_dim {head_dim}",
            q.len()
        );
        let mut work = TileWork {
            qt: [0.0; TILE_HEAD_DIM_MAX * TILE_ROWS],
            kt: [0.0; POS_BLOCK * TILE_HEAD_DIM_MAX],
            vt: [0.0; POS_BLOCK * TILE_HEAD_DIM_MAX],
            s: [[0.0; TILE_ROWS]; POS_BLOCK],
            part: [[0.0; TILE_ROWS]; LANES * POS_BLOCK],
        };
        for (i, row) in q.chunks_exact(head_dim).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                work.qt[c * TILE_ROWS + i] = x;
            }
        }
        work
    }
}
