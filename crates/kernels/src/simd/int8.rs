//! The int8 path (opt-in, not bitwise equal to the scalar reference): each activation row is
//! quantized once per matmul to blocks of 32 `i8` with an f32 scale, and Q4_0 / Q4_1 / Q8_0
//! weight blocks are dotted with them in integer arithmetic (AVX-512 VNNI `vpdpbusd`, or
//! AVX2 `vpmaddubsw` + `vpmaddwd`), as llama.cpp does.
//!
//! Reduction order (fixed per row, so results stay batch- and thread-invariant): for each
//! block in order, the 32 integer products are summed exactly into 8 `i32` lanes, converted to
//! f32 and added, times `d_w·d_x`, to 8 f32 lane accumulators (one fused multiply-add); the offset terms (`−8·d_w` for
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

/// A weight block format of the int8 path.
pub(super) trait IntFormat {
    const BYTES: usize;
    /// The block at `b` as (unsigned byte operand, sign source for the activations, `d`, `m`).
    ///
    /// # Safety
    /// `b` readable for `BYTES` bytes; AVX2 and F16C available.
    unsafe fn weights(b: *const u8) -> (__m256i, __m256i, f32, f32);
    /// The signed operand from the activations (`sign` as returned by `weights`).
    ///
    /// # Safety
    /// AVX2 available.
    unsafe fn x_operand(x: __m256i, sign: __m256i) -> __m256i;
    /// The block's offset term (`d_w·d_x` and `m_w` given) added outside the lanes.
    fn offset(dd: f32, m: f32, x: &Q8Block) -> f32;
}

pub(super) struct Q8_0;
pub(super) struct Q4_0;
pub(super) struct Q4_1;

impl IntFormat for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> (__m256i, __m256i, f32, f32) {
        let w = _mm256_loadu_si256(b.add(2).cast());
        (_mm256_abs_epi8(w), w, f16_at(b), 0.0)
    }
    #[inline(always)]
    unsafe fn x_operand(x: __m256i, sign: __m256i) -> __m256i {
        _mm256_sign_epi8(x, sign)
    }
    #[inline(always)]
    fn offset(_dd: f32, _m: f32, _x: &Q8Block) -> f32 {
        0.0
    }
}

impl IntFormat for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> (__m256i, __m256i, f32, f32) {
        (nibbles(b.add(2)), _mm256_setzero_si256(), f16_at(b), 0.0)
    }
    #[inline(always)]
    unsafe fn x_operand(x: __m256i, _sign: __m256i) -> __m256i {
        x
    }
    #[inline(always)]
    fn offset(dd: f32, _m: f32, x: &Q8Block) -> f32 {
        dd * (-8 * x.sum) as f32
    }
}

impl IntFormat for Q4_1 {
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> (__m256i, __m256i, f32, f32) {
        (
            nibbles(b.add(4)),
            _mm256_setzero_si256(),
            f16_at(b),
            f16_at(b.add(2)),
        )
    }
    #[inline(always)]
    unsafe fn x_operand(x: __m256i, _sign: __m256i) -> __m256i {
        x
    }
    #[inline(always)]
    fn offset(_dd: f32, m: f32, x: &Q8Block) -> f32 {
        m * (x.d * x.sum as f32)
    }
}

/// One token's running sums: 8 f32 lanes and the offset accumulator.
#[derive(Clone, Copy)]
struct Acc(__m256, __m128);

impl Acc {
    /// Adds block `x` against the decoded weight block `(wu, sign, d, m)`.
    #[inline(always)]
    unsafe fn add<D: IntDot, F: IntFormat>(
        &mut self,
        w: (__m256i, __m256i, f32, f32),
        x: &Q8Block,
    ) {
        let (wu, sign, d, m) = w;
        let xv = F::x_operand(_mm256_loadu_si256(x.q.as_ptr().cast()), sign);
        // The per-token scalars stay in vector registers: as plain f32 code, LLVM merges
        // the four tokens' scalars into gathers, which are slow.
        let dd = _mm_mul_ss(_mm_set_ss(d), _mm_load_ss(&x.d));
        let off = _mm_set_ss(F::offset(_mm_cvtss_f32(dd), m, x));
        self.1 = _mm_add_ss(self.1, off);
        let p = _mm256_cvtepi32_ps(D::dot(wu, xv));
        self.0 = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(dd), self.0);
    }

    /// The fixed tree over the 8 lanes, plus the offsets.
    #[inline(always)]
    unsafe fn total(self) -> f32 {
        let v = self.0;
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
        _mm_cvtss_f32(s1) + _mm_cvtss_f32(self.1)
    }
}

