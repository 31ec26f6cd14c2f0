//! Top-p: the shortest prefix of the tokens in descending weight order (ties to the lower
//! id) whose mass reaches a threshold, found without sorting the vocabulary.
//!
//! Two passes. A pre-cut keeps the tokens lighter than no token of the nucleus: the
//! weights' mass by binary exponent (bucket `k` holds weights in `[2^-k, 2^(1-k))`), then
//! the heaviest buckets whose mass reaches the threshold (with a margin for rounding) are
//! kept whole. They are a prefix of the descending order, so the nucleus lies within them
//! whatever order the masses were summed in, as long as the sum's rounding stays below the
//! margin (about 1e-12 of the mass; a sum of n weights errs by at most n ulps, typically
//! far fewer, and a different cut only changes the nucleus if its own boundary is within
//! rounding too); the search that follows then
//! works on a few tokens where a peaked distribution over a large vocabulary would have
//! given it all of them. The search is a quickselect guided by mass instead of rank.

use tandem_kernels::sampling_weights;

use super::truncation::by_value_desc;

/// The relative margin for rounding by which a pre-cut's mass must exceed the threshold.
const MARGIN: f64 = 1e-12;
/// The weight (the largest is 1) from which a token is heavy enough for the whole row's
/// first pre-cut: `2^-20`, a logit about `14·T` below the largest.
const HEAVY: f64 = 1.0 / (1u64 << 20) as f64;
/// Below this many candidates the search sorts instead of partitioning further.
const SMALL_RANGE: usize = 32;
/// Exponent buckets of the pre-cut.
const BUCKETS: usize = 64;
/// Independent histograms the pre-cut adds into, so that successive weights of one bucket
/// do not wait for each other's sums.
const WAYS: usize = 4;

/// Truncates `candidates` (ids into `weights`) to the nucleus of `threshold` (> 0); keeps
/// all if rounding never reaches it. The kept tokens end up in no particular order.
pub(super) fn keep_nucleus_of(weights: &[f64], candidates: &mut Vec<u32>, threshold: f64) {
    let mass = bucket_masses(candidates.iter().map(|&id| weights[id as usize]));
    if let Some(last) = last_bucket_kept(&mass, threshold) {
        candidates.retain(|&id| bucket(weights[id as usize]) <= last);
    }
    search(weights, candidates, threshold);
}

/// [`keep_nucleus_of`] every token of `weights` (the whole row, the largest weighing 1),
/// listed into `candidates` only once a pre-cut has dropped the light ones. A token that
/// weighs 0 is never listed: it is never drawn, and no nucleus needs it.
///
/// Most of a row's mass usually lies in its few heavy tokens, so a first pass sums the
/// weights of at least [`HEAVY`] (one vectorized pass, where the exponent buckets of the
/// whole row cost a dependent update per token): if they reach the threshold with the
/// margin, the nucleus is among them (they are a prefix of the descending order; as with
/// the buckets, a sum's rounding beyond the margin could only move a boundary that lies
/// within rounding itself), and only they are listed. Otherwise the buckets of the whole
/// row make the cut.
pub(super) fn keep_nucleus_of_row(weights: &[f64], candidates: &mut Vec<u32>, threshold: f64) {
    candidates.clear();
    if sampling_weights::mass_at_least(weights, HEAVY) >= threshold * (1.0 + MARGIN) {
        let heavy = weights.iter().enumerate().filter(|&(_, &w)| w >= HEAVY);
        candidates.extend(heavy.map(|(id, _)| id as u32));
        keep_nucleus_of(weights, candidates, threshold);
        return;
    }
    let mass = bucket_masses(weights.iter().copied());
    // Bucket `last` or a heavier one: at least `2^-last` (an exact power of two); without
    // a cut, every weight above 0.
    let lightest = last_bucket_kept(&mass, threshold).map_or(f64::from_bits(1), |last| {
        f64::from_bits(((1023 - last) as u64) << 52)
    });
    candidates.extend(
        weights
            .iter()
            .enumerate()
            .filter(|&(_, &w)| w >= lightest)
            .map(|(id, _)| id as u32),
    );
    search(weights, candidates, threshold);
}

