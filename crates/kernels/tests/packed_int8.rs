//! The int8 product of packed matrices (`tandem_kernels::packed`; Q4_0, Q4_1, Q8_0, Q4_K,
//! Q6_K): every ISA's kernel is
//! bitwise equal to the scalar reference on random shapes (rows that are no multiple of the
//! 16-row group, 1..20 tokens); results are batch- and thread-invariant bitwise; and they lie
//! within the error bound of 8-bit activation rounding from the exact f32 product.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use std::sync::OnceLock;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_kernels::ops::rms_norm;
use tandem_kernels::packed::{
    matmul_quantized_with, matmuls_quantized_grouped, matmuls_quantized_with, GroupedProduct,
    QuantizedRows,
};
use tandem_kernels::quant::{dequantize_row, quantize_row};
use tandem_kernels::{
    matmul_packed_with, matmul_with, DType, Isa, PackedMatrix, ThreadPool, WeightView,
};

fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: [OnceLock<ThreadPool>; 4] = [const { OnceLock::new() }; 4];
    POOLS[threads].get_or_init(|| ThreadPool::new(threads))
}

fn run(isa: Isa, threads: usize, w: &WeightView<'_>, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n_tokens * w.rows]; // [n_tokens, rows]
    matmul_with(isa, pool(threads), w, x, &mut y, n_tokens);
    y
}

fn run_packed(isa: Isa, threads: usize, w: &PackedMatrix, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n_tokens * w.rows()]; // [n_tokens, rows]
    matmul_packed_with(isa, pool(threads), w, x, &mut y, n_tokens);
    y
}

/// The bound on `|int8 − exact|` for one row and token: each activation is rounded to the
/// nearest multiple of its block's `d = max|x| / 127`, so the dot moves by at most
/// `Σ |w_i|·d_i / 2`; plus 1e-5 of `Σ |w_i|·(|x_i| + d_i)` for f32 rounding in both results.
fn bound(w: &[f32], x: &[f32]) -> f32 {
    let mut b = 0.0f32;
    let mut mag = 0.0f32;
    for (wb, xb) in w.chunks(32).zip(x.chunks(32)) {
        let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        for (wv, xv) in wb.iter().zip(xb) {
            b += wv.abs() * d / 2.0;
            mag += wv.abs() * (xv.abs() + d);
        }
    }
    b * 1.0001 + 1e-5 * mag
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn packed_int8_equals_its_reference_and_is_within_the_rounding_bound(
        dtype in prop::sample::select(vec![
            DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q5_0,
            DType::Q5_1, DType::Q5_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS,
        ]),
        blocks in 1usize..10,
        rows in 1usize..40,
        n_tokens in 1usize..21,
        seed in any::<u64>(),
    ) {
        // K-quant rows hold whole blocks of 256.
        let cols = if dtype.block_len() == 256 { 256 * (1 + blocks % 3) } else { 32 * blocks };
        let mut rng = StdRng::seed_from_u64(seed);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let mut data = vec![0u8; rows * row_bytes];
        for row in data.chunks_exact_mut(row_bytes) {
            let v: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            quantize_row(dtype, &v, row);
        }
        let w = WeightView::new(dtype, rows, cols, &data).unwrap();
        let packed = PackedMatrix::pack(&w, pool(2)).unwrap();
        // Some all-zero activation blocks (scale 0) among the random ones.
        let x: Vec<f32> = (0..n_tokens * cols)
            .map(|i| match (i / 32) % 7 {
                3 => 0.0,
                // Block maximum 127 (scale 1): the halves are rounding ties.
                5 if i % 32 == 0 => 127.0,
                5 => (rng.random_range(-254i32..=254) as f32) * 0.5,
                _ => rng.random_range(-3.0f32..3.0),
            })
            .collect();
        let exact = run(Isa::Scalar, 1, &w, &x, n_tokens);
        let reference = run_packed(Isa::Scalar, 1, &packed, &x, n_tokens);
        for t in 0..n_tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            for r in 0..rows {
                let mut wr = vec![0.0f32; cols];
                dequantize_row(dtype, &data[r * row_bytes..(r + 1) * row_bytes], &mut wr);
                let (g, e) = (reference[t * rows + r], exact[t * rows + r]);
                prop_assert!(
                    (g - e).abs() <= bound(&wr, xt),
                    "{} t={} r={}: {} vs {} (bound {})", dtype, t, r, g, e, bound(&wr, xt)
                );
            }
        }
        let quantized = QuantizedRows::new(&x, n_tokens, cols);
        for isa in Isa::available() {
            let q = QuantizedRows::quantize_with(isa, pool(2), &x, n_tokens, cols);
            for t in 0..n_tokens {
                prop_assert_eq!(q.q(t), quantized.q(t), "{} quantized values", isa);
                prop_assert_eq!(q.scales(t), quantized.scales(t), "{} scales", isa);
            }
            let got = run_packed(isa, 1, &packed, &x, n_tokens);
            for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                prop_assert_eq!(a.to_bits(), b.to_bits(), "{} {} at {}", isa, dtype, i);
            }
            for t in 0..n_tokens {
                let alone = run_packed(isa, 2, &packed, &x[t * cols..(t + 1) * cols], 1);
                for r in 0..rows {
                    prop_assert_eq!(alone[r].to_bits(), got[t * rows + r].to_bits());
                }
            }
            let threaded = run_packed(isa, 3, &packed, &x, n_tokens);
            for (a, b) in threaded.iter().zip(&got) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }
}

