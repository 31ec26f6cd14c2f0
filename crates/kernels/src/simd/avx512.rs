//! The AVX-512 kernels: one `zmm` register holds the 16 lanes.

use std::arch::x86_64::*;

use super::{kernels, lanes::Lanes16};
use crate::dot16::LANES;
use crate::DType;

/// 16 f32 lanes in one AVX-512 register.
#[derive(Clone, Copy)]
pub(super) struct Z(__m512);

impl Lanes16 for Z {
    const IN_REGISTERS: usize = 32;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn zero() -> Self {
        Z(_mm512_setzero_ps())
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn splat(v: f32) -> Self {
        Z(_mm512_set1_ps(v))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const f32) -> Self {
        Z(_mm512_loadu_ps(p))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn add(self, o: Self) -> Self {
        Z(_mm512_add_ps(self.0, o.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sub(self, o: Self) -> Self {
        Z(_mm512_sub_ps(self.0, o.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        Z(_mm512_fmadd_ps(self.0, b.0, c.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul(self, o: Self) -> Self {
        Z(_mm512_mul_ps(self.0, o.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn max(self, o: Self) -> Self {
        Z(_mm512_max_ps(self.0, o.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn min(self, o: Self) -> Self {
        Z(_mm512_min_ps(self.0, o.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn shifted_exponent(self, bias: u32) -> Self {
        let bits = _mm512_sub_epi32(_mm512_castps_si512(self.0), _mm512_set1_epi32(bias as i32));
        Z(_mm512_castsi512_ps(_mm512_slli_epi32::<23>(bits)))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn from_u8(b: __m128i) -> Self {
        Z(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn from_i8(b: __m128i) -> Self {
        Z(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f16(p: *const u8) -> Self {
        Z(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast())))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_bf16(p: *const u8) -> Self {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        Z(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide)))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut a = [0.0f32; 16];
        _mm512_storeu_ps(a.as_mut_ptr(), self.0);
        a
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tree_sum(self) -> f32 {
        let lo = _mm512_castps512_ps256(self.0);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
        super::avx2::tree_sum_8(_mm256_add_ps(lo, hi))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn max_lane(self) -> f32 {
        let lo = _mm512_castps512_ps256(self.0);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
        super::avx2::max_lane_8(_mm256_max_ps(lo, hi))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tree_sum_16(a: &[Self; 16]) -> Self {
        // `tree_sum_16` below puts the sum of its `a[4j + m]` in lane `4m + j`.
        let mut t = [_mm512_setzero_ps(); 16];
        for m in 0..4 {
            for j in 0..4 {
                t[4 * j + m] = a[4 * m + j].0;
            }
        }
        Z(tree_sum_16(t))
    }
}

// The entry points below are what the kernel table points at.
// Safety (all four): the CPU must support AVX-512 F, BW and VL; the slices must have the
// lengths documented in `super::kernels`.

/// # Safety
/// See the note above: AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    kernels::dequantize_row::<Z>(dtype, src, dst)
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_1(w: &[f32], x: &[f32]) -> f32 {
    kernels::dot_1::<Z>(w, x)
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_4(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    kernels::dot_4::<Z>(w, x)
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_4x2(w: [&[f32]; 4], x: [&[f32]; 2]) -> [[f32; 4]; 2] {
    kernels::dot_4x2::<Z>(w, x)
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_4x4(w: [&[f32]; 4], x: [&[f32]; 4]) -> [[f32; 4]; 4] {
    if !x[0].len().is_multiple_of(LANES) {
        return kernels::dot_4x4::<Z>(w, x); // the scalar tail, then one tree per result
    }
    let acc = kernels::acc_4x4::<Z>(w, x);
    // `tree_sum_16` wants accumulator `4i + t` in slot `4i + t` (row i, token t) to put
    // result (t, i) in lane `4t + i`, the layout of the output array.
    let mut a = [_mm512_setzero_ps(); 16];
    for t in 0..4 {
        for i in 0..4 {
            a[4 * i + t] = acc[t][i].0;
        }
    }
    let mut out = [[0.0f32; 4]; 4];
    _mm512_storeu_ps(out.as_mut_ptr().cast(), tree_sum_16(a));
    out
}

/// The fixed tree of [`Lanes16::tree_sum`] applied to 16 vectors at once: lane `4m + j` of
/// the result is the tree sum of `a[4j + m]`. Each level adds, lane by lane, exactly the pairs
/// the tree adds (`v[l] + v[l + w]` for w = 8, 4, 2, 1, lower lane first), gathered from two
/// vectors by shuffles, so every result is bitwise equal to `a[k].tree_sum()`; 15 vector
/// additions instead of 16 separate trees.
///
/// # Safety
/// AVX-512 F must be available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tree_sum_16(a: [__m512; 16]) -> __m512 {
    // Level 8: 128-bit blocks (0, 1) + (2, 3) of two vectors -> two 8-lane sums each.
    let mut v = [_mm512_setzero_ps(); 8];
    for p in 0..8 {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        let lo = _mm512_shuffle_f32x4::<0x44>(x, y);
        let hi = _mm512_shuffle_f32x4::<0xEE>(x, y);
        v[p] = _mm512_add_ps(lo, hi);
    }
    // Level 4: blocks (0, 2) + (1, 3) -> one 4-lane sum per 128-bit block.
    let mut q = [_mm512_setzero_ps(); 4];
    for r in 0..4 {
        let (x, y) = (v[2 * r], v[2 * r + 1]);
        let lo = _mm512_shuffle_f32x4::<0x88>(x, y);
        let hi = _mm512_shuffle_f32x4::<0xDD>(x, y);
        q[r] = _mm512_add_ps(lo, hi);
    }
    // Level 2, within each 128-bit block: elements (0, 1) + (2, 3).
    let mut h = [_mm512_setzero_ps(); 2];
    for s in 0..2 {
        let (x, y) = (q[2 * s], q[2 * s + 1]);
        let lo = _mm512_shuffle_ps::<0x44>(x, y);
        let hi = _mm512_shuffle_ps::<0xEE>(x, y);
        h[s] = _mm512_add_ps(lo, hi);
    }
    // Level 1: elements (0, 2) + (1, 3).
    let lo = _mm512_shuffle_ps::<0x88>(h[0], h[1]);
    let hi = _mm512_shuffle_ps::<0xDD>(h[0], h[1]);
    _mm512_add_ps(lo, hi)
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_row(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
    let [d] = kernels::dot_rows::<Z, 1>(dtype, [src], x);
    d
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dot_rows_4(dtype: DType, src: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    kernels::dot_rows::<Z, 4>(dtype, src, x)
}
