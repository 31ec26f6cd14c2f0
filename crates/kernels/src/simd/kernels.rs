//! The SIMD kernels, generic over the 16-lane vector: row dequantization, the 1- and 4-row
//! f32 dots of [`crate::dot16`], and the fused dequantize-and-dot of 1 or 4 stored rows.
//!
//! All are bitwise equal to the scalar reference: the same decoded values (see `decode`), the
//! same lane per column, a rounded multiply then a rounded add (no FMA), the scalar tail and
//! the same [`tree_sum`].

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

use super::decode::{dispatch, Format, WithFormat};
use super::lanes::Lanes16;
use crate::dot16::{mac_tail, tree_sum, LANES};
use crate::DType;

/// As [`crate::quant::dequantize_row`].
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dequantize_row<V: Lanes16>(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let full = whole_blocks(dtype, src.len(), dst.len());
    dispatch::<V, _>(dtype, Dequant { src, dst, full });
    if full < dst.len() {
        let at = dtype.bytes_for(full).expect("a whole number of chunks");
        crate::quant::dequantize_row(dtype, &src[at..], &mut dst[full..]);
    }
}

/// Asserts `src_len == dtype.bytes_for(cols)`; returns the columns covered by whole SIMD
/// blocks (all of them for quantized types, `cols` rounded down to 16 for float types).
fn whole_blocks(dtype: DType, src_len: usize, cols: usize) -> usize {
    assert!(
        dtype.bytes_for(cols) == Some(src_len),
        "simd kernel: {src_len} bytes are not {cols} elements of {dtype}"
    );
    if dtype.is_quantized() {
        cols
    } else {
        cols - cols % LANES
    }
}

struct Dequant<'a> {
    src: &'a [u8],
    dst: &'a mut [f32],
    /// Columns covered by whole blocks (checked by `whole_blocks`).
    full: usize,
}

impl<V: Lanes16> WithFormat<V> for Dequant<'_> {
    type Out = ();
    #[inline(always)]
    unsafe fn call<F: Format>(self) {
        let (src, out) = (self.src.as_ptr(), self.dst.as_mut_ptr());
        for bi in 0..self.full / F::ELEMS {
            let b = src.add(bi * F::BYTES);
            for k in 0..F::ELEMS / LANES {
                F::chunk::<V>(b, k).store(out.add(bi * F::ELEMS + k * LANES));
            }
        }
    }
}

/// The dots of `N` stored rows with `x`, decoding 16 columns at a time straight into the
/// accumulators: row `i` is bitwise equal to `dequantize_row` followed by `dot_1`.
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_rows<V: Lanes16, const N: usize>(
    dtype: DType,
    src: [&[u8]; N],
    x: &[f32],
) -> [f32; N] {
    let mut full = 0;
    for s in &src {
        full = whole_blocks(dtype, s.len(), x.len());
    }
    let acc = dispatch::<V, _>(dtype, DotRows { src, x, full });
    // A loop, not `array::from_fn`: closures do not inherit the target features, so the
    // vector tree would not be inlined.
    let mut out = [0.0f32; N];
    for i in 0..N {
        out[i] = if full == x.len() {
            acc[i].tree_sum()
        } else {
            tail_and_tree(acc[i].to_array(), dtype, src[i], x, full)
        };
    }
    out
}

/// Adds columns `full..` (the float types' last `len % 16`) of the stored row `src` times `x`
/// to the lanes, as the scalar reference does, then sums them by the fixed tree.
fn tail_and_tree(mut lanes: [f32; LANES], dtype: DType, src: &[u8], x: &[f32], full: usize) -> f32 {
    let at = dtype.bytes_for(full).expect("a whole number of chunks");
    let mut tail = [0.0f32; LANES];
    crate::quant::dequantize_row(dtype, &src[at..], &mut tail[..x.len() - full]);
    for ((a, &wv), &xv) in lanes.iter_mut().zip(&tail).zip(&x[full..]) {
        *a += wv * xv;
    }
    tree_sum(&lanes)
}

struct DotRows<'a, const N: usize> {
    src: [&'a [u8]; N],
    x: &'a [f32],
    /// Columns covered by whole blocks (checked by `whole_blocks` for every row).
    full: usize,
}

