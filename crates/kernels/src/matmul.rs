//! Matrix products of quantized or float weights with f32 activations.
//!
//! `y[t, r] = Σ_c W[r, c] · x[t, c]`. The output rows `r` are split into chunks over the
//! thread pool. Within a chunk, weight rows are dequantized a few at a time into a per-thread
//! scratch buffer (never the whole matrix) and each is dotted with every token row, so the
//! weight bytes are read once per call however many tokens there are.
//!
//! Determinism: every `y[t, r]` is computed by the same sequence of f32 operations —
//! [`LANES`] independent accumulators over the column index (column `c` goes to accumulator
//! `c % LANES`, in increasing `c`), then a fixed pairwise tree — whatever `n_tokens`, the
//! thread count or the chunking. A token's result is therefore bitwise identical alone or in
//! any batch.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

use crate::quant::dequantize_row;
use crate::{DType, ThreadPool};

/// Independent accumulators of the f32 dot product (fixed: part of the numeric contract).
pub const LANES: usize = 16;
/// Weight rows dequantized together so that each activation row is loaded once per group.
const ROW_GROUP: usize = 4; // the width of `dot_4`
/// Target number of chunks per thread (load balance vs per-task overhead).
const CHUNKS_PER_THREAD: usize = 4;

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

/// `y[t, r] = Σ_c W[r, c] · x[t, c]` for `t < n_tokens`.
/// `x`: `[n_tokens, cols]`, `y`: `[n_tokens, rows]`.
///
/// Panics if the shapes do not match (a caller bug).
pub fn matmul(pool: &ThreadPool, w: &WeightView<'_>, x: &[f32], y: &mut [f32], n_tokens: usize) {
    let row_bytes = w.dtype.bytes_for(w.cols);
    assert!(
        row_bytes.and_then(|b| b.checked_mul(w.rows)) == Some(w.data.len()),
        "matmul: weight data of {} bytes is not [{}, {}] {}",
        w.data.len(),
        w.rows,
        w.cols,
        w.dtype
    );
    let row_bytes = row_bytes.expect("checked just above");
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x must be [n_tokens, cols]"
    );
    assert_eq!(
        y.len(),
        n_tokens * w.rows,
        "matmul: y must be [n_tokens, rows]"
    );
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    if w.cols == 0 {
        y.fill(0.0); // empty sums
        return;
    }
    let chunk = chunk_rows(w.rows, pool.n_threads());
    for_each_column_chunk(pool, y, n_tokens, w.rows, chunk, |rows, out| {
        with_scratch(ROW_GROUP * w.cols, |scratch| {
            matmul_rows(w, row_bytes, x, rows, out, scratch);
        });
    });
}

/// Rows per task: about [`CHUNKS_PER_THREAD`] tasks per thread, a multiple of [`ROW_GROUP`].
fn chunk_rows(rows: usize, n_threads: usize) -> usize {
    let per_task = rows.div_ceil(n_threads * CHUNKS_PER_THREAD);
    per_task.div_ceil(ROW_GROUP).max(1) * ROW_GROUP
}

/// Computes `out[t, r] = W[r] · x[t]` for `r` in `rows`, `ROW_GROUP` weight rows at a time.
/// `scratch` holds at least `ROW_GROUP · cols` floats.
fn matmul_rows(
    w: &WeightView<'_>,
    row_bytes: usize,
    x: &[f32], // [n_tokens, cols]
    rows: Range<usize>,
    out: &mut ColumnsMut<'_>,
    scratch: &mut [f32], // [ROW_GROUP, cols]
) {
    let cols = w.cols;
    let mut r = rows.start;
    while r < rows.end {
        let n = ROW_GROUP.min(rows.end - r);
        let src = &w.data[r * row_bytes..(r + n) * row_bytes];
        for (row, dst) in src
            .chunks_exact(row_bytes)
            .zip(scratch.chunks_exact_mut(cols))
        {
            dequantize_row(w.dtype, row, dst);
        }
        let j = r - rows.start;
        for (t, xt) in x.chunks_exact(cols).enumerate() {
            if n == ROW_GROUP {
                let wr = std::array::from_fn(|i| &scratch[i * cols..(i + 1) * cols]);
                for (i, v) in dot_4(wr, xt).into_iter().enumerate() {
                    out.set(t, j + i, v);
                }
            } else {
                for i in 0..n {
                    out.set(t, j + i, dot_1(&scratch[i * cols..(i + 1) * cols], xt));
                }
            }
        }
        r += n;
    }
}

