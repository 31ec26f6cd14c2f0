//! The sampler's passes over a whole row of f64 logits: its maximum, the weights
//! `e^((l − max) / T)` of a temperature draw with their sum, and the mass of the weights at
//! least a cut (top-p's pre-cut).
//!
//! A large vocabulary makes these the sampler's cost: Gemma 3's 262,144 entries took a libm
//! `exp` each, several milliseconds a row, on the engine's thread (BENCHMARKS.md § The host
//! sampler's passes over the vocabulary). Here the exponential is [`crate::exp_sum`]'s
//! (within two ulps of the library's), in plain arithmetic that vectorizes, and the maximum is
//! taken in interleaved lanes.
//!
//! Reproducibility: each weight is a function of its own entry; the sum runs in 8 interleaved
//! partial sums combined pairwise (the order of [`crate::ops::sum_fixed`]); every operation
//! is a separately rounded IEEE one. So the scalar code and the same code compiled for AVX2
//! or AVX-512 give bitwise equal results, and [`exp_weight`] gives the bits
//! [`exp_weights`] writes.

use crate::exp_sum::{exp_nonpositive, MIN_X};
use crate::isa;
use crate::isa_dispatch::with_isa;

/// The weight `e^((value − max) / t)` of one entry: 0 for `-inf` and wherever the exponent is
/// below −708 (where the true value is below 3e−308). `max` must be at least `value`, `t > 0`.
#[inline(always)]
pub fn exp_weight(value: f64, max: f64, t: f64) -> f64 {
    let x = (value - max) / t;
    // Both computed, then selected: a branch here keeps the loops from vectorizing.
    let e = exp_nonpositive(x);
    if x < MIN_X {
        0.0
    } else {
        e
    }
}

/// The largest entry of `values` (`-inf` for an empty row). The row must hold no NaN.
pub fn maximum(values: &[f64]) -> f64 {
    maximum_with(isa::active(), values)
}

with_isa! {
    /// [`maximum`] with an explicit variant (all variants give the same result).
    maximum_with => maximum_portable(values: &[f64]) -> f64
}

/// Replaces every entry `v` of `values` by [`exp_weight`]`(v, max, t)` and returns their sum.
/// `max` must be at least every entry, `t > 0`.
pub fn exp_weights(values: &mut [f64], max: f64, t: f64) -> f64 {
    exp_weights_with(isa::active(), values, max, t)
}

with_isa! {
    /// [`exp_weights`] with an explicit variant (all variants give bitwise equal results).
    exp_weights_with => exp_weights_portable(values: &mut [f64], max: f64, t: f64) -> f64
}

/// The sum of the entries of `weights` that are at least `cut`, in the order of
/// [`exp_weights`]' sum (so every variant gives the same bits).
pub fn mass_at_least(weights: &[f64], cut: f64) -> f64 {
    mass_at_least_with(isa::active(), weights, cut)
}

with_isa! {
    /// [`mass_at_least`] with an explicit variant (all variants give bitwise equal results).
    mass_at_least_with => mass_at_least_portable(weights: &[f64], cut: f64) -> f64
}

