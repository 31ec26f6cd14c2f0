//! Activation rows rounded to 8 bits, one scale per block of 32, as the int8 kernels read them.

use super::BLOCK;
use crate::isa::{self, Isa};
use crate::matmul::with_scratch;
use crate::ops::rms_norm_with;
use crate::parallel::for_each_chunk_pair_mut;
use crate::simd::Kernels;
use crate::ThreadPool;

/// The scale of one quantized block of 32 activations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockScale {
    /// `d = max|x| / 127`.
    pub d: f32,
    /// `Σ q` over the block.
    pub sum: i32,
    /// `Σ q` over the block's first 16 values (for Q6_K's groups of 16).
    pub sum_lo: i32,
    /// `d · Σ q` (one rounded product).
    pub sx: f32,
}

/// `n_tokens` activation rows quantized per block of [`BLOCK`] columns:
/// `x ≈ q·d` with `d = max|x| / 127` and `q = round(x · (1/d))` (to nearest, ties to even;
/// an all-zero block has `d = 0`, `q = 0`). Each token's row is quantized on its own: its values
/// never depend on the other rows.
#[derive(Debug, Clone)]
pub struct QuantizedRows {
    /// Rows held (also when `cols` is 0 and they hold nothing).
    n_tokens: usize,
    cols: usize,
    /// `[n_tokens, cols]`.
    q: Vec<i8>,
    /// `[n_tokens, cols / 32]`.
    scales: Vec<BlockScale>,
}

impl QuantizedRows {
    /// No rows; a buffer for the `*_into` methods, which reuse its memory.
    pub fn empty() -> QuantizedRows {
        QuantizedRows {
            n_tokens: 0,
            cols: 0,
            q: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Quantizes `x` (`[n_tokens, cols]`, `cols` a multiple of 32) with the scalar reference.
    pub fn new(x: &[f32], n_tokens: usize, cols: usize) -> QuantizedRows {
        let mut rows = QuantizedRows::empty();
        rows.reshape(x.len(), n_tokens, cols);
        if cols > 0 {
            let per_row = cols / BLOCK;
            for ((x, q), s) in x
                .chunks_exact(cols)
                .zip(rows.q.chunks_exact_mut(cols))
                .zip(rows.scales.chunks_exact_mut(per_row))
            {
                quantize_row(x, q, s);
            }
        }
        rows
    }

    /// [`QuantizedRows::new`] with the kernels of `isa` (bitwise equal), one task per token
    /// on `pool`.
    pub fn quantize_with(
        isa: Isa,
        pool: &ThreadPool,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> QuantizedRows {
        let mut rows = QuantizedRows::empty();
        rows.quantize_into_with(isa, pool, x, n_tokens, cols);
        rows
    }

    /// [`QuantizedRows::quantize_with`] the process-wide kernels.
    pub fn quantize(pool: &ThreadPool, x: &[f32], n_tokens: usize, cols: usize) -> QuantizedRows {
        QuantizedRows::quantize_with(isa::active(), pool, x, n_tokens, cols)
    }

    /// [`QuantizedRows::quantize`] into this buffer (its memory reused; no allocation once it
    /// has held as many rows).
    pub fn quantize_into(&mut self, pool: &ThreadPool, x: &[f32], n_tokens: usize, cols: usize) {
        self.quantize_into_with(isa::active(), pool, x, n_tokens, cols);
    }

    /// [`QuantizedRows::quantize_into`] with the kernels of `isa`.
    pub fn quantize_into_with(
        &mut self,
        isa: Isa,
        pool: &ThreadPool,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) {
        self.fill_rows(isa, pool, x.len(), n_tokens, cols, |kernels, t, q, s| {
            kernels.quantize_row(&x[t * cols..(t + 1) * cols], q, s);
        });
    }

    /// Fused RMSNorm and quantization: the rows of [`crate::ops::rms_norm`]`(x, weight, eps)`
    /// quantized, bitwise what quantizing the normed rows gives, without writing them out
    /// (each row is normed into its thread's scratch row, still in L1 when it is quantized).
    /// Process-wide kernels.
    pub fn rms_norm_quantize_into(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        n_tokens: usize,
    ) {
        self.rms_norm_quantize_into_with(isa::active(), pool, x, weight, eps, n_tokens);
    }

    /// [`QuantizedRows::rms_norm_quantize_into`] with the kernels of `isa`.
    pub fn rms_norm_quantize_into_with(
        &mut self,
        isa: Isa,
        pool: &ThreadPool,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        n_tokens: usize,
    ) {
        let cols = weight.len();
        self.fill_rows(isa, pool, x.len(), n_tokens, cols, |kernels, t, q, s| {
            let row = &x[t * cols..(t + 1) * cols];
            with_scratch(cols, |normed| {
                rms_norm_with(isa, row, weight, eps, normed);
                kernels.quantize_row(normed, q, s);
            });
        });
    }

    /// Sizes the buffers for `n_tokens` rows of `cols` (from an input of `x_len` values) and
    /// fills row `t` with `row(kernels, t, values, scales)`, one task per token on `pool`.
    fn fill_rows<F>(
        &mut self,
        isa: Isa,
        pool: &ThreadPool,
        x_len: usize,
        n_tokens: usize,
        cols: usize,
        row: F,
    ) where
        F: Fn(&Kernels, usize, &mut [i8], &mut [BlockScale]) + Sync,
    {
        let kernels = Kernels::new(isa)
            .unwrap_or_else(|| panic!("quantized rows: this CPU cannot run the {isa} kernels"));
        self.reshape(x_len, n_tokens, cols);
        if cols > 0 && n_tokens > 0 {
            let per_row = cols / BLOCK;
            for_each_chunk_pair_mut(
                pool,
                &mut self.q,
                cols,
                &mut self.scales,
                per_row,
                |t, q, s| row(&kernels, t, q, s),
            );
        }
    }

    /// Sizes the buffers for `[n_tokens, cols]` (contents unspecified until written).
    fn reshape(&mut self, x_len: usize, n_tokens: usize, cols: usize) {
        assert!(
            cols.is_multiple_of(BLOCK) && x_len == n_tokens * cols,
            "quantized rows: x must be [n_tokens, cols] with cols a multiple of {BLOCK}"
        );
        self.n_tokens = n_tokens;
        self.cols = cols;
        self.q.resize(x_len, 0);
        self.scales.resize(x_len / BLOCK, BlockScale::default());
    }

    /// Gives back the memory beyond the rows now held when it exceeds `slack` bytes (a buffer
    /// that once held a long prefill chunk need not keep that size for the decode steps).
    pub fn release_excess(&mut self, slack: usize) {
        let spare = (self.q.capacity() - self.q.len())
            + (self.scales.capacity() - self.scales.len()) * std::mem::size_of::<BlockScale>();
        if spare > slack {
            self.q.shrink_to_fit();
            self.scales.shrink_to_fit();
        }
    }

    /// Number of token rows.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Token `t`'s quantized values (`cols` of them).
    pub fn q(&self, t: usize) -> &[i8] {
        &self.q[t * self.cols..(t + 1) * self.cols]
    }

    /// Token `t`'s block scales.
    pub fn scales(&self, t: usize) -> &[BlockScale] {
        let n = self.cols / BLOCK;
        &self.scales[t * n..(t + 1) * n]
    }
}

/// The scalar reference for one row: `x` (`32·k` values) into `q` and `k` block scales.
pub(crate) fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale]) {
    assert!(
        x.len() == q.len() && x.len() == scales.len() * BLOCK,
        "quantize_row: shapes do not match"
    );
    for ((xb, qb), s) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(scales.iter_mut())
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = round_to_i8(v * id);
        }
        let sum_of = |q: &[i8]| q.iter().map(|&v| i32::from(v)).sum::<i32>();
        let sum = sum_of(qb);
        *s = BlockScale {
            d,
            sum,
            sum_lo: sum_of(&qb[..16]),
            sx: d * sum as f32,
        };
    }
}

