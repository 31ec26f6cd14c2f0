//! The AVX2 kernels: two `ymm` registers hold the 16 lanes (lanes 0–7, then 8–15).

use std::arch::x86_64::*;

use super::{kernels, lanes::Lanes16};
use crate::DType;

/// 16 f32 lanes in two AVX2 registers.
#[derive(Clone, Copy)]
pub(super) struct Y(__m256, __m256);

impl Lanes16 for Y {
    const IN_REGISTERS: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn zero() -> Self {
        Y(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn splat(v: f32) -> Self {
        Y(_mm256_set1_ps(v), _mm256_set1_ps(v))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const f32) -> Self {
        Y(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0);
        _mm256_storeu_ps(p.add(8), self.1);
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn add(self, o: Self) -> Self {
        Y(_mm256_add_ps(self.0, o.0), _mm256_add_ps(self.1, o.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sub(self, o: Self) -> Self {
        Y(_mm256_sub_ps(self.0, o.0), _mm256_sub_ps(self.1, o.1))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        Y(
            _mm256_fmadd_ps(self.0, b.0, c.0),
            _mm256_fmadd_ps(self.1, b.1, c.1),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn mul(self, o: Self) -> Self {
        Y(_mm256_mul_ps(self.0, o.0), _mm256_mul_ps(self.1, o.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn max(self, o: Self) -> Self {
        Y(_mm256_max_ps(self.0, o.0), _mm256_max_ps(self.1, o.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn min(self, o: Self) -> Self {
        Y(_mm256_min_ps(self.0, o.0), _mm256_min_ps(self.1, o.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn shifted_exponent(self, bias: u32) -> Self {
        // Not a closure: closures do not inherit the target features.
        let b = _mm256_set1_epi32(bias as i32);
        let lo = _mm256_sub_epi32(_mm256_castps_si256(self.0), b);
        let hi = _mm256_sub_epi32(_mm256_castps_si256(self.1), b);
        Y(
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(lo)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(hi)),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn from_u8(b: __m128i) -> Self {
        let hi = _mm_unpackhi_epi64(b, b);
        Y(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn from_i8(b: __m128i) -> Self {
        let hi = _mm_unpackhi_epi64(b, b);
        Y(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_f16(p: *const u8) -> Self {
        Y(
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_bf16(p: *const u8) -> Self {
        Y(bf16_8(p), bf16_8(p.add(16)))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut a = [0.0f32; 16];
        _mm256_storeu_ps(a.as_mut_ptr(), self.0);
        _mm256_storeu_ps(a.as_mut_ptr().add(8), self.1);
        a
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tree_sum(self) -> f32 {
        tree_sum_8(_mm256_add_ps(self.0, self.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn max_lane(self) -> f32 {
        max_lane_8(_mm256_max_ps(self.0, self.1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tree_sum_16(a: &[Self; 16]) -> Self {
        let mut sums = [0.0f32; 16];
        for (s, v) in sums.iter_mut().zip(a) {
            *s = v.tree_sum();
        }
        Self::load(sums.as_ptr())
    }
}

/// 8 little-endian bfloat16 values from `p` (16 bytes), converted exactly.
///
/// # Safety
/// AVX2 must be available; `p` readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bf16_8(p: *const u8) -> __m256 {
    let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
}

/// The largest of the 8 lanes of `v` (which hold no NaN), halving the vector three times.
///
/// # Safety
/// AVX must be available.
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn max_lane_8(v: __m256) -> f32 {
    let m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<0b01>(m2, m2));
    _mm_cvtss_f32(m1)
}

/// The last three levels of the fixed tree on `v` (lane `l` already holds `a[l] + a[l + 8]`):
/// `v[l] + v[l + 4]`, then `+ v[l + 2]`, then `+ v[l + 1]`.
///
/// # Safety
/// AVX must be available.
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn tree_sum_8(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

// The entry points below are what the kernel table points at.

/// # Safety
/// AVX2, FMA and F16C must be available; lengths as documented in `super::kernels`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    kernels::dequantize_row::<Y>(dtype, src, dst)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_1(w: &[f32], x: &[f32]) -> f32 {
    kernels::dot_1::<Y>(w, x)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_4(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    kernels::dot_4::<Y>(w, x)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_4x2(w: [&[f32]; 4], x: [&[f32]; 2]) -> [[f32; 4]; 2] {
    kernels::dot_4x2::<Y>(w, x)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_row(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
    let [d] = kernels::dot_rows::<Y, 1>(dtype, [src], x);
    d
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_4(dtype: DType, src: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    kernels::dot_rows::<Y, 4>(dtype, src, x)
}
