//! The SIMD kernels, generic over the 16-lane vector: row dequantization, the 1- and 4-row
//! f32 dots of [`crate::dot16`], and the fused dequantize-and-dot of one stored row.
//!
//! All are bitwise equal to the scalar reference: same decoded values (see `decode`), the same
//! lane per column, separate rounded multiply and add, the scalar tail and the same
//! [`tree_sum`].

use super::decode::for_each_chunk;
use super::lanes::Lanes16;
use crate::dot16::{mac_tail, tree_sum, LANES};
use crate::DType;

/// As [`crate::quant::dequantize_row`].
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dequantize_row<V: Lanes16>(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let cols = dst.len();
    let out = dst.as_mut_ptr();
    let full = for_each_chunk::<V>(dtype, src, cols, |c0, v| {
        debug_assert!(c0 + 16 <= cols);
        // SAFETY: `for_each_chunk` only passes chunk starts with `c0 + 16 <= cols`.
        unsafe { v.store(out.add(c0)) }
    });
    if full < cols {
        let at = dtype
            .bytes_for(full)
            .expect("full is a multiple of 16 (float types)");
        crate::quant::dequantize_row(dtype, &src[at..], &mut dst[full..]);
    }
}

/// As [`crate::dot16::dot_1`].
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_1<V: Lanes16>(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot_1: length mismatch");
    let full = x.len() - x.len() % LANES;
    let mut acc = V::zero();
    let mut c = 0;
    while c < full {
        acc = acc.add(V::load(w.as_ptr().add(c)).mul(V::load(x.as_ptr().add(c))));
        c += LANES;
    }
    finish(acc, w, x)
}

/// As [`crate::dot16::dot_4`].
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_4<V: Lanes16>(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    assert!(
        w.iter().all(|r| r.len() == x.len()),
        "dot_4: length mismatch"
    );
    let full = x.len() - x.len() % LANES;
    let [w0, w1, w2, w3] = w.map(<[f32]>::as_ptr);
    let (mut a0, mut a1, mut a2, mut a3) = (V::zero(), V::zero(), V::zero(), V::zero());
    let mut c = 0;
    while c < full {
        let xv = V::load(x.as_ptr().add(c));
        a0 = a0.add(V::load(w0.add(c)).mul(xv));
        a1 = a1.add(V::load(w1.add(c)).mul(xv));
        a2 = a2.add(V::load(w2.add(c)).mul(xv));
        a3 = a3.add(V::load(w3.add(c)).mul(xv));
        c += LANES;
    }
    [
        finish(a0, w[0], x),
        finish(a1, w[1], x),
        finish(a2, w[2], x),
        finish(a3, w[3], x),
    ]
}

/// The dot of the stored row `src` with `x`, decoding 16 columns at a time straight into the
/// accumulators: bitwise equal to `dequantize_row` followed by `dot_1`.
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_row<V: Lanes16>(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
    let cols = x.len();
    let xp = x.as_ptr();
    let mut acc = V::zero();
    let full = for_each_chunk::<V>(dtype, src, cols, |c0, w| {
        // SAFETY: `for_each_chunk` only passes chunk starts with `c0 + 16 <= cols`.
        acc = unsafe { acc.add(w.mul(V::load(xp.add(c0)))) };
    });
    let mut lanes = acc.to_array();
    if full < cols {
        let at = dtype
            .bytes_for(full)
            .expect("full is a multiple of 16 (float types)");
        let mut tail = [0.0f32; LANES];
        crate::quant::dequantize_row(dtype, &src[at..], &mut tail[..cols - full]);
        for ((a, &wv), &xv) in lanes.iter_mut().zip(&tail).zip(&x[full..]) {
            *a += wv * xv;
        }
    }
    tree_sum(&lanes)
}

/// The scalar tail and the fixed tree.
#[inline(always)]
unsafe fn finish<V: Lanes16>(acc: V, w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = acc.to_array();
    mac_tail(&mut lanes, w, x);
    tree_sum(&lanes)
}