/// `out[t, j] = W[r] · xq[t]` for one stored row `src` and every token of `xq`
/// (`[n_tokens, blocks]`), four tokens at a time (each weight block decoded once for the
/// four); every result is computed in the order of the module docs whatever the grouping.
///
/// # Safety
/// The CPU must support AVX2, F16C and `D`'s features. Lengths are asserted.
#[inline(always)]
unsafe fn row_all_tokens<D: IntDot, F: IntFormat>(src: &[u8], xq: &[Q8Block], out: &mut [f32]) {
    let blocks = src.len() / F::BYTES;
    assert!(
        src.len() == blocks * F::BYTES && xq.len() == out.len() * blocks,
        "int8 dot: shapes do not match"
    );
    let b = src.as_ptr();
    let zero = Acc(_mm256_setzero_ps(), _mm_setzero_ps());
    let mut groups = out.chunks_exact_mut(4);
    let mut t0 = 0;
    for o in groups.by_ref() {
        let x = &xq[t0 * blocks..(t0 + 4) * blocks];
        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
        for bi in 0..blocks {
            let w = F::weights(b.add(bi * F::BYTES));
            a0.add::<D, F>(w, &x[bi]);
            a1.add::<D, F>(w, &x[blocks + bi]);
            a2.add::<D, F>(w, &x[2 * blocks + bi]);
            a3.add::<D, F>(w, &x[3 * blocks + bi]);
        }
        o.copy_from_slice(&[a0.total(), a1.total(), a2.total(), a3.total()]);
        t0 += 4;
    }
    for (t, o) in groups.into_remainder().iter_mut().enumerate() {
        let x = &xq[(t0 + t) * blocks..(t0 + t + 1) * blocks];
        let mut a = zero;
        for (bi, xb) in x.iter().enumerate() {
            a.add::<D, F>(F::weights(b.add(bi * F::BYTES)), xb);
        }
        *o = a.total();
    }
}

/// [`row_all_tokens`] for a run-time `dtype` (Q4_0, Q4_1 or Q8_0).
///
/// # Safety
/// As [`row_all_tokens`].
#[inline(always)]
unsafe fn row_dispatch<D: IntDot>(dtype: DType, src: &[u8], xq: &[Q8Block], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => row_all_tokens::<D, Q8_0>(src, xq, out),
        DType::Q4_0 => row_all_tokens::<D, Q4_0>(src, xq, out),
        DType::Q4_1 => row_all_tokens::<D, Q4_1>(src, xq, out),
        _ => unreachable!("int8 dot: {dtype} is not an int8 type (checked by the caller)"),
    }
}

/// The 16 nibble bytes as 32 unsigned bytes: low nibbles (elements 0–15), then high nibbles.
#[inline(always)]
unsafe fn nibbles(b: *const u8) -> __m256i {
    let v = _mm_loadu_si128(b.cast());
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(v, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
    _mm256_set_m128i(hi, lo)
}

/// The little-endian f16 at `b` as f32 (exact; F16C).
#[inline(always)]
unsafe fn f16_at(b: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*b, *b.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2(dtype: DType, src: &[u8], xq: &[Q8Block], out: &mut [f32]) {
    row_dispatch::<Avx2Dot>(dtype, src, xq, out)
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn rows_vnni(dtype: DType, src: &[u8], xq: &[Q8Block], out: &mut [f32]) {
    row_dispatch::<Vnni>(dtype, src, xq, out)
}
