//! Decoding of stored rows into 16-lane f32 vectors ("chunks" of 16 consecutive columns).
//!
//! Each row format is a [`Format`]: a row is a sequence of blocks of [`Format::ELEMS`]
//! elements (for the float formats a "block" is one chunk of 16 elements and the row's last
//! `len % 16` elements are left to the scalar code). Chunk `k` of a block holds its elements
//! `16k .. 16k + 16`, lane `l` element `16k + l`.
//!
//! Every decoder performs, per element, exactly the f32 operations of the scalar reference in
//! [`crate::quant`] (exact integer-to-float conversions, then the same rounded multiplications
//! and additions in the same order), so the decoded values are bitwise equal to
//! [`crate::quant::dequantize_row`]'s.

use std::arch::x86_64::*;

use super::lanes::Lanes16;
use crate::DType;

/// A row format decodable 16 elements at a time.
pub(super) trait Format {
    /// Elements per block (a multiple of 16).
    const ELEMS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Chunk `k < ELEMS / 16` of the block at `b`.
    ///
    /// # Safety
    /// `b` must be readable for `BYTES` bytes, `k < ELEMS / 16`, and the CPU must support
    /// `V`'s features.
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V;
}

/// Code generic over the format: what [`dispatch`] runs for a run-time [`DType`].
pub(super) trait WithFormat<V: Lanes16> {
    type Out;
    /// # Safety
    /// The CPU must support `V`'s features.
    unsafe fn call<F: Format>(self) -> Self::Out;
}

/// Runs `op` with the [`Format`] of `dtype`.
///
/// # Safety
/// The CPU must support `V`'s features.
#[inline(always)]
pub(super) unsafe fn dispatch<V: Lanes16, O: WithFormat<V>>(dtype: DType, op: O) -> O::Out {
    match dtype {
        DType::F32 => op.call::<F32>(),
        DType::F16 => op.call::<F16>(),
        DType::BF16 => op.call::<Bf16>(),
        DType::Q8_0 => op.call::<Q8_0>(),
        DType::Q4_0 => op.call::<Q4_0>(),
        DType::Q4_1 => op.call::<Q4_1>(),
        DType::Q5_0 => op.call::<Q5_0>(),
        DType::Q5_1 => op.call::<Q5_1>(),
        DType::Q2_K => op.call::<Q2K>(),
        DType::Q3_K => op.call::<Q3K>(),
        DType::Q4_K => op.call::<Q4K>(),
        DType::Q5_K => op.call::<Q5K>(),
        DType::Q6_K => op.call::<Q6K>(),
        DType::IQ4_NL => op.call::<Iq4Nl>(),
        DType::IQ4_XS => op.call::<Iq4Xs>(),
    }
}

/// The little-endian f16 at `p` as f32 (exact, as the scalar reference's conversion; F16C,
/// which both SIMD variants require).
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 16 bytes from `p` (unaligned).
#[inline(always)]
pub(super) unsafe fn bytes16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// `(v >> shift) & mask` on each byte (the 16-bit shift's spill from the neighbouring byte
/// lands only in bits the mask clears, since `mask < 1 << (8 − shift)`).
///
/// # Safety
/// SSE2 only (always present on x86-64); unsafe because it is a target-feature call.
#[inline(always)]
pub(super) unsafe fn shr_mask(v: __m128i, shift: i32, mask: i8) -> __m128i {
    _mm_and_si128(
        _mm_srl_epi16(v, _mm_cvtsi32_si128(shift)),
        _mm_set1_epi8(mask),
    )
}

pub(super) struct F32;
pub(super) struct F16;
pub(super) struct Bf16;
pub(super) struct Q8_0;
pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q4K;
pub(super) struct Q6K;
pub(super) use super::decode_more::{Iq4Nl, Iq4Xs, Q2K, Q3K, Q5K, Q5_0, Q5_1};

impl Format for F32 {
    const ELEMS: usize = 16;
    const BYTES: usize = 64;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, _k: usize) -> V {
        V::load(b.cast())
    }
}

impl Format for F16 {
    const ELEMS: usize = 16;
    const BYTES: usize = 32;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, _k: usize) -> V {
        V::load_f16(b)
    }
}

impl Format for Bf16 {
    const ELEMS: usize = 16;
    const BYTES: usize = 32;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, _k: usize) -> V {
        V::load_bf16(b)
    }
}

/// Q8_0: f16 `d`, 32 × i8 `q`; `q·d`.
impl Format for Q8_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        V::from_i8(bytes16(b.add(2 + 16 * k))).mul(V::splat(f16_at(b)))
    }
}

/// Q4_0: f16 `d`, 16 bytes of nibbles (low nibbles are elements 0–15); `(q − 8)·d`.
impl Format for Q4_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let q = _mm_sub_epi8(
            shr_mask(bytes16(b.add(2)), 4 * k as i32, 0x0f),
            _mm_set1_epi8(8),
        );
        V::from_i8(q).mul(V::splat(f16_at(b)))
    }
}

/// Q4_1: f16 `d`, f16 `m`, 16 bytes of nibbles (low nibbles are elements 0–15); `q·d + m`.
impl Format for Q4_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let q = shr_mask(bytes16(b.add(4)), 4 * k as i32, 0x0f);
        V::from_u8(q)
            .mul(V::splat(f16_at(b)))
            .add(V::splat(f16_at(b.add(2))))
    }
}

/// The 6-bit scale and min of Q4_K sub-block `j < 8` from the 12 packed bytes at `s` (as the
/// scalar reference unpacks them).
#[inline(always)]
unsafe fn q4_k_scale_min(s: *const u8, j: usize) -> (u8, u8) {
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

/// Q4_K: sub-block `s` (32 elements, chunks `2s`, `2s + 1`) is `(d·sc[s])·q − dmin·m[s]`;
/// bytes `16 + 32j ..` hold sub-block `2j` in low nibbles, `2j + 1` in high nibbles.
impl Format for Q4K {
    const ELEMS: usize = 256;
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        let (s, half) = (k / 2, k % 2);
        let (sc, m) = q4_k_scale_min(b.add(4), s);
        let ds = V::splat(f16_at(b) * f32::from(sc));
        let dm = V::splat(f16_at(b.add(2)) * f32::from(m));
        let nibbles = bytes16(b.add(16 + 32 * (s / 2) + 16 * half));
        let q = shr_mask(nibbles, 4 * (s % 2) as i32, 0x0f);
        ds.mul(V::from_u8(q)).sub(dm)
    }
}

/// Q6_K: group `k` of 16 is `(d·sc[k])·(q − 32)`; see `crate::quant` for the layout of `q`.
impl Format for Q6K {
    const ELEMS: usize = 256;
    const BYTES: usize = 210;
    #[inline(always)]
    unsafe fn chunk<V: Lanes16>(b: *const u8, k: usize) -> V {
        const QH: usize = 128;
        const SCALES: usize = 192;
        let (h, kk, g) = (k / 8, (k / 2) % 4, k % 2);
        let ql = bytes16(b.add(64 * h + 32 * (kk % 2) + 16 * g));
        let qh = bytes16(b.add(QH + 32 * h + 16 * g));
        let low = shr_mask(ql, 4 * (kk as i32 / 2), 0x0f);
        let high = shr_mask(qh, 2 * kk as i32, 0x03);
        let q = _mm_sub_epi8(
            _mm_or_si128(low, _mm_slli_epi16::<4>(high)),
            _mm_set1_epi8(32),
        );
        let ds = V::splat(f16_at(b.add(208)) * f32::from(*b.add(SCALES + k) as i8));
        ds.mul(V::from_i8(q))
    }
}
