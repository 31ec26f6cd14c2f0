//! Every SIMD variant of `matmul` against the scalar reference: bitwise equal (as documented
//! in `tandem_kernels::matmul`) on random shapes, all weight types, 1..20 tokens, including
//! float rows whose length is no multiple of the vector width; and batch / thread invariance
//! of every variant.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

mod common;
use common::assert_bits;

use std::sync::OnceLock;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_kernels::quant::{dot_row, quantize_row};
use tandem_kernels::{matmul_with, DType, Isa, ThreadPool, WeightView};

fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: [OnceLock<ThreadPool>; 4] = [const { OnceLock::new() }; 4];
    POOLS[threads].get_or_init(|| ThreadPool::new(threads))
}

/// A random `[rows, cols]` weight of `dtype` (quantized from random f32 values, some exact
/// zeros and negative zeros among them).
fn random_weight(rng: &mut StdRng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = dtype.bytes_for(cols).unwrap();
    let mut data = vec![0u8; rows * row_bytes];
    for row in data.chunks_exact_mut(row_bytes) {
        let x: Vec<f32> = (0..cols)
            .map(|_| match rng.random_range(0..20) {
                0 => 0.0,
                1 => -0.0,
                _ => rng.random_range(-3.0f32..3.0),
            })
            .collect();
        quantize_row(dtype, &x, row);
    }
    data
}

fn run(isa: Isa, threads: usize, w: &WeightView<'_>, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n_tokens * w.rows]; // [n_tokens, rows]
    matmul_with(isa, pool(threads), w, x, &mut y, n_tokens);
    y
}

/// (dtype, cols): a few blocks for quantized types, any length up to 300 for float types.
fn shape() -> impl Strategy<Value = (DType, usize)> {
    (0..DType::ALL.len(), 1usize..300).prop_map(|(i, n)| {
        let dtype = DType::ALL[i];
        let cols = match dtype.block_len() {
            1 => n,
            32 => 32 * (1 + n % 8),
            b => b * (1 + n % 3),
        };
        (dtype, cols)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Every available variant gives the scalar bits, whole batch and token by token (the
    /// single-token path is the fused decode kernel), with 1 or 3 threads.
    #[test]
    fn simd_matches_scalar_bitwise(
        (dtype, cols) in shape(),
        rows in 1usize..14,
        n_tokens in 1usize..21,
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let data = random_weight(&mut rng, dtype, rows, cols);
        let w = WeightView::new(dtype, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let reference = run(Isa::Scalar, 1, &w, &x, n_tokens);
        for isa in Isa::available().into_iter().filter(|i| i.is_exact()) {
            for threads in [1, 3] {
                let got = run(isa, threads, &w, &x, n_tokens);
                assert_bits(&got, &reference, &format!("{isa} {dtype} {threads} threads"))?;
            }
            for t in 0..n_tokens {
                let alone = run(isa, 2, &w, &x[t * cols..(t + 1) * cols], 1);
                let what = format!("{isa} {dtype} token {t} alone");
                assert_bits(&alone, &reference[t * rows..(t + 1) * rows], &what)?;
            }
        }
    }
}

/// An independent check of the values themselves: each variant's results are close to the
/// block-wise `dot_row` reference (a different summation order, hence a tolerance of 1e-5 of
/// `Σ|w·x|`, the f32 rounding bound for these lengths).
#[test]
fn simd_is_close_to_the_blockwise_dot() {
    let mut rng = StdRng::seed_from_u64(11);
    for dtype in DType::ALL {
        let cols = if dtype.block_len() == 1 { 203 } else { 512 };
        let rows = 9;
        let data = random_weight(&mut rng, dtype, rows, cols);
        let w = WeightView::new(dtype, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..3 * cols)
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect();
        let row_bytes = data.len() / rows;
        for isa in Isa::available().into_iter().filter(|i| i.is_exact()) {
            for n_tokens in [1, 3] {
                let y = run(isa, 2, &w, &x[..n_tokens * cols], n_tokens);
                for t in 0..n_tokens {
                    for r in 0..rows {
                        let src = &data[r * row_bytes..(r + 1) * row_bytes];
                        let xt = &x[t * cols..(t + 1) * cols];
                        let want = dot_row(dtype, src, xt);
                        let mag: f32 = xt.iter().map(|v| v.abs()).sum::<f32>() * 4.0;
                        let got = y[t * rows + r];
                        assert!(
                            (got - want).abs() <= 1e-5 * mag,
                            "{isa} {dtype} t={t} r={r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Wide rows and many tokens, so that the multi-token path splits the tokens into several
/// cache tiles (a tile of `[tokens, 1536]` f32 holds a few dozen tokens) and the rows into
/// several blocks: every exact variant, at any thread count, still gives the scalar bits, and
/// every token alone gives its bits in the batch.
#[test]
fn many_tokens_and_wide_rows_cross_the_cache_tiles() {
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, cols, n_tokens) = (37, 1536, 97);
    let data = random_weight(&mut rng, DType::Q4_1, rows, cols);
    let w = WeightView::new(DType::Q4_1, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..n_tokens * cols)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect(); // [n_tokens, cols]
    let reference = run(Isa::Scalar, 1, &w, &x, n_tokens);
    for isa in Isa::available().into_iter().filter(|i| i.is_exact()) {
        for threads in [1, 2, 3] {
            let got = run(isa, threads, &w, &x, n_tokens);
            assert_bits(&got, &reference, &format!("{isa}, {threads} threads")).unwrap();
        }
        for t in [0, 41, 96] {
            let alone = run(isa, 2, &w, &x[t * cols..(t + 1) * cols], 1);
            let batched = &reference[t * rows..(t + 1) * rows];
            assert_bits(&alone, batched, &format!("{isa}: token {t} alone")).unwrap();
        }
    }
}

#[test]
fn unavailable_isa_panics_with_a_message() {
    let Some(missing) = Isa::ALL.into_iter().find(|i| !i.is_available()) else {
        return; // every variant runs here: nothing can be missing
    };
    let result = std::panic::catch_unwind(|| {
        let data = vec![0u8; 34];
        let w = WeightView::new(DType::Q8_0, 1, 32, &data).unwrap();
        run(missing, 1, &w, &[0.0; 32], 1)
    });
    assert!(result.is_err());
}