/// `w · x` in the fixed reduction order of the module docs; `w.len() == x.len()`.
#[inline(never)]
fn dot_1(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (wc, xc) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        mac(&mut acc, wc, xc);
    }
    mac_tail(&mut acc, w, x);
    tree_sum(&acc)
}

/// `[w[0]·x, …, w[3]·x]`, each row bitwise equal to [`dot_1`] (same operations per row); the
/// activation chunk is loaded once for the four rows. Every `w[i]` has `x.len()` elements.
#[inline(never)]
fn dot_4(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    let mut acc = [[0.0f32; LANES]; 4];
    let rows = w[0].chunks_exact(LANES).zip(w[1].chunks_exact(LANES));
    let rows = rows
        .zip(w[2].chunks_exact(LANES))
        .zip(w[3].chunks_exact(LANES));
    for ((((w0, w1), w2), w3), xc) in rows.zip(x.chunks_exact(LANES)) {
        mac(&mut acc[0], w0, xc);
        mac(&mut acc[1], w1, xc);
        mac(&mut acc[2], w2, xc);
        mac(&mut acc[3], w3, xc);
    }
    for (acc, w) in acc.iter_mut().zip(w) {
        mac_tail(acc, w, x);
    }
    acc.map(|a| tree_sum(&a))
}

/// `acc[l] += w[l] · x[l]` for the `LANES` lanes (`w`, `x` are one chunk of `LANES`).
#[inline(always)]
fn mac(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let (w, x) = (&w[..LANES], &x[..LANES]);
    for l in 0..LANES {
        acc[l] += w[l] * x[l];
    }
}

/// The last `len % LANES` columns: column `full + l` goes to lane `l`.
#[inline(always)]
fn mac_tail(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let full = x.len() - x.len() % LANES;
    for ((a, &wv), &xv) in acc.iter_mut().zip(&w[full..]).zip(&x[full..]) {
        *a += wv * xv;
    }
}

/// Pairwise sum of the lanes in a fixed order: halves added lane-wise until one is left
/// (`v[l] += v[l + 8]`, then `+ v[l + 4]`, `+ v[l + 2]`, `+ v[l + 1]`).
///
/// Not inlined on purpose: when LLVM sees this tree next to the accumulation loop, its SLP
/// vectorizer splits the accumulators into 2-lane vectors and the loop runs at half width.
#[inline(never)]
fn tree_sum(a: &[f32; LANES]) -> f32 {
    let mut v = *a;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

thread_local! {
    /// Per-thread dequantization scratch, reused across calls (grows, never shrinks).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a scratch buffer of `len` floats: the thread's reusable one, or a fresh one if
/// that is already borrowed (a nested call).
fn with_scratch(len: usize, f: impl FnOnce(&mut [f32])) {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len]);
        }
        Err(_) => f(&mut vec![0.0; len]),
    });
}

