//! Decoding of stored rows into 16-lane f32 vectors, one per 16 consecutive columns.
//!
//! Every decoder performs, per element, exactly the f32 operations of the scalar reference in
//! [`crate::quant`] (exact integer-to-float conversions, then the same rounded multiplications
//! and additions in the same order), so the decoded values are bitwise equal to
//! [`crate::quant::dequantize_row`]'s.

use std::arch::x86_64::*;

use super::lanes::Lanes16;
use crate::DType;

/// Calls `f(c0, v)` for every whole chunk of 16 columns of the row `src` (`cols` elements of
/// `dtype`), in increasing `c0`, with `v` lane `l` = element `c0 + l`. Returns the number of
/// columns covered (`cols` rounded down to a multiple of 16; quantized rows are covered whole).
///
/// # Safety
/// The CPU must support `V`'s features. `src.len() == dtype.bytes_for(cols)` is asserted.
#[inline(always)]
pub(super) unsafe fn for_each_chunk<V: Lanes16>(
    dtype: DType,
    src: &[u8],
    cols: usize,
    mut f: impl FnMut(usize, V),
) -> usize {
    assert!(
        dtype.bytes_for(cols) == Some(src.len()),
        "simd decode: {} bytes are not {cols} elements of {dtype}",
        src.len()
    );
    let p = src.as_ptr();
    let full = cols - cols % 16;
    let mut c0 = 0;
    match dtype {
        DType::F32 => {
            while c0 < full {
                f(c0, V::load(p.add(4 * c0).cast()));
                c0 += 16;
            }
        }
        DType::F16 => {
            while c0 < full {
                f(c0, V::load_f16(p.add(2 * c0)));
                c0 += 16;
            }
        }
        DType::BF16 => {
            while c0 < full {
                f(c0, V::load_bf16(p.add(2 * c0)));
                c0 += 16;
            }
        }
        DType::Q8_0 => q8_0(src, &mut f),
        DType::Q4_0 => q4_0(src, &mut f),
        DType::Q4_1 => q4_1(src, &mut f),
        DType::Q4_K => q4_k(src, &mut f),
        DType::Q6_K => q6_k(src, &mut f),
    }
    full
}

/// The f16 at `b[at..at + 2]` as f32 (exact; the scalar reference's conversion).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// 16 bytes from `b[at..at + 16]`.
#[inline(always)]
fn bytes16(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: `s` has exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// `(v >> shift) & mask` on each byte (the 16-bit shift's spill from the neighbouring byte
/// lands only in bits the mask clears, since `mask < 1 << (8 − shift)`).
///
/// # Safety
/// SSE2 only (always present on x86-64); unsafe because it is a target-feature call.
#[inline(always)]
unsafe fn shr_mask(v: __m128i, shift: i32, mask: i8) -> __m128i {
    _mm_and_si128(
        _mm_srl_epi16(v, _mm_cvtsi32_si128(shift)),
        _mm_set1_epi8(mask),
    )
}

/// Q8_0 (34-byte blocks of 32): `q·d`.
#[inline(always)]
unsafe fn q8_0<V: Lanes16>(src: &[u8], f: &mut impl FnMut(usize, V)) {
    for (i, b) in src.chunks_exact(34).enumerate() {
        let d = V::splat(f16_at(b, 0));
        f(32 * i, V::from_i8(bytes16(b, 2)).mul(d));
        f(32 * i + 16, V::from_i8(bytes16(b, 18)).mul(d));
    }
}

/// Q4_0 (18-byte blocks of 32): `(q − 8)·d`; low nibbles are elements 0–15.
#[inline(always)]
unsafe fn q4_0<V: Lanes16>(src: &[u8], f: &mut impl FnMut(usize, V)) {
    let eight = _mm_set1_epi8(8);
    for (i, b) in src.chunks_exact(18).enumerate() {
        let d = V::splat(f16_at(b, 0));
        let q = bytes16(b, 2);
        let lo = _mm_sub_epi8(shr_mask(q, 0, 0x0f), eight);
        let hi = _mm_sub_epi8(shr_mask(q, 4, 0x0f), eight);
        f(32 * i, V::from_i8(lo).mul(d));
        f(32 * i + 16, V::from_i8(hi).mul(d));
    }
}

/// Q4_1 (20-byte blocks of 32): `q·d + m`; low nibbles are elements 0–15.
#[inline(always)]
unsafe fn q4_1<V: Lanes16>(src: &[u8], f: &mut impl FnMut(usize, V)) {
    for (i, b) in src.chunks_exact(20).enumerate() {
        let d = V::splat(f16_at(b, 0));
        let m = V::splat(f16_at(b, 2));
        let q = bytes16(b, 4);
        f(32 * i, V::from_u8(shr_mask(q, 0, 0x0f)).mul(d).add(m));
        f(32 * i + 16, V::from_u8(shr_mask(q, 4, 0x0f)).mul(d).add(m));
    }
}

/// The 6-bit scale and min of Q4_K sub-block `j < 8` from the 12 packed bytes (as the scalar
/// reference unpacks them).
#[inline(always)]
fn q4_k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K (144-byte super-blocks of 256): sub-block `s` is `(d·sc[s])·q − dmin·m[s]`.
#[inline(always)]
unsafe fn q4_k<V: Lanes16>(src: &[u8], f: &mut impl FnMut(usize, V)) {
    for (i, b) in src.chunks_exact(144).enumerate() {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..4 {
            let n0 = bytes16(b, 16 + 32 * j);
            let n1 = bytes16(b, 32 + 32 * j);
            for (half, shift) in [(0, 0), (1, 4)] {
                let s = 2 * j + half;
                let (sc, m) = q4_k_scale_min(&b[4..16], s);
                let ds = V::splat(d * f32::from(sc));
                let dm = V::splat(dmin * f32::from(m));
                let c0 = 256 * i + 32 * s;
                f(c0, ds.mul(V::from_u8(shr_mask(n0, shift, 0x0f))).sub(dm));
                f(
                    c0 + 16,
                    ds.mul(V::from_u8(shr_mask(n1, shift, 0x0f))).sub(dm),
                );
            }
        }
    }
}

/// Q6_K (210-byte super-blocks of 256): group `g` of 16 is `(d·sc[g])·(q − 32)`; see
/// `crate::quant` for the bit layout of the 6-bit `q`.
#[inline(always)]
unsafe fn q6_k<V: Lanes16>(src: &[u8], f: &mut impl FnMut(usize, V)) {
    const QH: usize = 128;
    const SCALES: usize = 192;
    let minus32 = _mm_set1_epi8(32);
    for (i, b) in src.chunks_exact(210).enumerate() {
        let d = f16_at(b, 208);
        for h in 0..2 {
            for k in 0..4 {
                for g in 0..2 {
                    let i0 = 128 * h + 32 * k + 16 * g;
                    let ql = bytes16(b, 64 * h + 32 * (k % 2) + 16 * g);
                    let qh = bytes16(b, QH + 32 * h + 16 * g);
                    let low = shr_mask(ql, 4 * (k as i32 / 2), 0x0f);
                    let high = shr_mask(qh, 2 * k as i32, 0x03);
                    let q = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16::<4>(high)), minus32);
                    let ds = V::splat(d * f32::from(b[SCALES + i0 / 16] as i8));
                    f(256 * i + i0, ds.mul(V::from_i8(q)));
                }
            }
        }
    }
}