#[test]
fn only_the_int8_block_types_pack() {
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::Q2_K] {
        let cols = 256;
        let data = vec![0u8; 2 * dtype.bytes_for(cols).unwrap()];
        let w = WeightView::new(dtype, 2, cols, &data).unwrap();
        assert!(!PackedMatrix::packs(dtype));
        assert!(PackedMatrix::pack(&w, pool(1)).is_none(), "{dtype}");
    }
}

/// The stored-weight product stays exact under the int8 ISAs (only packed matrices take the
/// int8 kernels).
#[test]
fn stored_weights_stay_exact_under_int8_isas() {
    let mut rng = StdRng::seed_from_u64(5);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q5_K,
        DType::Q2_K,
    ] {
        let cols = 256;
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let mut data = vec![0u8; 6 * row_bytes];
        for row in data.chunks_exact_mut(row_bytes) {
            let v: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            quantize_row(dtype, &v, row);
        }
        let w = WeightView::new(dtype, 6, cols, &data).unwrap();
        let x: Vec<f32> = (0..3 * cols)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let exact = run(Isa::Scalar, 1, &w, &x, 3);
        for isa in Isa::available().into_iter().filter(|i| !i.is_exact()) {
            let got = run(isa, 2, &w, &x, 3);
            assert!(
                got.iter()
                    .zip(&exact)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa} {dtype}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// RMSNorm fused with the quantization gives the bits of norming, then quantizing, on
    /// every ISA, also in a buffer that held a larger batch before.
    #[test]
    fn fused_rms_norm_quantization_equals_norm_then_quantize(
        blocks in 1usize..12,
        n_tokens in 1usize..9,
        seed in any::<u64>(),
    ) {
        let cols = 32 * blocks;
        let mut rng = StdRng::seed_from_u64(seed);
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        let weight: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let eps = 1e-5;
        let mut normed = vec![0.0f32; x.len()];
        for (row, out) in x.chunks_exact(cols).zip(normed.chunks_exact_mut(cols)) {
            rms_norm(row, &weight, eps, out);
        }
        for isa in Isa::available() {
            let want = QuantizedRows::quantize_with(isa, pool(1), &normed, n_tokens, cols);
            let mut fused = QuantizedRows::empty();
            // First a larger batch into the same buffer, then the one compared.
            let larger: Vec<f32> = (0..(n_tokens + 3) * cols).map(|i| i as f32).collect();
            fused.rms_norm_quantize_into_with(isa, pool(2), &larger, &weight, eps, n_tokens + 3);
            fused.rms_norm_quantize_into_with(isa, pool(2), &x, &weight, eps, n_tokens);
            prop_assert_eq!(fused.n_tokens(), n_tokens);
            for t in 0..n_tokens {
                prop_assert_eq!(fused.q(t), want.q(t), "{} values of token {}", isa, t);
                prop_assert_eq!(fused.scales(t), want.scales(t), "{} scales of token {}", isa, t);
            }
        }
    }

    /// Several matrices as one job give each matrix's own bits, whatever the thread count.
    #[test]
    fn matrices_in_one_job_equal_each_alone(
        rows in prop::array::uniform3(1usize..70),
        n_tokens in 1usize..6,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let (dtype, cols) = (DType::Q4_1, 96);
        let mut rng = StdRng::seed_from_u64(seed);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let data: Vec<Vec<u8>> = rows
            .iter()
            .map(|&r| {
                let mut data = vec![0u8; r * row_bytes];
                for row in data.chunks_exact_mut(row_bytes) {
                    let v: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    quantize_row(dtype, &v, row);
                }
                data
            })
            .collect();
        let packed: Vec<PackedMatrix> = rows
            .iter()
            .zip(&data)
            .map(|(&r, d)| {
                PackedMatrix::pack(&WeightView::new(dtype, r, cols, d).unwrap(), pool(2)).unwrap()
            })
            .collect();
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        for isa in Isa::available().into_iter().filter(|i| !i.is_exact()) {
            let xq = QuantizedRows::quantize_with(isa, pool(1), &x, n_tokens, cols);
            let mut ys: Vec<Vec<f32>> = rows.iter().map(|&r| vec![f32::NAN; n_tokens * r]).collect();
            let [y0, y1, y2] = &mut ys[..] else { unreachable!() };
            matmuls_quantized_with(
                isa,
                pool(threads),
                [&packed[0], &packed[1], &packed[2]],
                &xq,
                [&mut y0[..], &mut y1[..], &mut y2[..]],
            );
            for (w, y) in packed.iter().zip(&ys) {
                let mut alone = vec![f32::NAN; y.len()];
                matmul_quantized_with(isa, pool(1), w, &xq, &mut alone);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(y), bits(&alone), "{}", isa);
            }
        }
    }

    /// Products with inputs of their own (the experts of a mixture, each over its tokens)
    /// as one job give each product's own bits, whatever the thread count; a product with no
    /// rows writes nothing.
    #[test]
    fn grouped_products_equal_each_alone(
        shapes in prop::collection::vec((1usize..70, 0usize..5), 1..7),
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let (dtype, cols) = (DType::Q8_0, 64);
        let mut rng = StdRng::seed_from_u64(seed);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let packed: Vec<PackedMatrix> = shapes
            .iter()
            .map(|&(r, _)| {
                let mut data = vec![0u8; r * row_bytes];
                for row in data.chunks_exact_mut(row_bytes) {
                    let v: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    quantize_row(dtype, &v, row);
                }
                PackedMatrix::pack(&WeightView::new(dtype, r, cols, &data).unwrap(), pool(2)).unwrap()
            })
            .collect();
        let xs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|&(_, n)| (0..n * cols).map(|_| rng.random_range(-3.0f32..3.0)).collect())
            .collect();
        for isa in Isa::available().into_iter().filter(|i| !i.is_exact()) {
            let xqs: Vec<QuantizedRows> = shapes
                .iter()
                .zip(&xs)
                .map(|(&(_, n), x)| QuantizedRows::quantize_with(isa, pool(1), x, n, cols))
                .collect();
            let mut ys: Vec<Vec<f32>> =
                shapes.iter().map(|&(r, n)| vec![f32::NAN; n * r]).collect();
            let mut products: Vec<GroupedProduct<'_>> = packed
                .iter()
                .zip(&xqs)
                .zip(ys.iter_mut())
                .map(|((w, xq), y)| GroupedProduct { w: w.into(), xq, y: &mut y[..] })
                .collect();
            matmuls_quantized_grouped(isa, pool(threads), &mut products);
            for ((w, xq), y) in packed.iter().zip(&xqs).zip(&ys) {
                let mut alone = vec![f32::NAN; y.len()];
                matmul_quantized_with(isa, pool(1), w, xq, &mut alone);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(y), bits(&alone), "{}", isa);
            }
        }
    }

    /// Matrices packed stacked in one allocation (a layer's experts) give, as row ranges,
    /// the bits of each packed alone.
    #[test]
    fn stacked_matrices_equal_each_packed_alone(
        groups in prop::collection::vec(1usize..4, 1..5),
        n_tokens in 1usize..4,
        seed in any::<u64>(),
    ) {
        let (dtype, cols) = (DType::Q4_K, 256);
        let mut rng = StdRng::seed_from_u64(seed);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let data: Vec<Vec<u8>> = groups
            .iter()
            .map(|&g| {
                let mut data = vec![0u8; 16 * g * row_bytes];
                for row in data.chunks_exact_mut(row_bytes) {
                    let v: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    quantize_row(dtype, &v, row);
                }
                data
            })
            .collect();
        let views: Vec<WeightView<'_>> = groups
            .iter()
            .zip(&data)
            .map(|(&g, d)| WeightView::new(dtype, 16 * g, cols, d).unwrap())
            .collect();
        let stacked = PackedMatrix::pack_stacked(&views, pool(2)).unwrap();
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        for isa in Isa::available().into_iter().filter(|i| !i.is_exact()) {
            let xq = QuantizedRows::quantize_with(isa, pool(1), &x, n_tokens, cols);
            let mut first = 0;
            for view in &views {
                let alone = PackedMatrix::pack(view, pool(1)).unwrap();
                let mut want = vec![f32::NAN; n_tokens * view.rows];
                matmul_quantized_with(isa, pool(1), &alone, &xq, &mut want);
                let mut got = vec![f32::NAN; n_tokens * view.rows];
                let w = stacked.row_range(first, view.rows);
                matmuls_quantized_grouped(isa, pool(2), &mut [GroupedProduct { w, xq: &xq, y: &mut got }]);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want), "{}", isa);
                first += view.rows;
            }
        }
    }
}

#[test]
fn a_matrix_without_columns_sums_to_zero_at_every_batch() {
    // Empty sums for every token, whatever the tile plan (the later tiles' prefetch plan
    // has no block to pair its lines with).
    let data: Vec<u8> = Vec::new();
    let w = WeightView::new(DType::Q8_0, 40, 0, &data).unwrap();
    let packed = PackedMatrix::pack(&w, pool(2)).unwrap();
    for isa in Isa::available() {
        for n_tokens in [1, 4, 8, 12, 17] {
            let y = run_packed(isa, 2, &packed, &[], n_tokens);
            assert_eq!(y.len(), 40 * n_tokens);
            assert!(
                y.iter().all(|&v| v == 0.0),
                "{isa}, {n_tokens} tokens: {y:?}"
            );
        }
    }
}