/// The mass of `weights` in each exponent bucket.
fn bucket_masses(weights: impl Iterator<Item = f64>) -> [f64; BUCKETS] {
    let mut mass = [[0.0f64; BUCKETS]; WAYS];
    for (i, w) in weights.enumerate() {
        mass[i % WAYS][bucket(w)] += w;
    }
    std::array::from_fn(|b| mass.iter().map(|m| m[b]).sum())
}

/// The last bucket of the heaviest ones whose mass reaches `threshold` with a margin for
/// rounding, if any does before the last bucket (which holds the weights too small to tell
/// apart, zero included).
fn last_bucket_kept(mass: &[f64; BUCKETS], threshold: f64) -> Option<usize> {
    let mut above = 0.0;
    for (b, m) in mass.iter().enumerate().take(BUCKETS - 1) {
        above += m;
        if above >= threshold * (1.0 + MARGIN) {
            return Some(b);
        }
    }
    None
}

/// The bucket of a weight in `[0, 1]`: `k` for `[2^-k, 2^(1-k))` (1 is in bucket 0), and
/// the last bucket for everything below `2^(2 - BUCKETS)`, zero included.
fn bucket(w: f64) -> usize {
    let biased_exponent = (w.to_bits() >> 52) as usize; // weights are not negative
    1023usize.saturating_sub(biased_exponent).min(BUCKETS - 1)
}

/// Truncates `candidates` to the shortest prefix, in descending weight order, whose mass
/// reaches `threshold`: partition `[lo, hi)` around its middle rank, sum the upper part, and
/// continue in the half that holds the boundary. Expected linear time, no sort.
fn search(weights: &[f64], candidates: &mut Vec<u32>, threshold: f64) {
    let cmp = by_value_desc(weights);
    // Invariant: candidates[..lo] rank above candidates[lo..hi], which rank above the rest;
    // `above` is the mass of candidates[..lo] and is < threshold; the answer is in (lo, hi].
    let (mut lo, mut hi, mut above) = (0, candidates.len(), 0.0);
    while hi - lo > SMALL_RANGE {
        let mid = lo + (hi - lo) / 2;
        candidates[lo..hi].select_nth_unstable_by(mid - lo, &cmp);
        let upper: f64 = candidates[lo..=mid]
            .iter()
            .map(|&id| weights[id as usize])
            .sum();
        if above + upper >= threshold {
            hi = mid + 1;
        } else {
            above += upper;
            lo = mid + 1;
        }
    }
    candidates[lo..hi].sort_unstable_by(&cmp);
    for r in lo..hi {
        above += weights[candidates[r] as usize];
        if above >= threshold {
            candidates.truncate(r + 1);
            return;
        }
    }
    candidates.truncate(hi);
}

#[cfg(test)]
mod tests {
    use super::super::truncation::xorshift;
    use super::*;

    #[test]
    fn the_whole_row_and_its_listed_tokens_have_one_nucleus() {
        // Weights over the whole exponent range, zeros (an `-inf` logit, an underflow) and
        // ties included, at thresholds from a few tokens to nearly all: listing the row
        // after its pre-cut must keep what the listed candidates keep.
        let mut next = xorshift(0x853c_49e6_748f_ea9b);
        for case in 0..400 {
            let n = [3, 50, 1000, 30_000][case % 4];
            let spread = [1.0, 10.0, 80.0, 700.0][case / 4 % 4];
            let weights: Vec<f64> = (0..n)
                .map(|i| match next() {
                    x if x < 0.05 => 0.0,
                    _ if i % 17 == 0 => 0.5,
                    x => (-spread * x).exp(),
                })
                .collect();
            let total: f64 = weights.iter().sum();
            // (The last threshold is beyond the pre-cut's margin: every weighed token is kept.)
            let top_p = [0.01, 0.3, 0.9, 0.99, 0.999_999, 1.0 - 1e-15][case % 6];
            let mut listed: Vec<u32> = (0..n as u32)
                .filter(|&i| weights[i as usize] > 0.0)
                .collect();
            keep_nucleus_of(&weights, &mut listed, top_p * total);
            let mut row = Vec::new();
            keep_nucleus_of_row(&weights, &mut row, top_p * total);
            listed.sort_unstable();
            row.sort_unstable();
            assert_eq!(
                row, listed,
                "case {case}: n {n}, spread {spread}, top_p {top_p}"
            );
        }
    }
}
