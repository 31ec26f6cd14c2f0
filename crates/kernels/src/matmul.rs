//! Matrix products of quantized or float weights with f32 activations.
//!
//! `y[t, r] = Σ_c W[r, c] · x[t, c]`. The output rows `r` are split into chunks over the
//! thread pool. Within a chunk, weight rows are dequantized a block at a time into a
//! per-thread scratch buffer (never the whole matrix) and each block is dotted with every
//! token row, one cache-sized tile of tokens at a time (see `blocked`), so the weight bytes
//! are read once per call however many tokens there are.
//!
//! With one token (decode) and a SIMD [`Isa`], each stored row is instead decoded 16 columns
//! at a time straight into the accumulators (no scratch), which gives the same bits.
//!
//! Determinism: every `y[t, r]` is computed by the same sequence of f32 operations —
//! [`LANES`] independent accumulators over the column index (column `c` goes to accumulator
//! `c % LANES`, in increasing `c`), then a fixed pairwise tree (see [`crate::dot16`]) —
//! whatever `n_tokens`, the thread count or the chunking. A token's result is therefore
//! bitwise identical alone or in any batch.
//!
//! Variants: [`Isa::Scalar`], [`Isa::Avx2`] and [`Isa::Avx512`] all perform exactly these
//! operations (separate multiply and add, never FMA), so **these variants are bitwise equal
//! to the scalar reference**, and results do not depend on the machine's ISA either.
//! The int8 variants ([`Isa::Avx2Int8`], [`Isa::Avx512Int8`], the default where available)
//! run quantized weights (all but Q2_K) through [`crate::packed`] instead: matrices
//! repacked at load, activations quantized to 8 bits, integer dot products in a fixed order
//! (see `packed` for it and the error bound): still batch- and thread-invariant, but not
//! equal to scalar.

mod blocked;

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

pub use crate::dot16::LANES;
use crate::isa::{self, Isa};
use crate::packed::GroupOut;
use crate::simd::Kernels;
use crate::{DType, ThreadPool};
use blocked::Blocking;

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

/// `y[t, r] = Σ_c W[r, c] · x[t, c]` for `t < n_tokens`, with the process-wide kernels
/// ([`isa::active`]).
/// `x`: `[n_tokens, cols]`, `y`: `[n_tokens, rows]`.
///
/// Panics if the shapes do not match (a caller bug).
pub fn matmul(pool: &ThreadPool, w: &WeightView<'_>, x: &[f32], y: &mut [f32], n_tokens: usize) {
    matmul_with(isa::active(), pool, w, x, y, n_tokens);
}

/// [`matmul`] with the kernels of `isa` (bitwise equal for every exact ISA, see
/// [`Isa::is_exact`]; for tests and benchmarks that compare variants in one process).
///
/// Panics if the shapes do not match or this CPU cannot run `isa` (see
/// [`Isa::is_available`]).
pub fn matmul_with(
    isa: Isa,
    pool: &ThreadPool,
    w: &WeightView<'_>,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
) {
    let kernels = Kernels::new(isa)
        .unwrap_or_else(|| panic!("matmul_with: this CPU cannot run the {isa} kernels"));
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
    if n_tokens == 1 && kernels.has_fused_rows() {
        for_each_column_chunk(pool, y, n_tokens, w.rows, chunk, |rows, out| {
            fused_rows(&kernels, w, row_bytes, x, rows, out);
        });
        return;
    }
    let blocking = Blocking::for_shape(w.cols, chunk);
    matmul_blocked(
        &kernels, pool, w, row_bytes, x, y, n_tokens, chunk, blocking,
    );
}

/// The dequantize-then-dot path (`blocked`): each task's rows with every token.
#[allow(clippy::too_many_arguments)] // the matmul's operands plus the derived sizes
fn matmul_blocked(
    kernels: &Kernels,
    pool: &ThreadPool,
    w: &WeightView<'_>,
    row_bytes: usize,
    x: &[f32],     // [n_tokens, cols]
    y: &mut [f32], // [n_tokens, rows]
    n_tokens: usize,
    chunk: usize,
    blocking: Blocking,
) {
    for_each_column_chunk(pool, y, n_tokens, w.rows, chunk, |rows, out| {
        with_scratch(blocking.rows * w.cols, |scratch| {
            blocked::matmul_rows(kernels, w, row_bytes, x, rows, out, scratch, blocking);
        });
    });
}

