//! A token chosen where the logits are, with its raw log-probability: what a runner returns
//! instead of logits when the engine needs only the choice (`ModelRunner::forward_greedy`,
//! `ModelRunner::forward_sample`).
//!
//! The log-probability is the one the sampler and `tandem score` report, bit for bit:
//! `x_t - (max + ln Σ exp(x - max))`, the sum by the kernels' `exp_sum`. A device runner
//! computes it from a few numbers per row ([`TokenPick::from_stats`]) instead of copying
//! the row to the host. The greedy choice is the lowest id holding the largest logit.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use tandem_kernels::ops::{log_prob, log_sum_exp};

use crate::batch::TokenId;

/// One output row's chosen token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenPick {
    pub token: TokenId,
    /// `log p(token)` under the raw distribution of the row.
    pub logprob: f32,
    /// The most likely tokens of the raw distribution with their logprobs, most likely
    /// first, ties to the lower id, as many as were asked for ([`top_logprobs`]).
    pub top_logprobs: Vec<(TokenId, f32)>,
}

impl TokenPick {
    /// `token` of a logits row; `None` when the row is empty, holds a NaN or an infinity,
    /// or `token` is outside it.
    pub fn of_row(row: &[f32], token: TokenId) -> Option<TokenPick> {
        let max = row_max(row)?;
        let logit = *row.get(token.0 as usize)?;
        let sum = tandem_kernels::exp_sum::exp_sum(row, max);
        TokenPick::from_stats(token.0 as i64, logit, max, sum)
    }

    /// The greedy pick of a logits row (the lowest id of its maximum); `None` as
    /// [`TokenPick::of_row`].
    pub fn greedy(row: &[f32]) -> Option<TokenPick> {
        let (token, max) = tandem_kernels::row_max::greedy(row)?;
        let sum = tandem_kernels::exp_sum::exp_sum(row, max);
        TokenPick::from_stats(token as i64, max, max, sum)
    }

    /// The pick of `token` from its row's statistics: the token's logit, the row's maximum
    /// and `Σ exp(x - max)` in the host's order; `None` for a row marked non-finite (a
    /// negative token or a zero sum: a finite row sums at least its maximum's term, 1).
    pub fn from_stats(token: i64, logit: f32, max: f32, exp_sum: f64) -> Option<TokenPick> {
        if token < 0 || exp_sum == 0.0 || token > u32::MAX as i64 {
            return None;
        }
        Some(TokenPick {
            token: TokenId(token as u32),
            logprob: log_prob(logit, log_sum_exp(max, exp_sum)),
            top_logprobs: Vec::new(),
        })
    }
}

/// The `n` most likely tokens of the raw logits `row` with their log-probabilities, most
/// likely first, ties to the lower id (values in their total order); empty when the row is
/// not finite.
pub fn top_logprobs(row: &[f32], n: usize) -> Vec<(TokenId, f32)> {
    match tandem_kernels::ops::row_log_sum_exp(row) {
        Some(lse) => top_logprobs_of(row, n, lse),
        None => Vec::new(),
    }
}

/// [`top_logprobs`] of a finite row whose [`log_sum_exp`] is `lse`.
pub fn top_logprobs_of(row: &[f32], n: usize, lse: f64) -> Vec<(TokenId, f32)> {
    top_n(row.iter().copied(), n)
        .into_iter()
        .map(|(id, v)| (TokenId(id), log_prob(v, lse)))
        .collect()
}

/// The `n` largest of `values` (numbered from 0) as `(index, value)`, largest first, ties
/// to the lower index (values in their total order), in one pass: a min-heap of the best `n`
/// so far, which a later value joins only when strictly larger than its worst (a later value
/// has the higher index, so it loses a tie). What sorting every index by (value descending,
/// index ascending) and keeping `n` gives, without an index of the whole row.
pub fn top_n(values: impl Iterator<Item = f32>, n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    // Ordered worst first: the smaller value, then the higher index.
    let mut best: BinaryHeap<(Reverse<TotalF32>, u32)> = BinaryHeap::with_capacity(n + 1);
    for (i, v) in values.enumerate() {
        if best.len() < n {
            best.push((Reverse(TotalF32(v)), i as u32));
        } else if best
            .peek()
            .is_some_and(|(Reverse(worst), _)| v.total_cmp(&worst.0).is_gt())
        {
            best.pop();
            best.push((Reverse(TotalF32(v)), i as u32));
        }
    }
    let mut top: Vec<(u32, f32)> = best.into_iter().map(|(Reverse(v), i)| (i, v.0)).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top
}

/// An `f32` ordered by [`f32::total_cmp`].
#[derive(Debug, Clone, Copy)]
struct TotalF32(f32);

impl PartialEq for TotalF32 {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}

impl Eq for TotalF32 {}

impl PartialOrd for TotalF32 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TotalF32 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The maximum of a row whose values are all finite (see [`tandem_kernels::row_max`]).
fn row_max(row: &[f32]) -> Option<f32> {
    tandem_kernels::row_max::max_finite(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: every index sorted by (value descending in total order, index
    /// ascending), the first `n` kept.
    fn sorted_top(values: &[f32], n: usize) -> Vec<(u32, u32)> {
        let mut order: Vec<u32> = (0..values.len() as u32).collect();
        order.sort_by(|&a, &b| {
            values[b as usize]
                .total_cmp(&values[a as usize])
                .then(a.cmp(&b))
        });
        order
            .into_iter()
            .take(n)
            .map(|i| (i, values[i as usize].to_bits()))
            .collect()
    }

    #[test]
    fn top_n_is_the_sorted_definition_with_ties_signed_zeros_and_infinities() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for case in 0..300 {
            let len = [0, 1, 3, 17, 200, 3000][case % 6];
            let values: Vec<f32> = (0..len)
                .map(|i| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    match (s % 11, i % 5) {
                        (0, _) => 0.0,
                        (1, _) => -0.0,
                        (2, 0) => f32::NEG_INFINITY,
                        (3, _) => 1.5, // many ties
                        _ => (s >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0,
                    }
                })
                .collect();
            let n = [0, 1, 2, 5, 20, len, len + 3][case % 7];
            let got: Vec<(u32, u32)> = top_n(values.iter().copied(), n)
                .into_iter()
                .map(|(i, v)| (i, v.to_bits()))
                .collect();
            assert_eq!(got, sorted_top(&values, n), "case {case}: len {len}, n {n}");
        }
    }
}
