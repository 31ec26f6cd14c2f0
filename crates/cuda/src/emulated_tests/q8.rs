//! The Q8_0 weights' kernels: `q8_dequant` gives exactly the host's `q * d` in the storage
//! type, and `q8_matvec` the product with those weights (against an f64 reference), each
//! row bitwise the same for any number of rows up to the kernel's limit.

use super::*;
use crate::product_kernels::Q8_MATVEC_ROWS;
use crate::q8_weights::{dequantize, quantize, Q8_BLOCK};

#[test]
fn dequantized_weights_and_products_match_the_host() {
    for (m, k) in [(70usize, 96usize), (9, 2048)] {
        for dtype in MODES {
            let kern = kernels(dtype);
            let mut r = rng((m * k) as u64);
            let w = normal_ish(&mut r, m * k, 0.5);
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            quantize(&w, &mut codes, &mut scales);
            let weights: Vec<f32> = codes
                .iter()
                .enumerate()
                .map(|(i, &c)| dequantize(c, scales[i / Q8_BLOCK]))
                .collect();
            let (mut cb, mut sb) = (Buf::of(&codes), Buf::of(&scales));
            let mut out = act_buf(dtype, &vec![0.0; m * k]);
            kern.q8_dequant(cb.ptr(), sb.ptr(), out.ptr(), m, k)
                .expect("launch");
            assert_eq!(
                read_act(dtype, &out),
                as_stored(dtype, &weights),
                "{dtype:?} dequant"
            );

            let x = normal_ish(&mut r, Q8_MATVEC_ROWS * k, 1.0);
            let xs = as_stored(dtype, &x);
            let mut xb = act_buf(dtype, &x);
            let mut full = Vec::new();
            for n in [Q8_MATVEC_ROWS, 1, 3] {
                let mut y = Buf::zeroed(n * m * 4);
                kern.q8_matvec(cb.ptr(), sb.ptr(), xb.ptr(), y.ptr(), n, m, k)
                    .expect("launch");
                let got = y.read::<f32>();
                let want = reference_product(&xs, &weights, n, m, k);
                assert_close(
                    &format!("{dtype:?} q8_matvec n={n} k={k}"),
                    &got,
                    &want,
                    1e-5,
                );
                if n == Q8_MATVEC_ROWS {
                    full = got;
                } else {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&full[..n * m]),
                        "{dtype:?}: n={n} vs {Q8_MATVEC_ROWS}"
                    );
                }
            }
        }
    }
}