/// Rows per task: about [`CHUNKS_PER_THREAD`] tasks per thread, a multiple of [`ROW_GROUP`].
fn chunk_rows(rows: usize, n_threads: usize) -> usize {
    let per_task = rows.div_ceil(n_threads * CHUNKS_PER_THREAD);
    per_task.div_ceil(ROW_GROUP).max(1) * ROW_GROUP
}

thread_local! {
    /// Per-thread dequantization scratch, reused across calls (grows, never shrinks).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[0, r] = W[r] · x` for `r` in `rows` with the fused kernels (one token; no scratch),
/// four rows at a time.
fn fused_rows(
    kernels: &Kernels,
    w: &WeightView<'_>,
    row_bytes: usize,
    x: &[f32], // [cols]
    rows: Range<usize>,
    out: &mut ColumnsMut<'_>,
) {
    let src = &w.data[rows.start * row_bytes..rows.end * row_bytes];
    let mut groups = src.chunks_exact(ROW_GROUP * row_bytes);
    let mut j = 0;
    for g in groups.by_ref() {
        let rows: [&[u8]; ROW_GROUP] =
            std::array::from_fn(|i| &g[i * row_bytes..(i + 1) * row_bytes]);
        for v in kernels.dot_rows_4(w.dtype, rows, x) {
            out.set(0, j, v);
            j += 1;
        }
    }
    for row in groups.remainder().chunks_exact(row_bytes) {
        out.set(0, j, kernels.dot_row(w.dtype, row, x));
        j += 1;
    }
}

/// Runs `f` with a scratch buffer of `len` floats: the thread's reusable one, or a fresh one if
/// that is already borrowed (a nested call).
pub(crate) fn with_scratch(len: usize, f: impl FnOnce(&mut [f32])) {
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
pub(crate) fn for_each_column_chunk<F>(
    pool: &ThreadPool,
    y: &mut [f32], // [n_tokens, rows]
    n_tokens: usize,
    rows: usize,
    chunk: usize,
    f: F,
) where
    F: Fn(Range<usize>, &mut ColumnsMut<'_>) + Sync,
{
    let split = ColumnSplit::Fixed { chunks: [chunk] };
    for_each_column_chunk_of(pool, [y], n_tokens, [rows], split, |_, columns, view| {
        f(columns, view)
    });
}

/// Tasks of one job whose columns are looked up in a table rather than recomputed.
const SCHEDULE_MAX: usize = 256;

/// How the columns of `N` outputs are cut into the tasks of one job. A row's result never
/// depends on the cut (each column is computed on its own), only the speed does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ColumnSplit<const N: usize> {
    /// Chunks of `chunks[m]` columns of output `m`, output after output.
    Fixed { chunks: [usize; N] },
    /// Guided self-scheduling over units of `unit` columns, output after output: each task
    /// takes `1 / (2 · threads)` of the units still left (at least one, never across two
    /// outputs), so tasks shrink towards the end of the job and the last ones leave the other
    /// threads a short wait.
    Guided { unit: usize, threads: usize },
}

impl<const N: usize> ColumnSplit<N> {
    /// The tasks in order: `(output, columns)`.
    fn tasks(self, rows: [usize; N]) -> impl Iterator<Item = (usize, Range<usize>)> {
        let (mut m, mut at) = (0, 0);
        let unit = match self {
            ColumnSplit::Fixed { .. } => 1,
            ColumnSplit::Guided { unit, .. } => unit.max(1),
        };
        let mut left: usize = rows.iter().map(|r| r.div_ceil(unit)).sum();
        std::iter::from_fn(move || {
            while m < N && at >= rows[m] {
                (m, at) = (m + 1, 0);
            }
            if m == N {
                return None;
            }
            let len = match self {
                ColumnSplit::Fixed { chunks } => chunks[m],
                ColumnSplit::Guided { threads, .. } => {
                    left.div_ceil(2 * threads.max(1)).max(1) * unit
                }
            };
            let end = (at + len).min(rows[m]);
            left -= (end - at).div_ceil(unit);
            let columns = at..end;
            at = end;
            Some((m, columns))
        })
    }
}

/// [`for_each_column_chunk`] over `N` outputs at once (`ys[m]`: `[n_tokens, rows[m]]`, cut
/// as `split` says), all chunks one job on the pool: `f(m, columns, view)`.
pub(crate) fn for_each_column_chunk_of<const N: usize, F>(
    pool: &ThreadPool,
    ys: [&mut [f32]; N],
    n_tokens: usize,
    rows: [usize; N],
    split: ColumnSplit<N>,
    f: F,
) where
    F: Fn(usize, Range<usize>, &mut ColumnsMut<'_>) + Sync,
{
    for m in 0..N {
        assert!(
            ys[m].len() == n_tokens * rows[m],
            "column chunks: bad shape"
        );
    }
    if let ColumnSplit::Fixed { chunks } = split {
        assert!(chunks.iter().all(|&c| c > 0), "column chunks: empty chunk");
    }
    let bases = ys.map(|y| SendPtr(y.as_mut_ptr()));
    // The schedule, worked out once (on the stack; a longer one is walked per task).
    let mut schedule = [(0usize, 0usize, 0usize); SCHEDULE_MAX];
    let mut total = 0;
    for (m, c) in split.tasks(rows) {
        if let Some(slot) = schedule.get_mut(total) {
            *slot = (m, c.start, c.end);
        }
        total += 1;
    }
    pool.run(total, |task| {
        // The table holds the first `SCHEDULE_MAX` tasks, in order.
        let (m, columns) = match schedule.get(task) {
            Some(&(m, start, end)) => (m, start..end),
            None => split
                .tasks(rows)
                .nth(task)
                .expect("a task number below the schedule's length"),
        };
        // SAFETY: each `ys[m]` is exclusively borrowed for this whole call; the tasks of a
        // split are consecutive, non-overlapping column ranges of each output, and
        // `ThreadPool::run` calls each task index exactly once, so the column ranges of live
        // views of one output are disjoint; every write is bounds-checked against the range
        // and `n_tokens`.
        let mut view = unsafe { ColumnsMut::new(bases[m], n_tokens, rows[m], columns.clone()) };
        f(m, columns, &mut view);
    });
}

/// A raw pointer to the output that may cross to the pool's threads.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: only used to build `ColumnsMut` views over disjoint columns (see `ColumnsMut::new`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Write access to columns `start..end` of a `[n_tokens, stride]` f32 matrix.
pub(crate) struct ColumnsMut<'a> {
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
    pub(crate) unsafe fn new(
        base: SendPtr,
        n_tokens: usize,
        stride: usize,
        columns: Range<usize>,
    ) -> Self {
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
    pub(crate) fn set(&mut self, t: usize, j: usize, v: f32) {
        let c = self.columns.start + j;
        assert!(
            t < self.n_tokens && c < self.columns.end,
            "column view: out of bounds"
        );
        // SAFETY: in bounds of the matrix (checked above) and in this view's columns, which no
        // other thread accesses (contract of `new`).
        unsafe { *self.base.add(t * self.stride + c) = v };
    }

    /// Columns `columns.start + j ..` (`live` of them) of every token, as one row group's
    /// output.
    pub(crate) fn group_out(&mut self, j: usize, live: usize) -> GroupOut<'_> {
        let c = self.columns.start + j;
        assert!(
            c + live <= self.columns.end,
            "column view: group out of bounds"
        );
        // SAFETY: the `live` columns from `c` lie within this view's columns (checked above)
        // in each of its `n_tokens` rows, which no other thread accesses (contract of `new`);
        // the group view borrows this one mutably.
        unsafe { GroupOut::new(self.base.wrapping_add(c), self.stride, self.n_tokens, live) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs of more tasks than the schedule table holds still give each column to exactly one
    /// task (the tasks past the table are worked out on the fly).
    #[test]
    fn every_column_is_written_once_in_long_schedules() {
        let pool = ThreadPool::new(3);
        for (rows, chunk) in [(300, 1), (SCHEDULE_MAX, 1), (1000, 3), (40, 7)] {
            use std::sync::atomic::{AtomicUsize, Ordering};
            let n_tokens = 2;
            let mut y = vec![0.0f32; n_tokens * rows];
            let visits: Vec<AtomicUsize> = (0..rows).map(|_| AtomicUsize::new(0)).collect();
            for_each_column_chunk(&pool, &mut y, n_tokens, rows, chunk, |columns, out| {
                for (j, c) in columns.clone().enumerate() {
                    visits[c].fetch_add(1, Ordering::SeqCst);
                    for t in 0..n_tokens {
                        out.set(t, j, (c + 1) as f32);
                    }
                }
            });
            let counts: Vec<usize> = visits.iter().map(|v| v.load(Ordering::SeqCst)).collect();
            assert_eq!(counts, vec![1; rows], "{rows} columns in chunks of {chunk}");
            let want: Vec<f32> = (0..n_tokens)
                .flat_map(|_| (1..=rows).map(|c| c as f32))
                .collect();
            assert_eq!(y, want, "{rows} columns in chunks of {chunk}");
        }
    }

    /// A guided split covers every column of every output exactly once, in order, in tasks
    /// that start on unit boundaries, never span two outputs and never grow within one.
    #[test]
    fn guided_split_covers_each_column_once_in_shrinking_tasks() {
        for (rows, unit, threads) in [
            ([576, 192, 192], 16, 2),
            ([1536, 1536, 0], 16, 2),
            ([49152, 1, 17], 16, 3),
            ([5, 0, 40], 4, 1),
        ] {
            let split = ColumnSplit::Guided { unit, threads };
            let tasks: Vec<(usize, Range<usize>)> = split.tasks(rows).collect();
            let mut next = [0usize; 3];
            let mut last = (usize::MAX, usize::MAX);
            for (m, c) in &tasks {
                assert_eq!(c.start, next[*m], "{rows:?}: gap or overlap in output {m}");
                assert!(c.start % unit == 0 && c.end > c.start && c.end <= rows[*m]);
                let len = c.len();
                if last.0 == *m && c.end < rows[*m] {
                    assert!(
                        len <= last.1,
                        "{rows:?}: task of {len} after one of {}",
                        last.1
                    );
                }
                next[*m] = c.end;
                last = (*m, len);
            }
            assert_eq!(next, rows, "every column of every output");
            let bound = rows.iter().map(|r| r.div_ceil(unit)).sum::<usize>();
            assert!(tasks.len() <= bound, "at most one task per unit");
        }
    }

    /// Small blocks and tiles put block, tile and group edges at many places (rows and tokens
    /// that are no multiple of 4, tiles of 4 and 8 tokens, blocks of 4 and 8 rows, a column
    /// tail for the float types): every result must still be the bits of the scalar reference
    /// (dequantize, then `dot16::dot_1`).
    #[test]
    fn small_blocks_and_tiles_give_the_reference_bits() {
        use crate::dot16::dot_1;
        use crate::quant::{dequantize_row, quantize_row};
        let pool = ThreadPool::new(2);
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for (dtype, cols) in [(DType::Q4_1, 64), (DType::F32, 37), (DType::Q8_0, 96)] {
            let row_bytes = dtype.bytes_for(cols).expect("whole blocks");
            let (rows, n_tokens) = (23, 19);
            let mut data = vec![0u8; rows * row_bytes]; // [rows, row_bytes]
            for row in data.chunks_exact_mut(row_bytes) {
                let v: Vec<f32> = (0..cols).map(|_| next()).collect();
                quantize_row(dtype, &v, row);
            }
            let w = WeightView::new(dtype, rows, cols, &data).expect("sizes match");
            let x: Vec<f32> = (0..n_tokens * cols).map(|_| next()).collect(); // [n_tokens, cols]
            for isa in Isa::available().into_iter().filter(|i| i.is_exact()) {
                let kernels = Kernels::new(isa).expect("available");
                for (brows, tokens, chunk) in [(4, 4, 8), (8, 4, 12), (4, 8, 4), (8, 8, 24)] {
                    let blocking = Blocking {
                        rows: brows,
                        tokens,
                    };
                    let mut y = vec![f32::NAN; n_tokens * rows]; // [n_tokens, rows]
                    let args = (&kernels, &pool, &w, row_bytes, &x[..]);
                    matmul_blocked(
                        args.0, args.1, args.2, args.3, args.4, &mut y, n_tokens, chunk, blocking,
                    );
                    for (t, yt) in y.chunks_exact(rows).enumerate() {
                        for (r, got) in yt.iter().enumerate() {
                            let src = &data[r * row_bytes..(r + 1) * row_bytes];
                            let mut wr = vec![0.0f32; cols]; // [cols]
                            dequantize_row(dtype, src, &mut wr);
                            let want = dot_1(&wr, &x[t * cols..(t + 1) * cols]);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{isa} {dtype} {blocking:?} chunk {chunk}: t={t} r={r}"
                            );
                        }
                    }
                }
            }
        }
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
