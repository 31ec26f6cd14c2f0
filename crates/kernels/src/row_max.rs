//! The maximum of a row of logits and the first position that holds it: the greedy pick of
//! every row the host samples, and the shift of its log-softmax.
//!
//! A vocabulary row has 50k to 260k entries, so a scalar loop over it (`f32::max` does not
//! vectorize, for its NaN rule) is a visible part of a decode step at large batch. Here the
//! maximum runs in 16 interleaved lanes with a comparison the compiler turns into vector
//! max instructions, beside a flag of any value that is not finite; then the first index of
//! the maximum is found 16 values at a time. The maximum of finite values is exact
//! whatever the order, so every kernel variant gives the same result.

use crate::isa::{self, Isa};

/// Interleaved lanes: a multiple of every vector width.
const LANES: usize = 16;

/// `max = x > max ? x : max`, lane by lane (the form of a vector max instruction).
#[inline(always)]
fn fold_lanes(max: &mut [f32; LANES], finite: &mut [bool; LANES], values: &[f32]) {
    for ((m, f), &v) in max.iter_mut().zip(finite.iter_mut()).zip(values) {
        *m = if v > *m { v } else { *m };
        *f &= v.is_finite();
    }
}

#[inline(always)]
fn max_finite_portable(row: &[f32]) -> Option<f32> {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut finite = [true; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        fold_lanes(&mut lanes, &mut finite, c);
    }
    fold_lanes(&mut lanes, &mut finite, tail);
    let max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    (finite.iter().all(|&f| f) && max.is_finite()).then_some(max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn max_finite_avx512(row: &[f32]) -> Option<f32> {
    max_finite_portable(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_finite_avx2(row: &[f32]) -> Option<f32> {
    max_finite_portable(row)
}

/// The maximum of `row`, with the process-wide kernel variant ([`isa::active`]); `None`
/// when the row is empty or holds an infinity or a NaN.
pub fn max_finite(row: &[f32]) -> Option<f32> {
    max_finite_with(isa::active(), row)
}

/// [`max_finite`] with an explicit variant (all variants give the same result).
pub fn max_finite_with(isa: Isa, row: &[f32]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = matches!(isa, Isa::Avx512 | Isa::Avx512Int8) && isa.is_available();
        let avx2 = matches!(isa, Isa::Avx2 | Isa::Avx2Int8) && isa.is_available();
        if avx512 {
            // SAFETY: the CPU has AVX-512 F and VL (`is_available` checked just above).
            return unsafe { max_finite_avx512(row) };
        }
        if avx2 {
            // SAFETY: the CPU has AVX2 (`is_available` checked just above).
            return unsafe { max_finite_avx2(row) };
        }
    }
    let _ = isa;
    max_finite_portable(row)
}

/// The first index of `value` in `row`, 16 values at a time (the comparisons of a chunk
/// vectorize; the chunk holding it is then searched one by one).
fn first_index(row: &[f32], value: f32) -> Option<usize> {
    let chunks = row.chunks_exact(LANES);
    let tail_start = row.len() - chunks.remainder().len();
    for (k, c) in chunks.enumerate() {
        if c.iter().fold(false, |hit, &v| hit | (v == value)) {
            return c.iter().position(|&v| v == value).map(|i| k * LANES + i);
        }
    }
    row[tail_start..]
        .iter()
        .position(|&v| v == value)
        .map(|i| tail_start + i)
}

/// The first index of the maximum of `row` and the maximum: [`max_finite`] with the
/// process-wide variant, then its first position.
pub fn greedy(row: &[f32]) -> Option<(usize, f32)> {
    greedy_with(isa::active(), row)
}

/// [`greedy`] with an explicit variant (all variants give the same result).
pub fn greedy_with(isa: Isa, row: &[f32]) -> Option<(usize, f32)> {
    let max = max_finite_with(isa, row)?;
    first_index(row, max).map(|i| (i, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain definition: every value finite, the first index of the largest.
    fn reference(row: &[f32]) -> Option<(usize, f32)> {
        if row.is_empty() || row.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter().position(|&v| v == max).map(|i| (i, max))
    }

    #[test]
    fn every_variant_picks_the_first_maximum_of_a_finite_row() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        };
        for len in [0usize, 1, 5, 15, 16, 17, 31, 33, 100, 1000] {
            for case in 0..8 {
                let mut row: Vec<f32> = (0..len).map(|_| next()).collect();
                if len > 2 {
                    let (a, b) = (len / 3, len - 1);
                    match case {
                        // Ties: the first one wins, in a lane or in the tail.
                        1 => (row[a], row[b]) = (99.0, 99.0),
                        2 => row[b] = 99.0,
                        // ±0 as the maximum of a non-positive row.
                        3 => {
                            row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                            (row[a], row[b]) = (-0.0, 0.0);
                        }
                        // Not finite anywhere: no pick.
                        4 => row[b] = f32::NAN,
                        5 => row[a] = f32::INFINITY,
                        6 => row[a] = f32::NEG_INFINITY,
                        _ => {}
                    }
                }
                let want = reference(&row);
                for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                    if isa.is_available() {
                        let got = greedy_with(isa, &row);
                        assert_eq!(
                            got.map(|(i, m)| (i, m.to_bits() & 0x7fff_ffff)),
                            want.map(|(i, m)| (i, m.to_bits() & 0x7fff_ffff)),
                            "{isa:?} len {len} case {case}"
                        );
                    }
                }
            }
        }
    }
}
