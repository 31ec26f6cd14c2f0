//! Matrix products of quantized or float weights with f32 activations.
//! (Being written: see the kernels work item.)

use crate::{DType, ThreadPool};

/// A weight matrix `[rows, cols]` in its stored format; each row is `cols` elements.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> WeightView<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Option<Self> {
        let row_bytes = dtype.bytes_for(cols)?;
        (row_bytes.checked_mul(rows)? == data.len()).then_some(WeightView {
            dtype,
            rows,
            cols,
            data,
        })
    }
}

/// `y[t, r] = sum_c W[r, c] * x[t, c]` for `t < n_tokens`.
/// `x`: `[n_tokens, cols]`, `y`: `[n_tokens, rows]`.
pub fn matmul(pool: &ThreadPool, w: &WeightView<'_>, x: &[f32], y: &mut [f32], n_tokens: usize) {
    let _ = (pool, w, x, y, n_tokens);
    unimplemented!("kernels work item")
}