impl<V: Lanes16, const N: usize> WithFormat<V> for DotRows<'_, N> {
    /// The accumulators of each row, before the tail and the tree.
    type Out = [V; N];
    #[inline(always)]
    unsafe fn call<F: Format>(self) -> Self::Out {
        let s = self.src.map(<[u8]>::as_ptr);
        let x = self.x.as_ptr();
        let blocks = self.full / F::ELEMS;
        // Explicit accumulators (N is 1 or 4): an array indexed in a loop may be kept in
        // memory, which puts a store-to-load delay on every addition's dependency chain.
        let mut out = [V::zero(); N];
        if N == 4 {
            let (mut a0, mut a1, mut a2, mut a3) = (V::zero(), V::zero(), V::zero(), V::zero());
            // The matmul passes consecutive rows: the next group starts where row 3 ends.
            // Four interleaved short streams defeat the hardware prefetcher on matrices that
            // do not fit in cache, so fetch the next group's bytes as this one is consumed.
            let next = s[3].wrapping_add(blocks * F::BYTES);
            for bi in 0..blocks {
                let ahead = next.wrapping_add(4 * bi * F::BYTES);
                for off in (0..4 * F::BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off).cast());
                }
                for k in 0..F::ELEMS / LANES {
                    let xv = V::load(x.add(bi * F::ELEMS + k * LANES));
                    a0 = a0.add(F::chunk::<V>(s[0].add(bi * F::BYTES), k).mul(xv));
                    a1 = a1.add(F::chunk::<V>(s[1].add(bi * F::BYTES), k).mul(xv));
                    a2 = a2.add(F::chunk::<V>(s[2].add(bi * F::BYTES), k).mul(xv));
                    a3 = a3.add(F::chunk::<V>(s[3].add(bi * F::BYTES), k).mul(xv));
                }
            }
            for (o, a) in out.iter_mut().zip([a0, a1, a2, a3]) {
                *o = a;
            }
        } else {
            for (o, &s) in out.iter_mut().zip(&s) {
                let mut a = V::zero();
                for bi in 0..blocks {
                    for k in 0..F::ELEMS / LANES {
                        let xv = V::load(x.add(bi * F::ELEMS + k * LANES));
                        a = a.add(F::chunk::<V>(s.add(bi * F::BYTES), k).mul(xv));
                    }
                }
                *o = a;
            }
        }
        out
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

/// [`dot_4`] of two activation rows at once (`[x0 results, x1 results]`): eight accumulators,
/// each weight chunk loaded once for both tokens; every result bitwise equal to [`dot_4`]'s.
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_4x2<V: Lanes16>(w: [&[f32]; 4], x: [&[f32]; 2]) -> [[f32; 4]; 2] {
    let n = x[0].len();
    assert!(
        x[1].len() == n && w.iter().all(|r| r.len() == n),
        "dot_4x2: length mismatch"
    );
    let full = n - n % LANES;
    let [w0, w1, w2, w3] = w.map(<[f32]>::as_ptr);
    let [x0, x1] = x.map(<[f32]>::as_ptr);
    let (mut a0, mut a1, mut a2, mut a3) = (V::zero(), V::zero(), V::zero(), V::zero());
    let (mut b0, mut b1, mut b2, mut b3) = (V::zero(), V::zero(), V::zero(), V::zero());
    let mut c = 0;
    while c < full {
        let (xa, xb) = (V::load(x0.add(c)), V::load(x1.add(c)));
        let v = V::load(w0.add(c));
        a0 = a0.add(v.mul(xa));
        b0 = b0.add(v.mul(xb));
        let v = V::load(w1.add(c));
        a1 = a1.add(v.mul(xa));
        b1 = b1.add(v.mul(xb));
        let v = V::load(w2.add(c));
        a2 = a2.add(v.mul(xa));
        b2 = b2.add(v.mul(xb));
        let v = V::load(w3.add(c));
        a3 = a3.add(v.mul(xa));
        b3 = b3.add(v.mul(xb));
        c += LANES;
    }
    [
        [
            finish(a0, w[0], x[0]),
            finish(a1, w[1], x[0]),
            finish(a2, w[2], x[0]),
            finish(a3, w[3], x[0]),
        ],
        [
            finish(b0, w[0], x[1]),
            finish(b1, w[1], x[1]),
            finish(b2, w[2], x[1]),
            finish(b3, w[3], x[1]),
        ],
    ]
}

