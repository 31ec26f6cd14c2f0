//! `matmul` against the reference `dot_row`, for every type; batch and thread invariance.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_kernels::quant::{dequantize_row, dot_row, quantize_row};
use tandem_kernels::{matmul, DType, ThreadPool, WeightView};

/// A random `[rows, cols]` weight of `dtype` (quantized from random f32 values).
fn random_weight(rng: &mut StdRng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = dtype.bytes_for(cols).unwrap();
    let mut data = vec![0u8; rows * row_bytes];
    for row in data.chunks_exact_mut(row_bytes) {
        let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        quantize_row(dtype, &x, row);
    }
    data
}

fn random_x(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

/// Columns for a type: a few blocks; for float types also a length that is no multiple of 16.
fn cols_for(dtype: DType) -> Vec<usize> {
    match dtype.block_len() {
        1 => vec![37, 64, 200],
        b => vec![b, 3 * b],
    }
}

fn run_matmul(threads: usize, w: &WeightView<'_>, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let pool = ThreadPool::new(threads);
    let mut y = vec![f32::NAN; n_tokens * w.rows]; // [n_tokens, rows]
    matmul(&pool, w, x, &mut y, n_tokens);
    y
}

#[test]
fn matches_dot_row_for_every_type() {
    let mut rng = StdRng::seed_from_u64(7);
    for dtype in DType::ALL {
        for cols in cols_for(dtype) {
            for rows in [1, 5, 33] {
                let data = random_weight(&mut rng, dtype, rows, cols);
                let w = WeightView::new(dtype, rows, cols, &data).unwrap();
                let row_bytes = data.len() / rows;
                for n_tokens in [1, 3, 17] {
                    let x = random_x(&mut rng, n_tokens * cols); // [n_tokens, cols]
                    let y = run_matmul(2, &w, &x, n_tokens);
                    for t in 0..n_tokens {
                        let xt = &x[t * cols..(t + 1) * cols];
                        for r in 0..rows {
                            let row = &data[r * row_bytes..(r + 1) * row_bytes];
                            let mut wr = vec![0.0f32; cols];
                            dequantize_row(dtype, row, &mut wr);
                            // Tolerance: 1e-5 of Σ|w·x| (both are f32 sums of the same terms
                            // in different orders; the block dot also factors the scales out).
                            let mag: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                            let want = dot_row(dtype, row, xt);
                            let got = y[t * rows + r];
                            assert!(
                                (got - want).abs() <= 1e-5 * mag + 1e-30,
                                "{dtype} {rows}x{cols} n_tokens={n_tokens} t={t} r={r}: \
                                 {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

fn assert_bitwise_eq(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
    }
}

#[test]
fn batch_and_thread_invariance_is_bitwise() {
    let mut rng = StdRng::seed_from_u64(8);
    let n_tokens = 100;
    for (dtype, rows, cols) in [
        (DType::Q4_1, 37, 96),
        (DType::Q8_0, 29, 64),
        (DType::F32, 23, 45),
        (DType::Q6_K, 9, 256),
    ] {
        let data = random_weight(&mut rng, dtype, rows, cols);
        let w = WeightView::new(dtype, rows, cols, &data).unwrap();
        let x = random_x(&mut rng, n_tokens * cols); // [n_tokens, cols]
        let batched = run_matmul(1, &w, &x, n_tokens);
        for threads in [2, 3, 5] {
            let what = format!("{dtype}: {threads} threads vs 1");
            assert_bitwise_eq(&run_matmul(threads, &w, &x, n_tokens), &batched, &what);
        }
        let pool = ThreadPool::new(2);
        for t in 0..n_tokens {
            let mut alone = vec![f32::NAN; rows];
            matmul(&pool, &w, &x[t * cols..(t + 1) * cols], &mut alone, 1);
            let what = format!("{dtype}: token {t} alone vs in a batch of {n_tokens}");
            assert_bitwise_eq(&alone, &batched[t * rows..(t + 1) * rows], &what);
        }
        // Any contiguous sub-batch gives the same rows too.
        let (a, b) = (13, 30);
        let mut sub = vec![f32::NAN; (b - a) * rows];
        matmul(&pool, &w, &x[a * cols..b * cols], &mut sub, b - a);
        assert_bitwise_eq(&sub, &batched[a * rows..b * rows], "sub-batch");
    }
}

#[test]
fn empty_shapes_are_fine() {
    let pool = ThreadPool::new(2);
    let data = vec![0u8; 3 * 34];
    let w = WeightView::new(DType::Q8_0, 3, 32, &data).unwrap();
    matmul(&pool, &w, &[], &mut [], 0);
    let w0 = WeightView::new(DType::Q8_0, 0, 32, &[]).unwrap();
    matmul(&pool, &w0, &[0.0; 64], &mut [], 2);
    let no_cols = WeightView::new(DType::F32, 3, 0, &[]).unwrap();
    let mut y = [f32::NAN; 6];
    matmul(&pool, &no_cols, &[], &mut y, 2);
    assert_eq!(y, [0.0; 6]);
}

#[test]
#[should_panic(expected = "x must be [n_tokens, cols]")]
fn wrong_activation_shape_panics() {
    let pool = ThreadPool::new(1);
    let data = vec![0u8; 2 * 34];
    let w = WeightView::new(DType::Q8_0, 2, 32, &data).unwrap();
    matmul(&pool, &w, &[0.0; 33], &mut [0.0; 2], 1);
}

#[test]
fn weight_view_checks_sizes() {
    assert!(WeightView::new(DType::Q4_1, 2, 32, &[0u8; 40]).is_some());
    assert!(WeightView::new(DType::Q4_1, 2, 32, &[0u8; 41]).is_none());
    assert!(WeightView::new(DType::Q4_1, 2, 33, &[0u8; 40]).is_none());
}
