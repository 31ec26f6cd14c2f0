//! A token chosen where the logits are, with its raw log-probability: what a runner returns
//! instead of logits when the engine needs only the choice (`ModelRunner::forward_greedy`,
//! `ModelRunner::forward_sample`).
//!
//! The log-probability is the one the sampler and `tandem score` report, bit for bit:
//! `x_t - (max + ln Σ exp(x - max))`, the sum by the kernels' `exp_sum`. A device runner
//! computes it from a few numbers per row ([`TokenPick::from_stats`]) instead of copying
//! the row to the host. The greedy choice is the lowest id holding the largest logit.

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
    let Some(max) = row_max(row) else {
        return Vec::new();
    };
    let lse = log_sum_exp(max, tandem_kernels::exp_sum::exp_sum(row, max));
    top_logprobs_of(row, n, lse, &mut Vec::new())
}

/// [`top_logprobs`] of a finite row whose [`log_sum_exp`] is `lse`; `ids` is scratch.
pub fn top_logprobs_of(row: &[f32], n: usize, lse: f64, ids: &mut Vec<u32>) -> Vec<(TokenId, f32)> {
    let n = n.min(row.len());
    if n == 0 {
        return Vec::new();
    }
    ids.clear();
    ids.extend(0..row.len() as u32);
    let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, by_logit);
    }
    ids.truncate(n);
    ids.sort_unstable_by(by_logit);
    ids.iter()
        .map(|&id| (TokenId(id), log_prob(row[id as usize], lse)))
        .collect()
}

/// The maximum of a row whose values are all finite (see [`tandem_kernels::row_max`]).
fn row_max(row: &[f32]) -> Option<f32> {
    tandem_kernels::row_max::max_finite(row)
}
