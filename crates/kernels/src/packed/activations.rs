//! Activation rows rounded to 8 bits, one scale per block of 32, as the int8 kernels read them.

use super::BLOCK;

/// `n_tokens` activation rows quantized per block of [`BLOCK`] columns:
/// `x ≈ q·d` with `d = max|x| / 127` and `q = round(x · (1/d))` (to nearest, ties to even;
/// an all-zero block has `d = 0`, `q = 0`). Each token's row is quantized on its own: its values never
/// depend on the other rows.
#[derive(Debug, Clone)]
pub struct QuantizedRows {
    cols: usize,
    /// `[n_tokens, cols]`.
    q: Vec<i8>,
    /// `[n_tokens, cols / 32]`: the scale `d`.
    d: Vec<f32>,
    /// `[n_tokens, cols / 32]`: `Σ q` over the block.
    sum: Vec<i32>,
    /// `[n_tokens, cols / 32]`: `d · Σ q` (one rounded product).
    sx: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes `x` (`[n_tokens, cols]`, `cols` a multiple of 32).
    pub fn new(x: &[f32], n_tokens: usize, cols: usize) -> QuantizedRows {
        assert!(
            cols.is_multiple_of(BLOCK) && x.len() == n_tokens * cols,
            "quantized rows: x must be [n_tokens, cols] with cols a multiple of {BLOCK}"
        );
        let n_blocks = x.len() / BLOCK;
        let mut rows = QuantizedRows {
            cols,
            q: vec![0; x.len()],
            d: Vec::with_capacity(n_blocks),
            sum: Vec::with_capacity(n_blocks),
            sx: Vec::with_capacity(n_blocks),
        };
        for (xb, qb) in x.chunks_exact(BLOCK).zip(rows.q.chunks_exact_mut(BLOCK)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = round_to_i8(v * id);
            }
            for &q in qb.iter() {
                sum += i32::from(q);
            }
            rows.d.push(d);
            rows.sum.push(sum);
            rows.sx.push(d * sum as f32);
        }
        rows
    }

    /// Number of token rows.
    pub fn n_tokens(&self) -> usize {
        self.q.len().checked_div(self.cols).unwrap_or(0)
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Token `t`'s quantized values (`cols` of them).
    pub fn q(&self, t: usize) -> &[i8] {
        &self.q[t * self.cols..(t + 1) * self.cols]
    }

    /// Token `t`'s per-block scales `d`.
    pub fn d(&self, t: usize) -> &[f32] {
        let n = self.cols / BLOCK;
        &self.d[t * n..(t + 1) * n]
    }

    /// Token `t`'s per-block sums `Σ q`.
    pub fn sum(&self, t: usize) -> &[i32] {
        let n = self.cols / BLOCK;
        &self.sum[t * n..(t + 1) * n]
    }

    /// Token `t`'s per-block `d · Σ q`.
    pub fn sx(&self, t: usize) -> &[f32] {
        let n = self.cols / BLOCK;
        &self.sx[t * n..(t + 1) * n]
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
        assert_eq!(q.d(0), &[2.54 / 127.0, 0.5 / 127.0]);
        assert_eq!(q.q(0)[3], -127);
        assert_eq!(q.q(0)[5], 64); // 63.5 ties to even
        assert_eq!(q.q(0)[40], 127);
        assert_eq!(q.sum(0), &[-63, 127]);
        assert_eq!(q.sx(0)[1], 0.5 / 127.0 * 127.0);
    }
}