/// `v` (with `|v| ≤ 127.5`) rounded to the nearest integer, ties to even, as `i8`. Adding and
/// subtracting 1.5·2^23 rounds in the FPU's default mode (to nearest even) without a call to
/// libm, so the loop vectorizes.
#[inline(always)]
fn round_to_i8(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (((v + MAGIC) - MAGIC) as i32).clamp(-127, 127) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (126.6, 127),
            (-127.4, -127),
            (0.49, 0),
            (3.0, 3),
        ] {
            assert_eq!(round_to_i8(v), want, "{v}");
            assert_eq!(
                f32::from(round_to_i8(v)),
                v.round_ties_even().clamp(-127.0, 127.0)
            );
        }
    }

    #[test]
    fn blocks_scale_by_their_largest_magnitude() {
        let mut x = vec![0.0f32; 64];
        x[3] = -2.54;
        x[5] = 1.27;
        x[40] = 0.5;
        let q = QuantizedRows::new(&x, 1, 64);
        assert_eq!(q.scales(0)[0].d, 2.54 / 127.0);
        assert_eq!(q.scales(0)[1].d, 0.5 / 127.0);
        assert_eq!(q.q(0)[3], -127);
        assert_eq!(q.q(0)[5], 64); // 63.5 ties to even
        assert_eq!(q.q(0)[40], 127);
        assert_eq!((q.scales(0)[0].sum, q.scales(0)[1].sum), (-63, 127));
        assert_eq!((q.scales(0)[0].sum_lo, q.scales(0)[1].sum_lo), (-63, 127));
        assert_eq!(q.scales(0)[1].sx, 0.5 / 127.0 * 127.0);
    }
}
