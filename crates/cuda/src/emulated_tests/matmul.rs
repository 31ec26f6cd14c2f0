//! `matmul_fixed`, the batch-invariant product: against an f64 reference, and every row
//! bitwise the same whether it is computed alone, in a slice of rows, or anywhere in a
//! larger product.

use super::*;

/// `y[n, m] = x[n, k] · w[m, k]ᵀ` on the emulator.
fn product(dtype: CudaDtype, x: &[f32], w: &[f32], n: usize, m: usize, k: usize) -> Vec<f32> {
    let kern = kernels(dtype);
    let (mut xb, mut wb) = (act_buf(dtype, x), act_buf(dtype, w));
    let mut y = Buf::zeroed(n * m * 4);
    kern.matmul_fixed(xb.ptr(), wb.ptr(), y.ptr(), n, m, k)
        .expect("launch");
    y.read()
}

#[test]
fn rows_are_bitwise_the_same_in_any_batch() {
    // m and k not multiples of the tiles (64 columns, 32 of k); n past one tile of 16.
    let (n, m, k) = (37, 70, 100);
    for dtype in MODES {
        let mut r = rng(31);
        let x = normal_ish(&mut r, n * k, 1.0);
        let w = normal_ish(&mut r, m * k, 1.0);
        let all = product(dtype, &x, &w, n, m, k);
        let (xs, ws) = (as_stored(dtype, &x), as_stored(dtype, &w));
        let want = reference_product(&xs, &ws, n, m, k);
        assert_close(&format!("{dtype:?} product"), &all, &want, 1e-5);
        for (first, rows) in [(0, 1), (36, 1), (5, 3), (10, 17)] {
            let part = product(dtype, &x[first * k..(first + rows) * k], &w, rows, m, k);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&part),
                bits(&all[first * m..(first + rows) * m]),
                "{dtype:?}: rows {first}..{} alone",
                first + rows
            );
        }
    }
}
