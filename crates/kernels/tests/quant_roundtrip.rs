//! Property tests: `quantize_row` then `dequantize_row` stays within each format's error bound.
//!
//! Bounds per block (derived from the quantizers' definitions; `f16err(v) = |v|·2⁻¹¹ + 2⁻²⁵` is
//! the rounding error of storing `v` as f16, `amax` the block's largest magnitude):
//! - F32: exact; F16: `f16err(x)`; BF16: `|x|·2⁻⁸`.
//! - Q8_0: `d = amax/127`: `d/2 + 127·f16err(d)`.
//! - Q4_0: `d = amax/8`: `d + 8·f16err(d)` (the extreme opposite to the scale's sign clips).
//! - Q4_1: `d = (max − min)/15`: `d/2 + 15·f16err(d) + f16err(min)`.
//! - Q4_K: `S` = largest sub-block range `/15`, `M` = largest sub-block `−min(min, 0)`:
//!   `S/2 + 7.5·d + M/126` with `d = S/63 + f16err(S/63)` (6-bit scale rounding and clipping).
//! - Q6_K: `S = amax/31`: `S/2 + 16·d` with `d = S/127 + f16err(S/127)`.
//!
//! Each bound also gets `1e-5·amax` of slack for f32 arithmetic.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use proptest::prelude::*;
use tandem_kernels::quant::{dequantize_row, quantize_row};
use tandem_kernels::DType;

fn f16err(v: f32) -> f32 {
    v.abs() * 2f32.powi(-11) + 2f32.powi(-25)
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// Largest allowed |error| for the elements of one block `x` of `dtype` (0 for floats, which
/// use per-element bounds).
fn block_bound(dtype: DType, x: &[f32]) -> f32 {
    let slack = 1e-5 * amax(x);
    let bound = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => 0.0,
        DType::Q8_0 => {
            let d = amax(x) / 127.0;
            d / 2.0 + 127.0 * f16err(d)
        }
        DType::Q4_0 => {
            let d = amax(x) / 8.0;
            d + 8.0 * f16err(d)
        }
        DType::Q4_1 => {
            let (lo, hi) = min_max(x);
            let d = (hi - lo) / 15.0;
            d / 2.0 + 15.0 * f16err(d) + f16err(lo)
        }
        DType::Q4_K => {
            let (mut s, mut m) = (0.0f32, 0.0f32);
            for sub in x.chunks(32) {
                let (lo, hi) = min_max(sub);
                s = s.max((hi - lo.min(0.0)) / 15.0);
                m = m.max(-lo.min(0.0));
            }
            let d = s / 63.0 + f16err(s / 63.0);
            s / 2.0 + 7.5 * d + m / 126.0 + f16err(m / 63.0)
        }
        DType::Q6_K => {
            let s = amax(x) / 31.0;
            let d = s / 127.0 + f16err(s / 127.0);
            s / 2.0 + 16.0 * d
        }
    };
    bound + slack
}

fn element_bound(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16err(v),
        DType::BF16 => v.abs() * 2f32.powi(-8),
        _ => 0.0,
    }
}

/// Blocks of values in [-1, 1] scaled by a per-block power of ten in [1e-2, 1e2].
fn row(dtype: DType) -> impl Strategy<Value = Vec<f32>> {
    let len = dtype.block_len();
    let block = (prop::collection::vec(-1.0f32..1.0, len), -2.0f32..2.0)
        .prop_map(|(v, e)| v.into_iter().map(|x| x * 10f32.powf(e)).collect::<Vec<_>>());
    let n_blocks = if len == 1 { 1..200usize } else { 1..5usize };
    prop::collection::vec(block, n_blocks).prop_map(|b| b.concat())
}

fn check_roundtrip(dtype: DType, x: &[f32]) -> Result<(), TestCaseError> {
    let mut bytes = vec![0u8; dtype.bytes_for(x.len()).unwrap()];
    quantize_row(dtype, x, &mut bytes);
    let mut y = vec![f32::NAN; x.len()];
    dequantize_row(dtype, &bytes, &mut y);
    let bl = if dtype.block_len() == 1 {
        32
    } else {
        dtype.block_len()
    };
    for (b, (xb, yb)) in x.chunks(bl).zip(y.chunks(bl)).enumerate() {
        let bound = block_bound(dtype, xb);
        for (i, (&xv, &yv)) in xb.iter().zip(yb).enumerate() {
            let err = (xv - yv).abs();
            let tol = bound + element_bound(dtype, xv);
            prop_assert!(
                err <= tol,
                "{} block {} elem {}: {} -> {} (err {}, bound {})",
                dtype,
                b,
                i,
                xv,
                yv,
                err,
                tol
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test] fn f32_roundtrip(x in row(DType::F32)) { check_roundtrip(DType::F32, &x)?; }
    #[test] fn f16_roundtrip(x in row(DType::F16)) { check_roundtrip(DType::F16, &x)?; }
    #[test] fn bf16_roundtrip(x in row(DType::BF16)) { check_roundtrip(DType::BF16, &x)?; }
    #[test] fn q8_0_roundtrip(x in row(DType::Q8_0)) { check_roundtrip(DType::Q8_0, &x)?; }
    #[test] fn q4_0_roundtrip(x in row(DType::Q4_0)) { check_roundtrip(DType::Q4_0, &x)?; }
    #[test] fn q4_1_roundtrip(x in row(DType::Q4_1)) { check_roundtrip(DType::Q4_1, &x)?; }
    #[test] fn q4_k_roundtrip(x in row(DType::Q4_K)) { check_roundtrip(DType::Q4_K, &x)?; }
    #[test] fn q6_k_roundtrip(x in row(DType::Q6_K)) { check_roundtrip(DType::Q6_K, &x)?; }
}

/// Quantizing all-zero blocks gives exact zeros (no division by a zero scale).
#[test]
fn zero_blocks_round_trip_exactly() {
    for dtype in DType::ALL {
        let x = vec![0.0f32; dtype.block_len() * 2];
        let mut bytes = vec![0xffu8; dtype.bytes_for(x.len()).unwrap()];
        quantize_row(dtype, &x, &mut bytes);
        let mut y = vec![f32::NAN; x.len()];
        dequantize_row(dtype, &bytes, &mut y);
        assert!(y.iter().all(|&v| v == 0.0), "{dtype}: {y:?}");
    }
}