/// [`dot_4`] of four activation rows at once (`out[t][i] = w[i] · x[t]`): sixteen
/// accumulators (for AVX-512, 16 of the 32 registers), each weight chunk loaded once for the
/// four tokens and each activation chunk once for the four rows; every result bitwise equal
/// to [`dot_4`]'s (the same operations per row and token, in the same order).
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_4x4<V: Lanes16>(w: [&[f32]; 4], x: [&[f32]; 4]) -> [[f32; 4]; 4] {
    let acc = acc_4x4::<V>(w, x);
    let mut out = [[0.0f32; 4]; 4];
    for t in 0..4 {
        for i in 0..4 {
            out[t][i] = finish(acc[t][i], w[i], x[t]);
        }
    }
    out
}

/// The accumulators of [`dot_4x4`] (`[t][i]` for token `t`, row `i`) over the whole 16-column
/// chunks, before the tail (`len % 16` columns) and the tree.
///
/// # Safety
/// The CPU must support `V`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn acc_4x4<V: Lanes16>(w: [&[f32]; 4], x: [&[f32]; 4]) -> [[V; 4]; 4] {
    let n = x[0].len();
    assert!(
        x.iter().all(|r| r.len() == n) && w.iter().all(|r| r.len() == n),
        "dot_4x4: length mismatch"
    );
    let full = n - n % LANES;
    let [w0, w1, w2, w3] = w.map(<[f32]>::as_ptr);
    let [x0, x1, x2, x3] = x.map(<[f32]>::as_ptr);
    // Explicit accumulators: `a{t}{i}` for token t, row i (see `DotRows` on arrays).
    let z = V::zero();
    let (mut a00, mut a01, mut a02, mut a03) = (z, z, z, z);
    let (mut a10, mut a11, mut a12, mut a13) = (z, z, z, z);
    let (mut a20, mut a21, mut a22, mut a23) = (z, z, z, z);
    let (mut a30, mut a31, mut a32, mut a33) = (z, z, z, z);
    let mut c = 0;
    while c < full {
        let (v0, v1) = (V::load(w0.add(c)), V::load(w1.add(c)));
        let (v2, v3) = (V::load(w2.add(c)), V::load(w3.add(c)));
        let xv = V::load(x0.add(c));
        a00 = a00.add(v0.mul(xv));
        a01 = a01.add(v1.mul(xv));
        a02 = a02.add(v2.mul(xv));
        a03 = a03.add(v3.mul(xv));
        let xv = V::load(x1.add(c));
        a10 = a10.add(v0.mul(xv));
        a11 = a11.add(v1.mul(xv));
        a12 = a12.add(v2.mul(xv));
        a13 = a13.add(v3.mul(xv));
        let xv = V::load(x2.add(c));
        a20 = a20.add(v0.mul(xv));
        a21 = a21.add(v1.mul(xv));
        a22 = a22.add(v2.mul(xv));
        a23 = a23.add(v3.mul(xv));
        let xv = V::load(x3.add(c));
        a30 = a30.add(v0.mul(xv));
        a31 = a31.add(v1.mul(xv));
        a32 = a32.add(v2.mul(xv));
        a33 = a33.add(v3.mul(xv));
        c += LANES;
    }
    [
        [a00, a01, a02, a03],
        [a10, a11, a12, a13],
        [a20, a21, a22, a23],
        [a30, a31, a32, a33],
    ]
}

/// The scalar tail and the fixed tree.
#[inline(always)]
unsafe fn finish<V: Lanes16>(acc: V, w: &[f32], x: &[f32]) -> f32 {
    if x.len().is_multiple_of(LANES) {
        return acc.tree_sum();
    }
    let mut lanes = acc.to_array();
    mac_tail(&mut lanes, w, x);
    tree_sum(&lanes)
}
