//! The Q4_1 weights' kernels: `q4_dequant` gives exactly the CPU's Q4_1 weights (its own
//! dequantization of the same blocks) in the storage type, and `q4_matvec` the product with
//! those weights (against an f64 reference), each row bitwise the same for any number of
//! rows up to the kernel's limit.

use super::*;
use crate::product_kernels::Q4_MATVEC_ROWS;
use crate::q4_weights::{dequantize, quantize, Q4_BLOCK};

/// `bits(v)`: the f32 values' bit patterns, for bitwise comparisons.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// A `[m, k]` Q4_1 matrix: codes, scales and the CPU's dequantized weights. Row 0 has an
/// all-zero block and a constant block; row 1's weights are shifted far from zero (a large
/// minimum against a small step) and row 2's are tiny (subnormal f16 scales and minima).
fn matrix(m: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u32>, Vec<f32>) {
    let mut r = rng(seed);
    let mut w = normal_ish(&mut r, m * k, 0.5);
    if k >= 2 * Q4_BLOCK {
        w[..Q4_BLOCK].iter_mut().for_each(|v| *v = 0.0);
        w[Q4_BLOCK..2 * Q4_BLOCK].iter_mut().for_each(|v| *v = 0.3);
    }
    if m > 2 {
        w[k..2 * k].iter_mut().for_each(|v| *v = 4.0 + *v * 0.01);
        // Steps and minima below f16's smallest normal (6.1e-5): subnormal scales.
        w[2 * k..3 * k].iter_mut().for_each(|v| *v *= 4e-5);
    }
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    quantize(&w, &mut codes, &mut scales);
    let weights = dequantize(&codes, &scales);
    (codes, scales, weights)
}

#[test]
fn dequantized_weights_are_the_cpus_q4_1_weights() {
    for (m, k) in [(5usize, 64usize), (9, 2048)] {
        let (codes, scales, weights) = matrix(m, k, (m * k) as u64);
        for dtype in MODES {
            let kern = kernels(dtype);
            let (mut cb, mut sb) = (Buf::of(&codes), Buf::of(&scales));
            let mut out = act_buf(dtype, &vec![f32::NAN; m * k]);
            kern.q4_dequant(cb.ptr(), sb.ptr(), out.ptr(), m, k)
                .expect("launch");
            assert_eq!(
                bits(&read_act(dtype, &out)),
                bits(&as_stored(dtype, &weights)),
                "{dtype:?} q4_dequant {m}x{k}"
            );
        }
    }
}

#[test]
fn products_match_f64_and_do_not_depend_on_the_row_count() {
    // 70 and 9 columns: not multiples of the 8 warps of a block; k = 96: 3 blocks a row
    // (most lanes idle); k = 2048: 64 blocks, 2 a lane; k = 1056: 33 blocks, lane 0 takes 2.
    for (m, k) in [(70usize, 96usize), (9, 2048), (13, 1056)] {
        let (codes, scales, weights) = matrix(m, k, 7 * (m * k) as u64);
        for dtype in MODES {
            let kern = kernels(dtype);
            let mut r = rng((m + k) as u64);
            let x = normal_ish(&mut r, Q4_MATVEC_ROWS * k, 1.0);
            let xs = as_stored(dtype, &x);
            let (mut cb, mut sb, mut xb) = (Buf::of(&codes), Buf::of(&scales), act_buf(dtype, &x));
            let mut full = Vec::new();
            for n in [Q4_MATVEC_ROWS, 1, 2, 3, 4, 5, 6, 7] {
                let mut y = Buf::of(&vec![f32::NAN; n * m]);
                kern.q4_matvec(cb.ptr(), sb.ptr(), xb.ptr(), y.ptr(), n, m, k)
                    .expect("launch");
                let got = y.read::<f32>();
                let want = reference_product(&xs, &weights, n, m, k);
                assert_close(
                    &format!("{dtype:?} q4_matvec n={n} {m}x{k}"),
                    &got,
                    &want,
                    1e-5,
                );
                if n == Q4_MATVEC_ROWS {
                    full = got;
                } else {
                    assert_eq!(
                        bits(&got),
                        bits(&full[..n * m]),
                        "{dtype:?} {m}x{k}: n={n} vs {Q4_MATVEC_ROWS}"
                    );
                }
            }
        }
    }
}
