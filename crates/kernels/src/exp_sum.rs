//! `Σ exp(x_i − max)` over a row of logits, in f64: the denominator of every softmax and
//! log-softmax the engine reports (sampled tokens' logprobs, prompt logprobs, `tandem score`).
//!
//! A vocabulary row has ~50k entries; calling the C library's `exp` on each is a visible part
//! of a decode step, more at large batch or when scoring (BENCHMARKS.md § Figures behind
//! choices in the code). Here `exp`
//! is computed in plain arithmetic that vectorizes: `x = k·ln2 + r` with `k` rounded to
//! nearest (the 1.5·2^52 shift trick), `r` reduced with a two-part ln2 (fdlibm's split),
//! `e^r` by its Taylor polynomial to degree 13 in Horner form (truncation error below
//! 1e-17 relative for |r| ≤ ln2/2: within an ulp of the true value), and `2^k` built from
//! its exponent bits. Inputs below −708 are clamped there (e^−708 ≈ 3e−308 where the true
//! value is smaller still; the sum it joins is at least 1, so this changes nothing visible).
//!
//! Reproducibility: the sum runs in 8 interleaved partial sums combined pairwise (the order
//! of [`crate::ops::sum_fixed`]), and every operation is a separately rounded IEEE add or
//! multiply (no fused multiply-add, no reassociation), so the scalar code and the same
//! code compiled for AVX2 or AVX-512 give bitwise equal results, whatever the batch.

use crate::isa::{self, Isa};

const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI` is exact for |k| < 2^20.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000); // 6.93147180369123816490e-1
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76); // 1.90821492927058770002e-10
/// 1.5 · 2^52: adding it rounds a small float to an integer held in the low mantissa bits.
const SHIFTER: f64 = 6_755_399_441_055_744.0;
/// Where [`exp_nonpositive`] clamps its input (e^−708 ≈ 3e−308).
pub(crate) const MIN_X: f64 = -708.0;

/// `1 / i!` for `i = 13, 12, ..., 2` (Horner order).
const INV_FACT: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];

/// `e^x` for `x <= 0` (see the module doc).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f64) -> f64 {
    let x = if x < MIN_X { MIN_X } else { x };
    let t = x * LOG2_E + SHIFTER;
    let k = t - SHIFTER;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = INV_FACT[0];
    for c in &INV_FACT[1..] {
        p = p * r + c;
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    // `t` is SHIFTER + k exactly, so the difference of the bit patterns is k (>= -1022).
    let k_int = t.to_bits().wrapping_sub(SHIFTER.to_bits()) as i64;
    let scale = f64::from_bits(((k_int + 1023) as u64) << 52);
    p * scale
}

#[inline(always)]
fn exp_sum_portable(x: &[f32], max: f32) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += exp_nonpositive((v - max) as f64);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += exp_nonpositive((v - max) as f64);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn exp_sum_avx512(x: &[f32], max: f32) -> f64 {
    exp_sum_portable(x, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_sum_avx2(x: &[f32], max: f32) -> f64 {
    exp_sum_portable(x, max)
}

/// `Σ exp(x_i − max)` with the process-wide kernel variant ([`isa::active`]). `max` should
/// be the row's maximum (every `x_i − max <= 0`) and every value finite.
pub fn exp_sum(x: &[f32], max: f32) -> f64 {
    exp_sum_with(isa::active(), x, max)
}

/// [`exp_sum`] with an explicit variant (all variants give bitwise equal results).
pub fn exp_sum_with(isa: Isa, x: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = matches!(isa, Isa::Avx512 | Isa::Avx512Int8) && isa.is_available();
        let avx2 = matches!(isa, Isa::Avx2 | Isa::Avx2Int8) && isa.is_available();
        if avx512 {
            // SAFETY: the CPU has AVX-512 F and VL (`is_available` checked just above).
            return unsafe { exp_sum_avx512(x, max) };
        }
        if avx2 || avx512 {
            // SAFETY: the CPU has AVX2 (every AVX-512 variant's CPU check implies it here).
            return unsafe { exp_sum_avx2(x, max) };
        }
    }
    let _ = isa;
    exp_sum_portable(x, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_of_the_library() {
        let mut worst = 0u64;
        for i in 0..200_000 {
            let x = -(i as f64) * 0.0035; // 0 .. -700
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
        }
        assert!(worst <= 2, "worst ulp distance {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1000.0) < 1e-300);
    }
}
