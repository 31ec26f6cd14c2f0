//! The [`Format`]s of Q5_0, Q5_1, Q5_K, Q2_K, Q3_K, IQ4_NL and IQ4_XS (see `decode` for the
//! contract: each chunk performs, per element, exactly the f32 operations of the scalar
//! reference in [`crate::quant`], so the decoded values are bitwise equal to it). Bit layouts
//! are documented beside each scalar decoder.

use std::arch::x86_64::*;

use super::decode::{bytes16, f16_at, shr_mask, Format};
use super::lanes::Lanes16;

/// ggml's `kvalues_iq4nl` as 16 bytes (the `pshufb` table of IQ4_NL and IQ4_XS).
#[inline(always)]
unsafe fn iq4_table() -> __m128i {
    _mm_setr_epi8(
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    )
}

/// Byte `i` is 16 where bit `i` of `bits` is set, else 0 (`i < 16`).
#[inline(always)]
unsafe fn fifth_bits(bits: u16) -> __m128i {
    let v = _mm_set1_epi16(bits as i16);
    let spread = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    let mask = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    let hit = _mm_cmpeq_epi8(_mm_and_si128(spread, mask), mask);
    _mm_and_si128(hit, _mm_set1_epi8(16))
}

/// The 16 unsigned 5-bit values of chunk `k < 2` of a Q5_0 / Q5_1 block whose `qh` is at `p`
/// (the 16 nibble bytes follow it).
#[inline(always)]
unsafe fn q5_chunk(p: *const u8, k: usize) -> __m128i {
    let qh = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let low = shr_mask(bytes16(p.add(4)), 4 * k as i32, 0x0f);
    _mm_or_si128(low, fifth_bits((qh >> (16 * k)) as u16))
}

pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q5K;
pub(crate) struct Iq4Nl;
pub(crate) struct Iq4Xs;

/// Q5_0: `(q − 16)·d`.
impl Format for Q5_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 22;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let q = _mm_sub_epi8(q5_chunk(b.add(2), k), _mm_set1_epi8(16));
        V::from_i8(q).mul(V::splat(f16_at(b)))
    }
}

/// Q5_1: `q·d + m`.
impl Format for Q5_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 24;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        V::from_u8(q5_chunk(b.add(4), k))
            .mul(V::splat(f16_at(b)))
            .add(V::splat(f16_at(b.add(2))))
    }
}

/// The 6-bit scale and min of K-quant sub-block `j < 8` from the 12 packed bytes at `s`.
#[inline(always)]
unsafe fn k_scale_min(s: *const u8, j: usize) -> (u8, u8) {
    let s = |i: usize| *s.add(i);
    if j < 4 {
        (s(j) & 63, s(j + 4) & 63)
    } else {
        (
            (s(j + 4) & 0x0f) | ((s(j - 4) >> 6) << 4),
            (s(j + 4) >> 4) | ((s(j) >> 6) << 4),
        )
    }
}

/// Q5_K: sub-block `s` (chunks `2s`, `2s + 1`) is `(d·sc[s])·q − dmin·m[s]`.
impl Format for Q5K {
    const ELEMS: usize = 256;
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let (s, half) = (k / 2, k % 2);
        let (sc, m) = k_scale_min(b.add(4), s);
        let ds = V::splat(f16_at(b) * f32::from(sc));
        let dm = V::splat(f16_at(b.add(2)) * f32::from(m));
        let low = shr_mask(
            bytes16(b.add(48 + 32 * (s / 2) + 16 * half)),
            4 * (s % 2) as i32,
            0x0f,
        );
        let high = shr_mask(bytes16(b.add(16 + 16 * half)), s as i32, 0x01);
        let q = _mm_or_si128(low, _mm_slli_epi16::<4>(high));
        ds.mul(V::from_u8(q)).sub(dm)
    }
}

/// Q2_K: group `k` of 16 is `(d·sc[k])·q − dmin·m[k]`.
impl Format for Q2K {
    const ELEMS: usize = 256;
    const BYTES: usize = 84;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let (h, shift, l0) = (k / 8, 2 * ((k % 8) / 2), 16 * (k % 2));
        let q = shr_mask(bytes16(b.add(16 + 32 * h + l0)), shift as i32, 0x03);
        let scales = *b.add(k);
        let ds = V::splat(f16_at(b.add(80)) * f32::from(scales & 0x0f));
        let dm = V::splat(f16_at(b.add(82)) * f32::from(scales >> 4));
        ds.mul(V::from_u8(q)).sub(dm)
    }
}

/// Q3_K: group `k` of 16 is `(d·(sc[k] − 32))·q` with the signed 3-bit `q`.
impl Format for Q3K {
    const ELEMS: usize = 256;
    const BYTES: usize = 110;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        const SCALES: usize = 96;
        let (h, shift, l0) = (k / 8, 2 * ((k % 8) / 2), 16 * (k % 2));
        let low = shr_mask(bytes16(b.add(32 + 32 * h + l0)), shift as i32, 0x03);
        let high = shr_mask(bytes16(b.add(l0)), (k / 2) as i32, 0x01);
        let q = _mm_sub_epi8(
            _mm_or_si128(low, _mm_slli_epi16::<2>(high)),
            _mm_set1_epi8(4),
        );
        let sl = (*b.add(SCALES + k % 8) >> (4 * (k / 8))) & 0x0f;
        let sh = (*b.add(SCALES + 8 + k % 4) >> (2 * (k / 4))) & 0x03;
        let sc = (sl | (sh << 4)) as i8 - 32;
        V::splat(f16_at(b.add(108)) * f32::from(sc)).mul(V::from_i8(q))
    }
}

/// IQ4_NL: `d·T[q]`.
impl Format for Iq4Nl {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let idx = shr_mask(bytes16(b.add(2)), 4 * k as i32, 0x0f);
        V::splat(f16_at(b)).mul(V::from_i8(_mm_shuffle_epi8(iq4_table(), idx)))
    }
}

/// IQ4_XS: sub-block `s` (chunks `2s`, `2s + 1`) is `(d·(ls[s] − 32))·T[q]`.
impl Format for Iq4Xs {
    const ELEMS: usize = 256;
    const BYTES: usize = 136;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let (s, half) = (k / 2, k % 2);
        let high = u16::from_le_bytes([*b.add(2), *b.add(3)]);
        let low = (*b.add(4 + s / 2) >> (4 * (s % 2))) & 0x0f;
        let ls = low | ((((high >> (2 * s)) & 0x03) as u8) << 4);
        let ds = f16_at(b) * f32::from(ls as i8 - 32);
        let idx = shr_mask(bytes16(b.add(8 + 16 * s)), 4 * half as i32, 0x0f);
        V::splat(ds).mul(V::from_i8(_mm_shuffle_epi8(iq4_table(), idx)))
    }
}
