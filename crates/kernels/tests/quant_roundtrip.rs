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
//! - Q5_0: `d = amax/16`: `d + 16·f16err(d)`; Q5_1: `d = (max − min)/31`:
//!   `d/2 + 31·f16err(d) + f16err(min)`.
//! - IQ4_NL: `d = amax/127`: half the widest gap of the table (12) or the clipping above its
//!   top level 113 (14): `14·d + 127·f16err(d)`.
//! - Q5_K: as Q4_K with 31 levels: `S/2 + 15.5·d + M/126`.
//! - Q2_K: per group of 16, `S` = largest range `/3`, `M` = largest `−min(min, 0)`:
//!   `S/2 + 1.5·d + M/30` with `d = S/15 + f16err(S/15)` (4-bit scales and mins).
//! - Q3_K: `S = amax/4`, `d = S/31 + f16err(S/31)`: `S + 4·d` (a level, and clipping at +3
//!   where the group's extreme is positive).
//! - IQ4_XS: `S = amax/127` over its sub-blocks, `d = S/31 + f16err(S/31)`: `14·S + 64·d`.
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
        DType::Q5_0 => {
            let d = amax(x) / 16.0;
            d + 16.0 * f16err(d)
        }
        DType::Q5_1 => {
            let (lo, hi) = min_max(x);
            let d = (hi - lo) / 31.0;
            d / 2.0 + 31.0 * f16err(d) + f16err(lo)
        }
        DType::IQ4_NL => {
            let d = amax(x) / 127.0;
            14.0 * d + 127.0 * f16err(d)
        }
        DType::Q5_K => {
            let (s, m) = range_and_min(x, 32, 31.0);
            let d = s / 63.0 + f16err(s / 63.0);
            s / 2.0 + 15.5 * d + m / 126.0 + f16err(m / 63.0)
        }
        DType::Q2_K => {
            let (s, m) = range_and_min(x, 16, 3.0);
            let d = s / 15.0 + f16err(s / 15.0);
            s / 2.0 + 1.5 * d + m / 30.0 + f16err(m / 15.0)
        }
        DType::Q3_K => {
            let s = amax(x) / 4.0;
            let d = s / 31.0 + f16err(s / 31.0);
            s + 4.0 * d
        }
        DType::IQ4_XS => {
            let s = amax(x) / 127.0;
            let d = s / 31.0 + f16err(s / 31.0);
            14.0 * s + 64.0 * d
        }
    };
    bound + slack
}

/// The largest sub-block range `(max − min(min, 0)) / levels` and the largest `−min(min, 0)`
/// over the sub-blocks of `sub` elements of `x` (the K-quants with mins).
fn range_and_min(x: &[f32], sub: usize, levels: f32) -> (f32, f32) {
    let (mut s, mut m) = (0.0f32, 0.0f32);
    for part in x.chunks(sub) {
        let (lo, hi) = min_max(part);
        s = s.max((hi - lo.min(0.0)) / levels);
        m = m.max(-lo.min(0.0));
    }
    (s, m)
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
    #[test] fn q5_0_roundtrip(x in row(DType::Q5_0)) { check_roundtrip(DType::Q5_0, &x)?; }
    #[test] fn q5_1_roundtrip(x in row(DType::Q5_1)) { check_roundtrip(DType::Q5_1, &x)?; }
    #[test] fn iq4_nl_roundtrip(x in row(DType::IQ4_NL)) { check_roundtrip(DType::IQ4_NL, &x)?; }
    #[test] fn q2_k_roundtrip(x in row(DType::Q2_K)) { check_roundtrip(DType::Q2_K, &x)?; }
    #[test] fn q3_k_roundtrip(x in row(DType::Q3_K)) { check_roundtrip(DType::Q3_K, &x)?; }
    #[test] fn q5_k_roundtrip(x in row(DType::Q5_K)) { check_roundtrip(DType::Q5_K, &x)?; }
    #[test] fn iq4_xs_roundtrip(x in row(DType::IQ4_XS)) { check_roundtrip(DType::IQ4_XS, &x)?; }
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
