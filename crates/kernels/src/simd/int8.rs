//! The int8 path (opt-in, not bitwise equal to the scalar reference): each activation row is
//! quantized once per matmul to blocks of 32 `i8` with an f32 scale, and Q4_0 / Q4_1 / Q8_0
//! weight blocks are dotted with them in integer arithmetic (AVX-512 VNNI `vpdpbusd`, or
//! AVX2 `vpmaddubsw` + `vpmaddwd`), as llama.cpp does.
//!
//! Reduction order (fixed per row, so results stay batch- and thread-invariant): for each
//! block in order, the 32 integer products are summed exactly into 8 `i32` lanes, converted to
//! f32 and added, times `d_w·d_x`, to 8 f32 lane accumulators; the offset terms (`−8·d_w` for
//! Q4_0, `m_w` for Q4_1) go to one f32 accumulator in block order; at the end the 8 lanes are
//! summed by a fixed tree and the offset accumulator is added.
//!
//! Error: activation rounding adds at most `|w_i|·d_x/2` per element (`d_x = max|x| / 127` of
//! the element's block), plus f32 rounding.

use std::arch::x86_64::*;

use crate::DType;

/// Elements per activation block.
pub(crate) const QK: usize = 32;

/// One block of 32 quantized activations: `x ≈ q·d`; `sum = Σ q`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8Block {
    pub(crate) q: [i8; QK],
    pub(crate) d: f32,
    pub(crate) sum: i32,
}

/// Quantizes `x` (`x.len()` a multiple of 32) into `out` (one block per 32 elements):
/// `d = max|x| / 127`, `q = round(x / d)` (ties away from zero); an all-zero block has `d = 0`.
pub(crate) fn quantize_activations(x: &[f32], out: &mut Vec<Q8Block>) {
    assert!(
        x.len().is_multiple_of(QK),
        "int8 activations: length not a multiple of 32"
    );
    out.clear();
    for xb in x.chunks_exact(QK) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [i8; QK] = std::array::from_fn(|i| (xb[i] * id).round() as i8);
        let sum = q.iter().map(|&v| i32::from(v)).sum();
        out.push(Q8Block { q, d, sum });
    }
}

/// `Σ a·b` over 4-byte groups (unsigned `a`, signed `b`) into 8 `i32` lanes, exactly for the
/// value ranges used here (`a ≤ 128`, `|b| ≤ 127`).
pub(super) trait IntDot {
    /// # Safety
    /// The CPU must support the implementor's features.
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i;
}

/// AVX-512 VNNI on 256-bit registers (needs AVX512VNNI and AVX512VL).
pub(super) struct Vnni;
/// AVX2: `vpmaddubsw` (pairs to i16: `2·128·127 < 2^15`, no saturation) then `vpmaddwd`.
pub(super) struct Avx2Dot;

impl IntDot for Vnni {
    #[inline]
    #[target_feature(enable = "avx512vnni,avx512vl")]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }
}

impl IntDot for Avx2Dot {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
}

/// The dot of the stored row `src` (`dtype` Q4_0, Q4_1 or Q8_0) with the quantized activation
/// row `xq`, in the order of the module docs.
///
/// # Safety
/// The CPU must support AVX2, F16C and `D`'s features. Lengths are asserted.
#[inline(always)]
pub(super) unsafe fn dot_row<D: IntDot>(dtype: DType, src: &[u8], xq: &[Q8Block]) -> f32 {
    assert!(
        dtype.bytes_for(QK * xq.len()) == Some(src.len()),
        "int8 dot: {} bytes are not {} elements of {dtype}",
        src.len(),
        QK * xq.len()
    );
    let mut acc = _mm256_setzero_ps();
    let mut offsets = 0.0f32;
    let block_bytes = dtype.block_bytes();
    for (b, x) in src.chunks_exact(block_bytes).zip(xq) {
        let xv = _mm256_loadu_si256(x.q.as_ptr().cast());
        let (p, scale) = match dtype {
            DType::Q8_0 => {
                let w = _mm256_loadu_si256(b[2..34].as_ptr().cast());
                let p = D::dot(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
                (p, f16_at(b, 0) * x.d)
            }
            DType::Q4_0 => {
                let dd = f16_at(b, 0) * x.d;
                offsets += dd * (-8 * x.sum) as f32;
                (D::dot(nibbles(&b[2..18]), xv), dd)
            }
            DType::Q4_1 => {
                offsets += f16_at(b, 2) * (x.d * x.sum as f32);
                (D::dot(nibbles(&b[4..20]), xv), f16_at(b, 0) * x.d)
            }
            _ => unreachable!("int8 dot: {dtype} is not an int8 type (checked by the caller)"),
        };
        acc = _mm256_add_ps(
            acc,
            _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale)),
        );
    }
    let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1) + offsets
}

/// The 16 nibble bytes as 32 unsigned bytes: low nibbles (elements 0–15), then high nibbles.
#[inline(always)]
unsafe fn nibbles(b: &[u8]) -> __m256i {
    let v = _mm_loadu_si128(b[..16].as_ptr().cast());
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(v, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
    _mm256_set_m128i(hi, lo)
}

/// The little-endian f16 at `b[at..at + 2]` as f32 (exact; F16C).
#[inline(always)]
unsafe fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_row_avx2(dtype: DType, src: &[u8], xq: &[Q8Block]) -> f32 {
    dot_row::<Avx2Dot>(dtype, src, xq)
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) unsafe fn dot_row_vnni(dtype: DType, src: &[u8], xq: &[Q8Block]) -> f32 {
    dot_row::<Vnni>(dtype, src, xq)
}