/// Splits the columns of `y` (`[n_tokens, rows]`) into chunks of `chunk` consecutive columns
/// and runs `f(columns, view)` for each on the pool; `view` writes only those columns.
fn for_each_column_chunk<F>(
    pool: &ThreadPool,
    y: &mut [f32], // [n_tokens, rows]
    n_tokens: usize,
    rows: usize,
    chunk: usize,
    f: F,
) where
    F: Fn(Range<usize>, &mut ColumnsMut<'_>) + Sync,
{
    assert!(
        chunk > 0 && y.len() == n_tokens * rows,
        "column chunks: bad shape"
    );
    let base = SendPtr(y.as_mut_ptr());
    pool.run(rows.div_ceil(chunk), |task| {
        let start = task * chunk;
        let end = (start + chunk).min(rows);
        // SAFETY: `y` is exclusively borrowed for this whole call, and `ThreadPool::run` calls
        // each task index exactly once, so the column ranges of live views are disjoint; every
        // write is bounds-checked against `start..end` and `n_tokens`.
        let mut view = unsafe { ColumnsMut::new(base, n_tokens, rows, start..end) };
        f(start..end, &mut view);
    });
}

/// A raw pointer to the output that may cross to the pool's threads.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to build `ColumnsMut` views over disjoint columns (see `ColumnsMut::new`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Write access to columns `start..end` of a `[n_tokens, stride]` f32 matrix.
struct ColumnsMut<'a> {
    base: *mut f32,
    n_tokens: usize,
    stride: usize,
    columns: Range<usize>,
    _borrow: PhantomData<&'a mut [f32]>,
}

impl ColumnsMut<'_> {
    /// # Safety
    /// `base` must point to `n_tokens · stride` writable floats that outlive the view, with
    /// `columns` within `0..stride`, and no other live reference or view may access those
    /// columns while this view exists.
    unsafe fn new(base: SendPtr, n_tokens: usize, stride: usize, columns: Range<usize>) -> Self {
        assert!(columns.start <= columns.end && columns.end <= stride);
        ColumnsMut {
            base: base.0,
            n_tokens,
            stride,
            columns,
            _borrow: PhantomData,
        }
    }

    /// Sets element `[t, columns.start + j]`.
    #[inline(always)]
    fn set(&mut self, t: usize, j: usize, v: f32) {
        let c = self.columns.start + j;
        assert!(
            t < self.n_tokens && c < self.columns.end,
            "column view: out of bounds"
        );
        // SAFETY: in bounds of the matrix (checked above) and in this view's columns, which no
        // other thread accesses (contract of `new`).
        unsafe { *self.base.add(t * self.stride + c) = v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multi-row kernel must give each row the bits of the single-row kernel, so the row
    /// grouping (which depends on the chunking) never changes a result.
    #[test]
    fn grouped_rows_match_single_rows_bitwise() {
        for n in [1, 15, 16, 17, 64, 100, 1536] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1000) as f32 / 337.0 - 1.3)
                .collect();
            let w: Vec<Vec<f32>> = (0..ROW_GROUP)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 31 + r * 17) % 101) as f32 / 7.0 - 6.9)
                        .collect()
                })
                .collect();
            let grouped = dot_4(std::array::from_fn(|r| &w[r][..]), &x);
            for (r, g) in grouped.iter().enumerate() {
                let single = dot_1(&w[r], &x);
                assert_eq!(g.to_bits(), single.to_bits(), "n={n} row {r}");
                let exact: f64 = w[r]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let mag: f64 = w[r]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                assert!(
                    (f64::from(single) - exact).abs() <= 1e-6 * mag,
                    "n={n}: {single} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn tree_sum_adds_in_the_documented_order() {
        let a: [f32; LANES] = std::array::from_fn(|i| (i as f32 + 1.0) * 0.1);
        let mut h = a;
        for width in [8, 4, 2, 1] {
            for l in 0..width {
                h[l] += h[l + width];
            }
        }
        assert_eq!(tree_sum(&a).to_bits(), h[0].to_bits());
    }

    #[test]
    fn chunks_are_whole_row_groups() {
        for rows in [1, 4, 5, 37, 576, 1536] {
            for threads in [1, 2, 3, 16] {
                let c = chunk_rows(rows, threads);
                assert!(c.is_multiple_of(ROW_GROUP) && c > 0);
                assert!(rows.div_ceil(c) <= threads * CHUNKS_PER_THREAD);
            }
        }
    }
}