#[inline(always)]
fn maximum_portable(values: &[f64]) -> f64 {
    let mut lanes = [f64::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // A comparison rather than `f64::max` (whose NaN rule keeps it from vectorizing).
            *m = if v > *m { v } else { *m };
        }
    }
    for (m, &v) in lanes.iter_mut().zip(tail) {
        *m = if v > *m { v } else { *m };
    }
    lanes
        .into_iter()
        .fold(f64::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

#[inline(always)]
fn mass_at_least_portable(weights: &[f64], cut: f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = weights.chunks_exact(8);
    let tail = chunks.remainder();
    // Selected, not branched on: the loop vectorizes.
    let kept = |w: f64| if w >= cut { w } else { 0.0 };
    for c in chunks {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a += kept(w);
        }
    }
    for (a, &w) in acc.iter_mut().zip(tail) {
        *a += kept(w);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[inline(always)]
fn exp_weights_portable(values: &mut [f64], max: f64, t: f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = values.chunks_exact_mut(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
            *v = exp_weight(*v, max, t);
            *a += *v;
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.into_remainder()) {
        *v = exp_weight(*v, max, t);
        *a += *v;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// A row with a spread of values, `-inf` entries and a length off the lane count.
    fn row(n: usize) -> Vec<f64> {
        let mut s = 0x1234_5678u64;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if i % 97 == 5 {
                    f64::NEG_INFINITY
                } else {
                    ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 60.0
                }
            })
            .collect()
    }

    #[test]
    fn maximum_is_the_largest_entry() {
        for n in [0, 1, 7, 8, 9, 1000, 4099] {
            let r = row(n);
            let want = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                if isa.is_available() {
                    assert_eq!(maximum_with(isa, &r), want, "n = {n}, {isa:?}");
                }
            }
        }
        let mut r = row(1000);
        r[999] = 1e9; // in the tail of the lanes
        assert_eq!(maximum(&r), 1e9);
        assert_eq!(maximum(&[f64::NEG_INFINITY; 3]), f64::NEG_INFINITY);
    }

    #[test]
    fn weights_match_the_library_exp_and_every_variant_gives_the_same_bits() {
        for n in [1, 8, 13, 5003] {
            for t in [1.0, 0.7, 1.9] {
                let r = row(n);
                let max = maximum(&r);
                let mut portable = r.clone();
                let sum = exp_weights_with(Isa::Scalar, &mut portable, max, t);
                // Each weight: within two ulps of the library's, 0 for -inf, and what the
                // scalar function gives.
                for (&w, &v) in portable.iter().zip(&r) {
                    let want = ((v - max) / t).exp();
                    assert!(w.to_bits().abs_diff(want.to_bits()) <= 2, "{w} vs {want}");
                    assert_eq!(w.to_bits(), exp_weight(v, max, t).to_bits());
                }
                // The sum: in the fixed order, close to the sequential one.
                let sequential: f64 = portable.iter().sum();
                assert!((sum - sequential).abs() <= 1e-12 * sequential);
                for isa in [Isa::Avx2, Isa::Avx512] {
                    if !isa.is_available() {
                        continue;
                    }
                    let mut v = r.clone();
                    let s = exp_weights_with(isa, &mut v, max, t);
                    assert_eq!(s.to_bits(), sum.to_bits(), "{isa:?}");
                    assert!(v
                        .iter()
                        .zip(&portable)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
    }

    #[test]
    fn mass_at_least_a_cut_sums_exactly_those_weights() {
        for n in [0, 1, 9, 5003] {
            let r = row(n);
            let mut w = r.clone();
            exp_weights(&mut w, maximum(&r), 1.3);
            for cut in [0.0, 1e-9, 0.01, 0.5, 1.0, 2.0] {
                let want: f64 = w.iter().filter(|&&v| v >= cut).sum();
                let got = mass_at_least_with(Isa::Scalar, &w, cut);
                assert!((got - want).abs() <= 1e-12 * want, "n {n} cut {cut}");
                for isa in [Isa::Avx2, Isa::Avx512]
                    .into_iter()
                    .filter(|i| i.is_available())
                {
                    let bits = mass_at_least_with(isa, &w, cut).to_bits();
                    assert_eq!(bits, got.to_bits(), "{isa:?}");
                }
            }
        }
        // A weight equal to the cut counts.
        assert_eq!(mass_at_least(&[0.25, 0.5, 0.125], 0.25), 0.75);
    }

    #[test]
    fn far_below_the_maximum_weighs_nothing() {
        assert_eq!(exp_weight(-800.0, 0.0, 1.0), 0.0);
        assert_eq!(exp_weight(f64::NEG_INFINITY, 3.0, 0.5), 0.0);
        assert_eq!(exp_weight(2.0, 2.0, 0.3), 1.0);
        assert!(exp_weight(-700.0, 0.0, 1.0) > 0.0);
    }
}
